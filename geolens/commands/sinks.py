"""``geolens sinks``: the attention-sink experiments of docs/method.md §4 on a corpus, tables and figures.

One corpus pass computes the sink geometry, the token-type decomposition and the output-norm
curve (:mod:`geolens.sinks`); then the semantic-drift experiment runs one pass per λ over the
first ``--drift-sequences`` windows. Everything is written under ``--out``: CSV tables,
``summary.json`` (headline numbers, settings and the command line) and PNG figures.

``--controls-sequences N`` adds the sink-intervention controls (:mod:`geolens.sinks.controls`)
on the first N windows: ``controls_conditions.csv``, ``controls_pairs.csv``,
``controls_scopes.csv``, ``controls_windows.csv``, ``controls_summary.json`` and
``controls.png``; ``--controls-only`` skips everything else.

``--controls-protocol PATH`` runs instead, and alone, the dose-matched sink controls of a
pre-registered protocol (the ``"sink_controls"`` block of ``docs/faithfulness/protocol.json``,
:func:`geolens.sinks.controls_dose.dose_controls`) on the protocol's own sample: the corpus' documents
cut into the protocol's windows (``--seq-len`` and ``--n-sequences`` belong to the corpus pass).
It writes ``controls_summary.json`` (with ``protocol_sha256``, the SHA-256 of the protocol's
text, and ``label``: ``pre-registered``, or ``exploratory`` with its ``differences`` when anything
differs from the protocol: ``--controls-documents``, ``--n-boot``, ``--corpus``, the model,
``--compat``; an exploratory run gets no verdicts),
``controls_windows.csv`` (every window × scope × edit × seed; the summary recomputes exactly
from it), ``controls_dose_response.csv``, ``controls_verdicts.csv`` and
``controls_sink_heads.csv``. It checkpoints after every window (``controls_checkpoint.json``,
removed when the run completes); ``--resume`` continues an interrupted run in ``--out``.

Example (offline)::

    geolens sinks --model smollm2-135m --corpus lee --n-sequences 200 --seq-len 128 --out docs/sinks --overwrite
    geolens sinks --controls-only --controls-sequences 32 --seq-len 64 --out runs/sinks-controls-exploratory
    geolens sinks --controls-protocol docs/faithfulness/protocol.json --model smollm2-135m --out docs/sinks/controls-smollm2-135m
"""

from __future__ import annotations

import json
import sys
import time

CORPUS_SEQ_LEN = 128  # --seq-len's default: the corpus pass's window length


def _control_layers(text: str, n_layers: int) -> list[int]:
    """``all``, ``none``, ``every:K`` (0, K, 2K, …) or a comma list, checked against the model."""
    from geolens.errors import UsageError

    text = (text or "").strip()
    try:
        if text == "all":
            return list(range(n_layers))
        if text in ("", "none"):
            return []
        if text.startswith("every:"):
            k = int(text.split(":", 1)[1])
            if k < 1:
                raise ValueError("K must be ≥ 1")
            return list(range(0, n_layers, k))
        layers = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as e:
        raise UsageError(f"--controls-layers must be all, none, every:K or comma-separated layers ({e})") from None
    bad = [l for l in layers if not 0 <= l < n_layers]
    if bad:
        raise UsageError(f"--controls-layers {bad} out of range for a model with {n_layers} layers")
    return layers


