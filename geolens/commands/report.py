"""``geolens report``: the one-command report (HTML + JSON), offline on SmolLM2 by default.

Runs every report section whose geolens modules are installed (see
:mod:`geolens.report.build`) on ``--n-sequences`` windows of ``--corpus`` and writes
``report.html`` (self-contained) and ``report.json`` into ``--out``; ``--n-heldout`` further windows
are kept out of the corpus pass for faithfulness and pruning. ``--quick`` shrinks every section
(8 + 1 windows of 64 tokens unless given, smaller grids) to finish in under two minutes.

Cross-model report (:mod:`geolens.report.compare`): ``--model A --model B`` writes each model's
report under ``--out/<model>/`` and then ``compare.html`` / ``compare.json`` in ``--out``: one
claim table with a column per model and figures on shared axes. ``--compare runA/report.json
runB/report.json`` builds the same page from saved runs without loading any model.
"""

from __future__ import annotations

import json
import time
from pathlib import Path


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name.strip("/")) or "model"


def _compare(paths, out) -> int:
    from geolens.report.compare import load_report, write_comparison

    reports = [load_report(p) for p in paths]
    written = write_comparison(reports, out)
    data = json.loads(written["json"].read_text(encoding="utf-8"))
    print("paper claim → measured, per model (" + " | ".join(data["models"]) + ")")
    for row in data["claims"]:
        cells = [(m["verdict"] + (" (low power)" if (m.get("sample") or {}).get("low_power") else "")) if m else "not run" for m in row["models"].values()]
        print(f"  {row['claim'][:70]:<70} " + " | ".join(cells))
    print(f"\nwrote {written['html']} and {written['json']}")
    return 0


def run(args) -> int:
    from geolens.report import available_sections

    if args.list_sections:
        print("\n".join(available_sections()))
        return 0
    if args.compare:
        if args.model:
            raise SystemExit("geolens report: give either --compare (saved runs) or --model (new runs), not both")
        if len(args.compare) < 2:
            raise SystemExit("geolens report: --compare needs at least two report.json files (or run folders)")
        return _compare(args.compare, args.out)
    models = args.model or ["smollm2-135m"]
    if len(set(models)) != len(models):
        raise SystemExit(f"geolens report: --model given twice with the same name: {models}")
    if len(models) == 1:
        return _run_one(args, models[0], args.out)
    out = Path(args.out)
    paths = []
    for name in models:
        _run_one(args, name, out / _safe(name))
        paths.append(out / _safe(name) / "report.json")
    return _compare(paths, out)


def _run_one(args, model_name: str, out) -> int:
    from geolens.data import corpus_windows
    from geolens.models import load_model
    from geolens.report import ReportConfig, build_report, write_report

    sections = [s.strip() for s in args.sections.split(",") if s.strip()] if args.sections else None
    options = dict(
        model=model_name, corpus=args.corpus, n_sequences=args.n_sequences, n_heldout=args.n_heldout, seq_len=args.seq_len,
        batch_size=args.batch_size, example_layer=args.example_layer, sections=sections, seed=args.seed,
    )  # fmt: skip
    if args.prompt:
        options["prompt"] = args.prompt
    if args.quick:
        config = ReportConfig.quick_defaults(**options)
    else:
        config = ReportConfig(**{k: v for k, v in options.items() if v is not None})
    if config.n_sequences < 1 or config.n_heldout < 1:
        raise SystemExit("geolens report: --n-sequences and --n-heldout must be at least 1")
    start = time.perf_counter()
    if config.model.startswith("tiny-"):  # tiny random models (tests, demos)
        from geolens.distributed import load_any_model

        model = load_any_model(config.model, "cpu")
    else:
        model = load_model(config.model, compatibility_mode=args.compat)
    tokens = corpus_windows(model, config.corpus, config.seq_len, config.n_sequences + config.n_heldout)
    report = build_report(model, tokens, config, progress=not args.no_progress)
    paths = write_report(report, out)
    for s in report.sections:
        print(f"{s.title:<40} {s.seconds:7.1f} s")
    print("\npaper claim → measured")
    for c in report.claims:
        print(f"  [{c.verdict}] {c.claim} ({c.source}): {c.measured}")
    print(f"\nwrote {paths['html']} and {paths['json']} in {time.perf_counter() - start:.0f} s")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("report", help="the full HTML + JSON report (offline, SmolLM2 by default)")
    p.add_argument("--model", action="append", default=None,
                   help="smollm2-135m (default), gemma3-270m, a folder or HF name; repeat for a cross-model report")
    p.add_argument("--compare", nargs="+", default=None, metavar="REPORT_JSON",
                   help="build the cross-model page from saved report.json files (or run folders) instead of running")
    p.add_argument("--corpus", default="lee", help="lee (default), enwiki, a .txt/.jsonl file or hf:<name>")
    p.add_argument("--n-sequences", type=int, default=None, help="corpus windows (default 64; 8 with --quick)")
    p.add_argument("--n-heldout", type=int, default=None, help="extra windows for faithfulness and pruning (default 8; 1 with --quick)")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per window incl. BOS (default 128; 64 with --quick)")
    p.add_argument("--batch-size", type=int, default=None, help="sequences per forward pass (default 8)")
    p.add_argument("--out", default="report", help="output folder (default: report/)")
    p.add_argument("--quick", action="store_true", help="small workload, under two minutes on a CPU")
    p.add_argument("--prompt", default=None, help="prompt of the example heatmaps")
    p.add_argument("--example-layer", type=int, default=None, help="layer of the example heatmaps (default: most disagreement)")
    p.add_argument("--sections", default=None, help="comma-separated subset of sections (see --list-sections)")
    p.add_argument("--list-sections", action="store_true", help="print the sections available in this install")
    p.add_argument("--seed", type=int, default=0, help="seed of the random baselines")
    p.add_argument("--compat", action="store_true", help="enable TransformerLens compatibility mode")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run)
