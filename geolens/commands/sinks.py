"""``geolens sinks``: the attention-sink experiments of docs/method.md §4 on a corpus, tables and figures.

One corpus pass (sink geometry, token-type decomposition, output-norm curve), then the semantic
drift on the first ``--drift-sequences`` windows; ``--controls-sequences N`` adds the
sink-intervention controls on the first N windows (``--controls-only``: nothing else);
``--controls-protocol PATH`` runs instead, and alone, the dose-matched sink controls of a
pre-registered protocol on its own sample. The runs and their files are
:mod:`geolens.pipelines.sinks`'s, the printed text :mod:`geolens.pipelines.sinks_text`'s.

Example (offline)::

    geolens sinks --model smollm2-135m --corpus lee --n-sequences 200 --seq-len 128 --out docs/sinks --overwrite
    geolens sinks --controls-only --controls-sequences 32 --seq-len 64 --out runs/sinks-controls-exploratory
    geolens sinks --controls-protocol docs/faithfulness/protocol.json --model smollm2-135m --out docs/sinks/controls-smollm2-135m
"""

from __future__ import annotations

import sys
import time

from geolens.commands._sinks_protocol import CORPUS_SEQ_LEN, run_dose_protocol


def _controls(args, model, n_windows: int | None = None):
    """The controls' parameters, ``--controls-layers`` checked against the model."""
    from geolens.commands._options import layer_selection
    from geolens.pipelines.sinks import ControlsParams

    layers = layer_selection(args.controls_layers, model.cfg.n_layers, "--controls-layers")
    seeds, seed = args.controls_seeds, args.controls_seed
    return ControlsParams(layers, args.controls_lambdas, seeds, args.n_boot, seed, args.batch_size, n_windows)


def run(args) -> int:
    from geolens.adapter import n_kv_heads
    from geolens.commands._options import (
        check_corpus,
        check_indices,
        check_model_name,
        corpus_windows,
        load_run_model,
        out_folder,
    )
    from geolens.errors import UsageError
    from geolens.pipelines.sinks import SinksParams, save_controls, save_sinks
    from geolens.pipelines.sinks_text import controls_text, sinks_text

    if args.controls_protocol:
        return run_dose_protocol(args)
    protocol_only = {
        "--resume": args.resume,
        "--controls-documents": args.controls_documents,
        "--controls-rows": args.controls_rows,
    }
    given = [option for option, value in protocol_only.items() if value]
    if given:
        raise UsageError(f"{', '.join(given)} only apply to --controls-protocol")
    if args.controls_only and args.controls_sequences == 0:
        raise UsageError("--controls-only needs --controls-sequences ≥ 1")
    model_name = check_model_name(args.model)
    out = out_folder(args, "sinks")  # a later usage error removes it again
    check_corpus(args.corpus)
    t0 = time.time()
    model = load_run_model(args, model_name)
    command = " ".join(["geolens"] + sys.argv[1:])
    controls_meta = {"command": command, "model": args.model, "corpus": args.corpus}
    if args.controls_only:
        tokens = corpus_windows(model, args.corpus, args.seq_len, args.controls_sequences)
        res, _ = save_controls(model, tokens, _controls(args, model), out, dpi=args.dpi, meta=controls_meta, t0=t0)
        print(controls_text(res))
        return 0
    params = SinksParams(
        eps=args.eps,
        n_bins=args.n_bins,
        min_count=args.min_count,
        decomposition_sequences=args.decomposition_sequences or None,
        drift_sequences=args.drift_sequences,
        lambdas=args.lambdas,
        drift_layers=check_indices(args.drift_layers, model.cfg.n_layers, "layers", "--drift-layers"),
        drift_kv_heads=check_indices(args.drift_kv_heads, n_kv_heads(model), "kv heads", "--drift-kv-heads"),
        low_norm_quantile=args.low_norm_quantile,
        batch_size=args.batch_size,
    )
    controls = _controls(args, model, args.controls_sequences) if args.controls_sequences > 0 else None
    tokens = corpus_windows(model, args.corpus, args.seq_len, args.n_sequences)
    meta = {"command": command, "settings": {k: v for k, v in vars(args).items() if k != "func"}}
    result, summary, res = save_sinks(
        model, tokens, params, out, dpi=args.dpi, meta=meta, t0=t0, controls=controls, controls_meta=controls_meta
    )
    if res is not None:
        print(controls_text(res))
    print(sinks_text(summary, out, eps=args.eps, drift=result.drift))
    return 0