def run_controls(model, tokens, args, out: Path, t0: float) -> dict:
    """The sink-intervention controls on ``tokens``; writes the controls_* files, returns the summary."""
    from geolens.checkpoint import json_default
    from geolens.sinks.controls import default_conditions, sink_controls
    from geolens.viz.sinks import controls_plot

    layers = _control_layers(args.controls_layers, model.cfg.n_layers)
    specs = default_conditions(lambdas=args.controls_lambdas, seeds=args.controls_seeds)
    res = sink_controls(
        model,
        tokens,
        conditions=specs,
        layers=layers,
        n_boot=args.n_boot,
        seed=args.controls_seed,
        batch_size=args.batch_size,
        progress=True,
    )
    res.conditions.to_csv(out / "controls_conditions.csv", index=False, float_format="%.6g")
    res.pairs.to_csv(out / "controls_pairs.csv", index=False, float_format="%.6g")
    res.scopes.to_csv(out / "controls_scopes.csv", index=False)
    res.windows.to_csv(out / "controls_windows.csv", index=False, float_format="%.6g")
    view = controls_plot(res)
    view.save(out / "controls.png", dpi=args.dpi)
    view.close()
    summary = {
        "command": " ".join(["geolens"] + sys.argv[1:]),
        "model": args.model,
        "corpus": args.corpus,
        "seconds": round(time.time() - t0, 1),
        **res.summary(),
    }
    (out / "controls_summary.json").write_text(json.dumps(summary, indent=1, default=json_default), encoding="utf-8")
    a = res.conditions[res.conditions.scope == "all"]
    print(f"sink controls: {res.n_windows} windows × {res.seq_len} tokens, clean PPL {res.clean_ppl:.3f}")
    if len(a):
        print(
            a[["edit", "delta_ppl", "delta_ppl_lo", "delta_ppl_hi", "out_norm_ratio", "delta_cos"]].to_string(
                index=False, float_format=lambda x: f"{x:.4g}"
            )
        )
    print(res.scopes.to_string(index=False))
    return summary


def _protocol_options(args):
    """(protocol run, registered protocol, provenance, twin) of ``--controls-protocol``, checked before the model loads."""
    from dataclasses import replace

    from geolens.errors import UsageError
    from geolens.preregistration import load_protocol
    from geolens.sinks.controls_protocol import read_protocol

    if args.controls_only or args.controls_sequences:
        raise UsageError(
            "--controls-protocol runs the protocol's own sample; leave out --controls-only and --controls-sequences"
        )
    if args.seq_len != CORPUS_SEQ_LEN:
        raise UsageError("--seq-len sets the corpus pass; --controls-protocol takes the protocol's window length")
    if args.resume and not args.out:
        raise UsageError("--resume needs --out, the folder of the run")
    try:
        twin = load_protocol(args.controls_protocol)
        registered, info = read_protocol(twin)
        protocol = replace(
            registered,
            n_documents=args.controls_documents or registered.n_documents,
            n_boot=args.n_boot,
            corpus=args.corpus,
        )
    except ValueError as err:
        raise UsageError(f"--controls-protocol: {err}") from None
    return protocol, registered, info, twin


