"""``geolens report``: the one-command report (HTML + JSON), offline on SmolLM2 by default.

Runs every report section whose geolens modules are installed (see
:mod:`geolens.report.build`) on ``--n-sequences`` windows of ``--corpus`` and writes
``report.html`` (self-contained) and ``report.json`` into ``--out``; ``--n-heldout`` further windows
are kept out of the corpus pass for faithfulness and pruning. ``--quick`` shrinks every section
(8 + 1 windows of 64 tokens unless given, smaller grids) to finish in under two minutes.
"""

from __future__ import annotations

import time


def run(args) -> int:
    from geolens.data import corpus_windows
    from geolens.models import load_model
    from geolens.report import ReportConfig, available_sections, build_report, write_report

    if args.list_sections:
        print("\n".join(available_sections()))
        return 0
    sections = [s.strip() for s in args.sections.split(",") if s.strip()] if args.sections else None
    options = dict(
        model=args.model, corpus=args.corpus, n_sequences=args.n_sequences, n_heldout=args.n_heldout, seq_len=args.seq_len,
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
    model = load_model(config.model, compatibility_mode=args.compat)
    tokens = corpus_windows(model, config.corpus, config.seq_len, config.n_sequences + config.n_heldout)
    report = build_report(model, tokens, config, progress=not args.no_progress)
    paths = write_report(report, args.out)
    for s in report.sections:
        print(f"{s.title:<40} {s.seconds:7.1f} s")
    print("\npaper claim → measured")
    for c in report.claims:
        print(f"  [{c.verdict}] {c.claim} ({c.source}): {c.measured}")
    print(f"\nwrote {paths['html']} and {paths['json']} in {time.perf_counter() - start:.0f} s")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("report", help="the full HTML + JSON report (offline, SmolLM2 by default)")
    p.add_argument("--model", default="smollm2-135m", help="smollm2-135m (default), gemma3-270m, a folder or HF name")
    p.add_argument("--corpus", default="lee", help="lee (default), enwiki, a .txt/.jsonl file or hf:<name>")
    p.add_argument("--n-sequences", type=int, default=None, help="corpus windows (default 64; 8 with --quick)")
    p.add_argument("--n-heldout", type=int, default=None, help="extra windows for faithfulness and pruning (default 8; 1 with --quick)")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per window incl. BOS (default 128; 64 with --quick)")
    p.add_argument("--batch-size", type=int, default=None, help="sequences per forward pass (default 8; 2 with --quick)")
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