def _all_or_ints(text: str):
    """argparse type of --drift-layers / --drift-kv-heads: 'all' (None) or comma-separated integers."""
    from geolens.commands._options import int_list

    return None if text in ("", "all") else int_list()(text)


def register(subparsers) -> None:
    from geolens.commands._names import DEFAULT_LAMBDAS
    from geolens.commands._options import (
        add_compat,
        add_out,
        add_run_options,
        float_in,
        float_list,
        int_list,
        positive_int,
    )
    from geolens.commands._options import non_negative_int as count

    p = subparsers.add_parser(
        "sinks", help="attention sinks: geometry, decomposition, norm curve, semantic drift (docs/method.md §4)"
    )
    add_run_options(
        p,
        model="smollm2-135m",
        corpus="lee",
        n_sequences=200,
        seq_len=CORPUS_SEQ_LEN,
        batch_size=8,
        threads=0,
        own={"n_sequences": {"help": "windows for the corpus pass (default 200)"}},
    )
    lambdas = ",".join(f"{x:g}" for x in DEFAULT_LAMBDAS)
    protocol = "--controls-protocol: "
    exploratory = "another number makes the run exploratory"
    for flag, kind, default, text in (  # (option, type, default, help)
        ("--eps", float_in(0, 1), 0.3, "Gu et al. threshold on mean first-token attention"),
        ("--n-bins", positive_int, 20, "sink-rate bins on [0, 1]"),
        ("--min-count", positive_int, 20, "queries a bin needs to enter the quadratic fit"),
        ("--decomposition-sequences", count, 0, "use only the first N windows for the decomposition (0: all)"),
        ("--lambdas", float_list(0), list(DEFAULT_LAMBDAS), f"λ grid for the drift experiment (default {lambdas})"),
        ("--drift-sequences", count, 48, "first N windows used by the drift experiment (0: skip it)"),
        ("--drift-layers", _all_or_ints, None, "comma-separated layers whose v_0 is scaled (default all, at once)"),
        ("--drift-kv-heads", _all_or_ints, None, "comma-separated kv heads whose v_0 is scaled (default all)"),
        ("--low-norm-quantile", float_in(0, 1), 0.25, "low-norm heads: relative output norm at or below this quantile"),
        ("--controls-sequences", count, 0, "first N windows for the sink-intervention controls (0: skip them)"),
    ):
        p.add_argument(flag, type=kind, default=default, help=text)
    p.add_argument(
        "--controls-only", action="store_true", help="run only the controls (skip the corpus pass and the drift)"
    )
    for flag, kind, default, text in (
        (
            "--controls-layers",
            None,
            "every:3",
            "layers edited one at a time: all, none, every:K (default every:3) or a comma list",
        ),
        ("--controls-lambdas", float_list(0), [0.0, 2.0], "λ of the scale and random-token edits (default 0,2)"),
        ("--controls-seeds", int_list(0), [0, 1, 2], "seeds of the rotation control (default 0,1,2)"),
        ("--controls-seed", count, 0, "seed of the random non-sink positions and the bootstrap"),
    ):
        p.add_argument(flag, type=kind, default=default, help=text)
    p.add_argument(
        "--controls-protocol",
        default=None,
        metavar="PATH",
        help="run only the dose-matched sink controls of a pre-registered protocol (docs/faithfulness/protocol.json), on its own sample",
    )
    p.add_argument(
        "--controls-documents",
        type=positive_int,
        default=None,
        help=f"{protocol}documents of the sample (default: the protocol's; {exploratory})",
    )
    p.add_argument(
        "--controls-rows",
        type=positive_int,
        default=None,
        help=f"{protocol}edited rows per batched forward (default: from the vocabulary size)",
    )
    p.add_argument(
        "--resume", action="store_true", help=f"{protocol}continue the interrupted run in --out from its checkpoint"
    )
    p.add_argument(
        "--n-boot",
        type=positive_int,
        default=2000,
        help=f"bootstrap resamples over windows (default 2000; {protocol}{exploratory})",
    )
    p.add_argument("--dpi", type=positive_int, default=90)
    add_compat(p)
    add_out(p, resumable=True)
    p.set_defaults(func=run)