def run_dose_protocol(args) -> int:
    """``--controls-protocol``: the dose-matched sink controls of the protocol; writes the controls_* files."""
    import torch

    from geolens.adapter import model_mode
    from geolens.commands._options import check_corpus, check_model_name, out_folder
    from geolens.errors import UsageError
    from geolens.models import load_model
    from geolens.preregistration import preregistration
    from geolens.sinks.controls_dose import controls_sample, dose_controls, write_windows
    from geolens.sinks.controls_protocol import protocol_deviations

    protocol, registered, info, twin = _protocol_options(args)
    model_name = check_model_name(args.model)
    check_corpus(args.corpus)
    out = out_folder(args, "sinks", resumable=True)  # a later usage error removes it again
    torch.set_grad_enabled(False)
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.time()
    model = load_model(model_name, compatibility_mode=args.compat)
    dtype = str(getattr(model.cfg, "dtype", "")).replace("torch.", "")
    registration = preregistration(
        twin, protocol_deviations(protocol, registered, info, model=args.model, mode=model_mode(model), dtype=dtype)
    )
    differences, label = registration["reasons"], registration["status"]
    try:
        tokens, documents = controls_sample(
            model,
            _documents(args.corpus),
            seq_len=protocol.seq_len,
            n_documents=protocol.n_documents,
            per_document=protocol.windows_per_document,
        )
    except ValueError as err:
        raise UsageError(f"--corpus {args.corpus}: {err}") from None
    print(
        f"dose-matched sink controls, protocol v{info['protocol_version']} ({info['protocol_file']}, sha256 {info['protocol_sha256'][:12]}…): "
        f"{tokens.shape[0]} windows of {tokens.shape[1]} tokens from {len(set(documents.tolist()))} documents; {label}; "
        f"torch threads {torch.get_num_threads()}" + "".join(f"\n  differs: {d}" for d in differences),
        flush=True,
    )
    checkpoint = out / "controls_checkpoint.json"
    res = dose_controls(
        model,
        tokens,
        documents,
        protocol,
        checkpoint=checkpoint,
        resume=args.resume,
        rows_per_forward=args.controls_rows,
        verdicts=not differences,
        batch_size=args.batch_size,
        progress=True,
    )
    write_windows(res.windows, out / "controls_windows.csv")
    res.dose_response.to_csv(out / "controls_dose_response.csv", index=False, float_format="%.17g")
    res.pairs.to_csv(out / "controls_verdicts.csv", index=False, float_format="%.17g")
    res.sink_heads.to_csv(out / "controls_sink_heads.csv", index=False, float_format="%.17g")
    summary = {
        "command": " ".join(["geolens"] + sys.argv[1:]),
        "model": args.model,
        "corpus": args.corpus,
        "label": label,
        "differences": differences,
        "protocol_sha256": info["protocol_sha256"],
        "protocol_version": info["protocol_version"],
        "protocol_file": info["protocol_file"],
        "pre_registered_text": info["pre_registered"],
        "preregistration": registration,
        "seconds": round(time.time() - t0, 1),
        **res.summary(),
    }
    (out / "controls_summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    checkpoint.unlink(missing_ok=True)
    table = res.dose_response[
        [
            "scope",
            "edit",
            "lam",
            "degrees",
            "dose",
            "n_seeds",
            "delta_ppl",
            "delta_ppl_low",
            "delta_ppl_high",
            "kl",
            "kl_low",
            "kl_high",
        ]
    ]
    print(table.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    for pair in summary["pairs"] + summary["exploratory_pairs"]:
        ci = (
            ""
            if pair["ci_low"] is None
            else f" [{pair['ci_low']:+.4g}, {pair['ci_high']:+.4g}] at {pair['level']:.4f}, p {pair['p']:.3g}, p_adj {pair['p_adj']:.3g}"
        )
        est = "" if pair["estimate"] is None else f" {pair['estimate']:+.4g}"
        print(
            f"{pair['scope']}: {pair['statistic']}{est}{ci}: {pair['verdict'] or ('exploratory' if pair['outcome'] != 'kl' else label)}"
        )
    return 0


def headline(geometry, decomposition, norm_curve, drift=None) -> dict:
    """The numbers the README quotes, from the result objects."""
    h = geometry.heads
    out = {
        "gu_sink_rate": geometry.gu_sink_rate,
        "mean_sink_rate": float(h.sink_rate.mean()),
        "value_norm_ratio_median": float(h.value_norm_ratio.median()),
        "proj_norm_ratio_median": float(h.proj_norm_ratio.median()),
        "share_heads_value_norm_ratio_below_1": float((h.value_norm_ratio < 1).mean()),
        "share_heads_value_norm_ratio_below_1_3": float((h.value_norm_ratio < 1 / 3).mean()),
        "share_heads_proj_norm_ratio_below_1": float((h.proj_norm_ratio < 1).mean()),
        "value_cos_tail_mean": float(h.value_cos_tail.mean()),
        "proj_cos_tail_mean": float(h.proj_cos_tail.mean()),
        "share_heads_value_cos_tail_negative": float((h.value_cos_tail < 0).mean()),
        "share_heads_proj_cos_tail_negative": float((h.proj_cos_tail < 0).mean()),
        "proj_cos_mean_dir_mean": float(h.proj_cos_mean_dir.mean()),
        "share_heads_proj_cos_mean_dir_negative": float((h.proj_cos_mean_dir < 0).mean()),
        "decomposition_mean_head_shares": {
            r.source: {k: float(v) for k, v in r.items() if k != "source"} for _, r in decomposition.summary.iterrows()
        },
        "norm_curve": norm_curve.summary(),
    }
    # heads that really sink (Gu et al. in most sequences): the claims concern them
    sinks = h[h.gu_sink_share > 0.5]
    out["n_gu_sink_heads"] = int(len(sinks))
    if len(sinks):
        out["sink_heads_proj_norm_ratio_median"] = float(sinks.proj_norm_ratio.median())
        out["sink_heads_value_norm_ratio_median"] = float(sinks.value_norm_ratio.median())
        out["sink_heads_share_proj_cos_tail_negative"] = float((sinks.proj_cos_tail < 0).mean())
    if drift is not None:
        out["drift"] = drift.summary.to_dict(orient="records")
        out["drift_edited"] = drift.edited
        out["drift_n_sequences"] = drift.n_sequences
    return out


def run(args) -> int:
    import torch

    from geolens.adapter import n_kv_heads
    from geolens.checkpoint import json_default
    from geolens.commands._options import check_corpus, check_indices, check_model_name, out_folder
    from geolens.errors import UsageError
    from geolens.models import load_model
    from geolens.pipelines import save_figures, write_tables
    from geolens.pipelines.sinks import SinksParams, run_sinks

    if args.controls_protocol:
        return run_dose_protocol(args)
    given = [
        o
        for o, v in (
            ("--resume", args.resume),
            ("--controls-documents", args.controls_documents),
            ("--controls-rows", args.controls_rows),
        )
        if v
    ]
    if given:
        raise UsageError(f"{', '.join(given)} only apply to --controls-protocol")
    if args.controls_only and args.controls_sequences == 0:
        raise UsageError("--controls-only needs --controls-sequences ≥ 1")
    model_name = check_model_name(args.model)
    out = out_folder(args, "sinks")  # a later usage error removes it again
    check_corpus(args.corpus)
    torch.set_grad_enabled(False)
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.time()
    model = load_model(model_name, compatibility_mode=args.compat)
    if args.controls_only:
        tokens = _windows(model, args.corpus, args.seq_len, args.controls_sequences)
        run_controls(model, tokens, args, out, t0)
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
    tokens = _windows(model, args.corpus, args.seq_len, args.n_sequences)
    result = run_sinks(model, tokens, params)
    g, d, n, drift = result.geometry, result.decomposition, result.norm_curve, result.drift
    write_tables(out, result.tables)
    save_figures(out, result.figures, dpi=args.dpi)
    controls = (
        run_controls(model, tokens[: args.controls_sequences], args, out, t0) if args.controls_sequences > 0 else None
    )
    summary = {
        "command": " ".join(["geolens"] + sys.argv[1:]),
        "settings": {k: v for k, v in vars(args).items() if k != "func"},
        "model_mode": g.model_mode,
        "n_sequences": int(tokens.shape[0]),
        "seq_len": int(tokens.shape[1]),
        "seconds": round(time.time() - t0, 1),
        "decomposition_n_sequences": d.n_sequences,
        **headline(g, d, n, drift),
    }
    if controls is not None:
        summary["controls"] = {k: controls[k] for k in ("n_windows", "seq_len", "claim_by_scope", "all_layers_pairs")}
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=json_default), encoding="utf-8")
    hl = summary
    print(f"wrote {out}/ in {hl['seconds']} s")
    print(f"Gu et al. sink rate (ε={args.eps}): {hl['gu_sink_rate']:.3f}; mean α_i0 {hl['mean_sink_rate']:.3f}")
    print(f"median ‖ṽ_0‖/‖ṽ_j‖ {hl['proj_norm_ratio_median']:.3f}, ‖v_0‖/‖v_j‖ {hl['value_norm_ratio_median']:.3f}")
    print(
        f"mean cos(ṽ_0, ṽ_j) {hl['proj_cos_tail_mean']:+.3f}; heads with negative mean: {hl['share_heads_proj_cos_tail_negative']:.0%}"
    )
    nc = hl["norm_curve"]
    print(
        f"norm curve: convex with argmin in (0,1) for {nc['head_share_convex_argmin_inside']:.0%} of {nc['head_n_fitted']} heads"
    )
    if drift is not None:
        print(drift.summary.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    return 0


def _documents(corpus):
    """The corpus' documents (looked up at call time, so tests can replace ``geolens.data.load_corpus``)."""
    from geolens import data

    return data.load_corpus(corpus)


def _windows(model, corpus, seq_len, n_sequences):
    """Corpus windows (looked up at call time, so tests can replace ``geolens.data.corpus_windows``)."""
    from geolens.commands._options import corpus_windows

    return corpus_windows(model, corpus, seq_len, n_sequences)


def _all_or_ints(text: str):
    """argparse type of --drift-layers / --drift-kv-heads: 'all' (None) or comma-separated integers."""
    from geolens.commands._options import int_list

    return None if text in ("", "all") else int_list()(text)


def register(subparsers) -> None:
    from geolens.commands._names import DEFAULT_LAMBDAS
    from geolens.commands._options import (
        add_out,
        add_run_options,
        float_in,
        float_list,
        int_list,
        non_negative_int,
        positive_int,
    )

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
    p.add_argument("--eps", type=float_in(0, 1), default=0.3, help="Gu et al. threshold on mean first-token attention")
    p.add_argument("--n-bins", type=positive_int, default=20, help="sink-rate bins on [0, 1]")
    p.add_argument("--min-count", type=positive_int, default=20, help="queries a bin needs to enter the quadratic fit")
    p.add_argument(
        "--decomposition-sequences",
        type=non_negative_int,
        default=0,
        help="use only the first N windows for the decomposition (0: all)",
    )
    p.add_argument(
        "--lambdas",
        type=float_list(0),
        default=list(DEFAULT_LAMBDAS),
        help=f"λ grid for the drift experiment (default {','.join(f'{x:g}' for x in DEFAULT_LAMBDAS)})",
    )
    p.add_argument(
        "--drift-sequences",
        type=non_negative_int,
        default=48,
        help="first N windows used by the drift experiment (0: skip it)",
    )
    p.add_argument(
        "--drift-layers",
        type=_all_or_ints,
        default=None,
        help="comma-separated layers whose v_0 is scaled (default all, at once)",
    )
    p.add_argument(
        "--drift-kv-heads",
        type=_all_or_ints,
        default=None,
        help="comma-separated kv heads whose v_0 is scaled (default all)",
    )
    p.add_argument(
        "--low-norm-quantile",
        type=float_in(0, 1),
        default=0.25,
        help="low-norm heads: relative output norm at or below this quantile",
    )
    p.add_argument(
        "--controls-sequences",
        type=non_negative_int,
        default=0,
        help="first N windows for the sink-intervention controls (0: skip them)",
    )
    p.add_argument(
        "--controls-only", action="store_true", help="run only the controls (skip the corpus pass and the drift)"
    )
    p.add_argument(
        "--controls-layers",
        default="every:3",
        help="layers edited one at a time: all, none, every:K (default every:3) or a comma list",
    )
    p.add_argument(
        "--controls-lambdas",
        type=float_list(0),
        default=[0.0, 2.0],
        help="λ of the scale and random-token edits (default 0,2)",
    )
    p.add_argument(
        "--controls-seeds", type=int_list(0), default=[0, 1, 2], help="seeds of the rotation control (default 0,1,2)"
    )
    p.add_argument(
        "--controls-seed",
        type=non_negative_int,
        default=0,
        help="seed of the random non-sink positions and the bootstrap",
    )
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
        help="--controls-protocol: documents of the sample (default: the protocol's; another number makes the run exploratory)",
    )
    p.add_argument(
        "--controls-rows",
        type=positive_int,
        default=None,
        help="--controls-protocol: edited rows per batched forward (default: from the vocabulary size)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="--controls-protocol: continue the interrupted run in --out from its checkpoint",
    )
    p.add_argument(
        "--n-boot",
        type=positive_int,
        default=2000,
        help="bootstrap resamples over windows (default 2000; --controls-protocol: another number makes the run exploratory)",
    )
    p.add_argument("--dpi", type=positive_int, default=90)
    p.add_argument(
        "--compat",
        action="store_true",
        help="TransformerLens compatibility mode: HookedTransformer numerics (folded norms, centred W_O, b_V folded into b_O); off by default",
    )
    add_out(p, resumable=True)
    p.set_defaults(func=run)
