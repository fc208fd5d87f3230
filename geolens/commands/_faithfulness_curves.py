"""``geolens faithfulness`` without ``--protocol`` (protocol 1): the comprehensiveness / sufficiency
curves and ``--replot`` (:mod:`geolens.commands.faithfulness` has the options; the text and files
are :mod:`geolens.pipelines.faithfulness_text`'s). Multiple choice runs with ``geolens mc``;
``--replot`` still rewrites the tables of a folder of protocol 1's masked multiple choice."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def parse_layers(text: str, n_layers: int) -> tuple[int, ...] | None:
    """``"all"``, ``"early"``/``"middle"``/``"late"`` (thirds), ``"28,29"``, ``"20-29"`` or negative
    indices (``"-2,-1"``), checked, never wrapped (a layer outside [−n, n) is a UsageError)."""
    from geolens.commands._options import resolve_layers
    from geolens.faithfulness import LAYER_GROUPS, layer_group

    text = text.strip()
    if text != "all" and text in LAYER_GROUPS:
        return layer_group(text, n_layers)
    return resolve_layers(text, n_layers, "--layers")


def parse_fractions(text: str, option: str = "--fractions") -> tuple[float, ...]:
    """Comma-separated fractions, each in the open interval (0, 1), sorted; else UsageError."""
    from geolens.errors import UsageError

    try:
        fr = tuple(float(k) for k in text.split(","))
    except ValueError:
        raise UsageError(f"{option} must be comma-separated numbers, got {text!r}") from None
    bad = [k for k in fr if not 0.0 < k < 1.0]
    if bad:
        raise UsageError(f"{option} must lie in (0, 1), got {bad}")
    return tuple(sorted(set(fr)))


def _language_modelling(model, args, protocol, metrics, out: Path):
    from geolens.commands._options import corpus_windows
    from geolens.errors import UsageError
    from geolens.faithfulness.result import FaithfulnessResult, ResumeError, resume_state
    from geolens.pipelines.faithfulness import FaithfulnessParams, run_faithfulness
    from geolens.pipelines.faithfulness_text import range_text, save_protocol1

    tokens = corpus_windows(model, args.corpus, args.seq_len, args.n_sequences)  # UsageError if too few
    t0 = time.time()
    done, spent = None, 0.0
    if args.resume:
        try:
            per, clean = resume_state(out, protocol.to_dict(model))
        except ResumeError as err:
            raise UsageError(str(err)) from None
        if per is not None:
            done = (per, clean)
            spent = float(json.loads((out / "summary.json").read_text()).get("meta", {}).get("seconds", 0.0))
            print(f"resuming after {len(clean)} documents already in {out}", flush=True)
    checks = None

    def meta(n_done: int) -> dict:
        return dict(
            n_sequences=n_done,
            n_sequences_requested=int(tokens.shape[0]),
            seq_len=int(tokens.shape[1]),
            metrics=list(metrics),
            seed=args.seed,
            model=args.model,
            corpus=args.corpus,
            seconds=round(spent + time.time() - t0, 1),
            complete=n_done == tokens.shape[0],
            command="geolens faithfulness " + " ".join(sys.argv[2:]) if len(sys.argv) > 1 else "geolens faithfulness",
        )

    def save(result) -> None:  # every block: an interrupted run keeps a consistent set
        nonlocal checks
        checks = save_protocol1(result, out)
        print(f"  {len(result.clean)} / {tokens.shape[0]} documents, {time.time() - t0:.0f} s (saved)", flush=True)

    params = FaithfulnessParams(
        protocol=protocol,
        metrics=metrics,
        chunk_size=args.chunk_size,
        seed=args.seed,
        n_boot=args.n_boot,
        block=args.block,
    )
    run = run_faithfulness(model, tokens, params, done=done, meta=meta, on_block=save)
    if run is None:  # everything was already done: rewrite the tables from the saved results
        result = FaithfulnessResult.load(out, n_boot=args.n_boot)
        checks = save_protocol1(result, out)
    else:
        result = run.result
    print(result)
    print(range_text(result.range_check()))
    for c in checks:
        print(
            f"order of Cunningham & Muça Cirone 2026, raw < value-weighted < output-normalised < contribution, {c['direction']} {c['quantity']}: "
            f"{'holds' if c['holds'] else 'does NOT hold'} {c['pairs']}"
        )
    return result


def run_curves(args) -> int:
    """Protocol 1 (no ``--protocol``): the masking curves and ``--replot``."""
    from geolens.commands._options import check_corpus, check_model_name, out_folder
    from geolens.errors import UsageError
    from geolens.faithfulness import MaskingConfig
    from geolens.metrics import metric_names
    from geolens.pipelines.faithfulness_text import mc_outputs, save_protocol1

    if args.stage != "all" or args.max_documents is not None:
        raise UsageError(f"{'--stage' if args.stage != 'all' else '--max-documents'} needs --protocol")

    fractions = parse_fractions(args.fractions)
    metrics = (
        tuple(m.strip() for m in args.metrics.split(",") if m.strip())
        if args.metrics
        else metric_names(default_only=True)
    )
    unknown = [m for m in metrics if m not in metric_names()]
    if unknown:
        raise UsageError(f"--metrics: unknown metric {unknown[0]!r} (choose from {', '.join(metric_names())})")
    if args.skip_prefix >= args.seq_len - 1:
        raise UsageError(f"--skip-prefix {args.skip_prefix} leaves no prediction in {args.seq_len} tokens")
    if (args.replot or args.resume) and not args.out:
        raise UsageError(f"{'--replot' if args.replot else '--resume'} needs --out, the folder of the run")
    out = Path(args.out) if args.out else None
    if args.replot:  # tables and figures again from the saved per-document results, no model
        from geolens.faithfulness import FaithfulnessResult, per_sequence_path

        missing = [n for n in ("summary.json", "per_sequence.csv.gz", "clean.csv") if not (out / n).is_file()]
        if "per_sequence.csv.gz" in missing and per_sequence_path(out).is_file():
            missing.remove("per_sequence.csv.gz")
        has_mc = (out / "mc_questions.csv").is_file() and (out / "mc_progress.json").is_file()
        if missing and not has_mc:
            raise UsageError(f"--replot: {out} holds no saved results (missing {', '.join(missing)})")
        out = out_folder(args, "faithfulness", resumable=True)
        if not missing:
            result = FaithfulnessResult.load(out, n_boot=args.n_boot)
            for c in save_protocol1(result, out):
                print(c)
            print(result)
        if has_mc:  # multiple choice, also from a run still under way (the questions answered so far)
            import pandas as pd

            mc_outputs(pd.read_csv(out / "mc_questions.csv"), out, n_boot=args.n_boot, seed=args.seed)
        return 0
    model_name = check_model_name(args.model)
    out = out_folder(args, "faithfulness", resumable=True)  # a later usage error removes it again
    if args.n_sequences > 0:
        check_corpus(args.corpus)
    import torch

    from geolens.models import load_model

    torch.set_grad_enabled(False)
    from geolens.threads import apply

    apply(args.threads or None)  # --threads, else GEOLENS_THREADS, else the free cores
    model = load_model(model_name)
    protocol = MaskingConfig(
        layers=parse_layers(args.layers, model.cfg.n_layers),
        ranking=args.ranking,
        allow_sink=not args.protect_sink,
        allow_current=not args.protect_current,
        mode=args.mode,
        fractions=fractions,
        skip_prefix=args.skip_prefix,
    )
    print(protocol.describe(model))
    print(
        f"model {args.model}, corpus {args.corpus}: {args.n_sequences} documents × {args.seq_len} tokens; metrics {list(metrics)}; "
        f"{args.chunk_size} masks per forward; torch threads {torch.get_num_threads()}",
        flush=True,
    )
    if args.n_sequences > 0:
        _language_modelling(model, args, protocol, metrics, out)
    print(f"results in {out}/")
    return 0
