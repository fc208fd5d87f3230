"""``geolens pruning``: head-pruning curves by order and the single-head sensitivity scan (docs/method.md §6).

Example (the README run)::

    geolens pruning --out docs/pruning --overwrite

Computes the head taxonomy, attention entropy and mean-ablation references on ``--ref-sequences``
windows, then ΔPPL at retention 90 % … 10 % for the orders regime / weight / entropy / random
(``--seeds``) on ``--n-sequences`` other windows, and the single-head scan on
``--scan-sequences`` windows. Writes ``orders.json``, ``taxonomy.csv``, ``pruning.csv``,
``pruning.png``, ``sensitivity.csv``, ``critical_heads.csv``, ``sensitivity.png`` and
``run.json`` under ``--out``.
"""

from __future__ import annotations

import json
import time


def run(args) -> int:
    import torch

    from geolens.commands._options import check_corpus, check_model_name, corpus_windows, out_folder
    from geolens.models import load_model
    from geolens.pipelines import save_figures, write_tables
    from geolens.pipelines.pruning import PruningParams, run_pruning
    from geolens.pruning import RETENTION

    model_name = check_model_name(args.model)
    out = out_folder(args, "pruning")  # a later usage error removes it again
    check_corpus(args.corpus)
    retention = tuple(args.retention) if args.retention else RETENTION
    seeds = tuple(args.seeds)
    torch.set_grad_enabled(False)
    from geolens.threads import apply

    apply(args.threads or None)  # --threads, else GEOLENS_THREADS, else the free cores
    model = load_model(model_name)
    cfg = model.cfg
    n_eval, n_ref = args.n_sequences, args.ref_sequences
    tokens = corpus_windows(model, args.corpus, args.seq_len, n_eval + n_ref)
    desc = (
        f"{args.model}; {args.mode}-ablation of hook_z; references (taxonomy, entropy, means) on {n_ref} windows, "
        f"ΔPPL on {n_eval} other windows × {args.seq_len} tokens of {args.corpus}"
        + (f", last {args.n_scored} predictions scored" if args.n_scored else "")
    )
    print(desc)
    t0 = time.time()
    params = PruningParams(
        retention=retention,
        seeds=seeds,
        mode=args.mode,
        n_scored=args.n_scored,
        scan_sequences=args.scan_sequences,
        batch_size=args.batch_size,
        description=desc,
    )
    result = run_pruning(model, tokens[n_eval:], tokens[:n_eval], params)
    tax, sens = result.taxonomy, result.sensitivity
    write_tables(out, result.tables, ("taxonomy",), float_format=None)
    print("regimes:", {k: round(v, 3) for k, v in tax.distribution.items()})
    (out / "orders.json").write_text(json.dumps({k: [list(h) for h in v] for k, v in result.orders.items()}))
    write_tables(out, result.tables, ("pruning", "sensitivity", "critical_heads"), float_format=None)
    print(result.tables["pruning_wide"].to_string(float_format=lambda v: f"{v:.2f}"))
    save_figures(out, result.figures, dpi=80)
    if sens is not None:
        print(
            f"single-head scan on {result.scan_windows} windows (clean PPL {sens.clean_ppl:.2f}); critical heads (|robust z| > {sens.threshold}):"
        )
        print(result.tables["critical_heads"].head(20).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    run_info = dict(
        description=desc,
        model=args.model,
        corpus=args.corpus,
        n_sequences=n_eval,
        ref_sequences=n_ref,
        scan_sequences=args.scan_sequences,
        seq_len=args.seq_len,
        mode=args.mode,
        retention=list(retention),
        seeds=list(seeds),
        n_scored=args.n_scored,
        n_heads_total=cfg.n_layers * cfg.n_heads,
        regime_order="Reset first, then Mixer, Retrievers last; ties by ascending share_current, then (layer, head)",
        seconds=round(time.time() - t0, 1),
    )
    (out / "run.json").write_text(json.dumps(run_info, indent=2))
    print(f"results in {out}/ ({run_info['seconds']} s)")
    return 0


def _retention(text: str):
    from geolens.commands._options import float_list

    return [] if text == "" else float_list(0, 1, low_open=True)(text)


def register(subparsers) -> None:
    from geolens.commands._options import add_out, add_run_options, int_list, non_negative_int, positive_int

    p = subparsers.add_parser(
        "pruning", help="head pruning by regime vs baselines, and the single-head sensitivity scan (docs/method.md §6)"
    )
    add_run_options(
        p,
        model="smollm2-135m",
        corpus="lee",
        n_sequences=4,
        seq_len=64,
        batch_size=8,
        threads=0,
        own={
            "n_sequences": {"help": "evaluation windows for ΔPPL"},
            "seq_len": {"help": None},
            "batch_size": {"help": None},
        },
    )
    p.add_argument(
        "--ref-sequences",
        type=positive_int,
        default=8,
        help="windows for the taxonomy, entropy and mean-ablation references",
    )
    p.add_argument(
        "--scan-sequences", type=non_negative_int, default=1, help="windows for the single-head scan (0: skip)"
    )
    p.add_argument("--mode", default="mean", choices=["mean", "zero"])
    p.add_argument(
        "--retention",
        type=_retention,
        default=[],
        help="comma-separated retention levels in (0, 1] (default 0.9 … 0.1)",
    )
    p.add_argument("--seeds", type=int_list(), default=[0, 1, 2], help="seeds of the random orders (default 0,1,2)")
    p.add_argument(
        "--n-scored", type=positive_int, default=None, help="score only the last N predictions of each window"
    )
    add_out(p)
    p.set_defaults(func=run)
