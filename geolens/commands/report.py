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
    from geolens.commands._options import (
        UsageError, check_corpus, check_index, check_model_name, check_out_dir, corpus_windows,
    )  # fmt: skip
    from geolens.models import load_model
    from geolens.report import SECTIONS, ReportConfig, available_sections, build_report, write_report

    if args.list_sections:
        print("\n".join(available_sections()))
        return 0
    sections = [s.strip() for s in args.sections.split(",") if s.strip()] if args.sections is not None else None
    if sections is not None:
        available = available_sections()
        for key in sections:
            if key not in available:
                why = "needs geolens modules that are not installed" if key in {s.key for s in SECTIONS} else "unknown section"
                raise UsageError(f"--sections: {key!r}: {why} (available: {', '.join(available)})")
        if not sections:
            raise UsageError(f"--sections is empty (available: {', '.join(available)})")
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
    model_name = check_model_name(config.model)
    out = check_out_dir(args.out)
    for name in ("report.html", "report.json"):
        if (out / name).is_dir():
            raise UsageError(f"--out {out}: {name} there is a folder, so the report could not be written")
    check_corpus(config.corpus)
    start = time.perf_counter()
    model = load_model(model_name, compatibility_mode=args.compat)
    if config.example_layer is not None:
        config.example_layer = check_index(config.example_layer, model.cfg.n_layers, "layers", "--example-layer")
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
    from geolens.commands._options import add_corpus, add_model, positive_int, seq_len_int

    p = subparsers.add_parser("report", help="the full HTML + JSON report (offline, SmolLM2 by default)")
    add_model(p)
    add_corpus(p)
    p.add_argument("--n-sequences", type=positive_int, default=None, help="corpus windows (default 64; 8 with --quick)")
    p.add_argument("--n-heldout", type=positive_int, default=None, help="extra windows for faithfulness and pruning (default 8; 1 with --quick)")
    p.add_argument("--seq-len", type=seq_len_int, default=None, help="tokens per window incl. BOS (default 128; 64 with --quick)")
    p.add_argument("--batch-size", type=positive_int, default=None, help="sequences per forward pass (default 8)")
    p.add_argument("--out", default="report", help="output folder (default: report/)")
    p.add_argument("--quick", action="store_true", help="small workload, under two minutes on a CPU")
    p.add_argument("--prompt", default=None, help="prompt of the example heatmaps")
    p.add_argument("--example-layer", type=int, default=None, help="layer of the example heatmaps (-1: the last; default: most disagreement)")
    p.add_argument("--sections", default=None, help="comma-separated subset of sections (see --list-sections)")
    p.add_argument("--list-sections", action="store_true", help="print the sections available in this install")
    p.add_argument("--seed", type=int, default=0, help="seed of the random baselines")
    p.add_argument("--compat", action="store_true", help="enable TransformerLens compatibility mode")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run)
