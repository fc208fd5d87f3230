"""``geolens report``: the one-command report (HTML + JSON), offline on SmolLM2 by default.

Runs every report section whose geolens modules are installed (see
:mod:`geolens.report.build`) on ``--n-sequences`` windows of ``--corpus`` and writes
``report.html`` (self-contained) and ``report.json`` into ``--out``; ``--n-heldout`` further windows
are kept out of the corpus pass for faithfulness and pruning. ``--quick`` shrinks every section
(8 + 1 windows of 64 tokens unless given, smaller grids) to finish in about 40 s (idle, 2 cores;
docs/benchmarks.md, ``benchmarks/first_hour.py``).

Cross-model report (:mod:`geolens.report.compare`): ``--model A --model B`` writes each model's
report under ``--out/<model>/`` and then ``compare.html`` / ``compare.json`` in ``--out``: one
claim table with a column per model and figures on shared axes. ``--compare runA/report.json
runB/report.json`` builds the same page from saved runs without loading any model.
"""

from __future__ import annotations

import json
import time
from pathlib import Path


def _compare(paths, out) -> int:
    from geolens.report.citations import cite_text
    from geolens.report.compare import load_report, write_comparison

    reports = [load_report(p) for p in paths]
    written = write_comparison(reports, out)
    data = json.loads(written["json"].read_text(encoding="utf-8"))
    print("paper claim → measured, per model (" + " | ".join(data["models"]) + ")")
    for row in data["claims"]:
        cells = [m["verdict"] if m else "not run" for m in row["models"].values()]
        print(f"  {cite_text(row['claim'])[:70]:<70} " + " | ".join(cells))
    print(f"\nwrote {written['html']} and {written['json']}")
    return 0


def run(args) -> int:
    from geolens.commands._options import (
        check_backend,
        check_corpus,
        check_model_name,
        check_out_dir,
        did_you_mean,
        out_folder,
    )
    from geolens.errors import UsageError
    from geolens.files import folder_name  # `.`, `..` refused: nothing is written outside --out
    from geolens.report import SECTIONS, available_sections
    from geolens.run_folder import IncompleteResults, require_complete

    if args.list_sections:
        print("\n".join(available_sections()))
        return 0
    if args.compare:
        if args.model:
            raise UsageError("give either --compare (saved runs) or --model (new runs), not both")
        if len(args.compare) < 2:
            raise UsageError("--compare needs at least two report.json files (or run folders)")
        for path in args.compare:
            p = Path(path)
            if not (p / "report.json" if p.is_dir() else p).is_file():
                raise UsageError(f"--compare {path}: no such report.json (or run folder holding one)")
            try:
                require_complete(p if p.is_dir() else p.parent, what="report")
            except IncompleteResults as err:
                raise UsageError(f"--compare {path}: {err}") from err
        return _compare(args.compare, out_folder(args, "report"))
    models = args.model or ["smollm2-135m"]
    if len(set(models)) != len(models):
        raise UsageError(f"--model given twice with the same name: {models}")
    # every argument is checked before the first model loads
    sections = [s.strip() for s in args.sections.split(",") if s.strip()] if args.sections is not None else None
    if sections is not None:
        available = available_sections()
        for key in sections:
            if key not in available:
                why = (
                    "needs geolens modules that are not installed"
                    if key in {s.key for s in SECTIONS}
                    else "unknown section" + did_you_mean(key, available)
                )
                raise UsageError(f"--sections: {key!r}: {why} (available: {', '.join(available)})")
        if not sections:
            raise UsageError(f"--sections is empty (available: {', '.join(available)})")
    names = [check_model_name(name, tiny=True) for name in models]
    backend = check_backend(args.backend, compat=args.compat)
    out = out_folder(args, "report")  # a later usage error removes it again
    check_corpus(args.corpus)
    outs = [out] if len(names) == 1 else [check_out_dir(out / folder_name(m, what="--model")) for m in models]
    for name, folder in zip(names, outs):
        _run_one(args, name, folder, sections, backend)
    if len(names) == 1:
        return 0
    return _compare([folder / "report.json" for folder in outs], out)


def _run_one(args, model_name: str, out: Path, sections, backend: str = "transformer_lens") -> int:
    import torch

    from geolens.commands._options import check_index, corpus_windows
    from geolens.models import load_model
    from geolens.report import ReportConfig, build_report, write_report
    from geolens.report.citations import cite_text
    from geolens.report.document import timing_lines

    options = dict(
        model=model_name,
        corpus=args.corpus,
        n_sequences=args.n_sequences,
        n_heldout=args.n_heldout,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        example_layer=args.example_layer,
        sections=sections,
        seed=args.seed,
    )
    if args.prompt:
        options["prompt"] = args.prompt
    if args.quick:
        config = ReportConfig.quick_defaults(**options)
    else:
        config = ReportConfig(**{k: v for k, v in options.items() if v is not None})
    start = time.perf_counter()
    model = load_model(model_name, backend=backend, compatibility_mode=args.compat)  # tiny-* models ignore --compat
    if config.example_layer is not None:
        config.example_layer = check_index(config.example_layer, model.cfg.n_layers, "layers", "--example-layer")
    loaded = time.perf_counter() - start
    tokens = corpus_windows(model, config.corpus, config.seq_len, config.n_sequences + config.n_heldout)
    report = build_report(model, tokens, config, progress=not args.no_progress)
    paths = write_report(report, out)
    print("\n".join(timing_lines(report, loaded, torch.get_num_threads())))
    print("\npaper claim → measured")
    for c in report.claims:
        print(f"  [{c.verdict}] {cite_text(c.claim)} ({cite_text(c.source)}): {c.measured}")
    print(f"\nwrote {paths['html']} and {paths['json']} in {time.perf_counter() - start:.0f} s")
    return 0


def register(subparsers) -> None:
    from geolens.commands._options import add_out, add_run_options, positive_int

    p = subparsers.add_parser("report", help="the full HTML + JSON report (offline, SmolLM2 by default)")
    add_run_options(
        p,
        model=None,
        backend="tl",
        corpus="lee",
        n_sequences=None,
        seq_len=None,
        batch_size=None,
        own={
            "model": {
                "action": "append",
                "help": "smollm2-135m (default), gemma3-270m, a local folder or a cached HF name; repeat for a cross-model report",
            },
            "n_sequences": {"help": "corpus windows (default 64; 8 with --quick)"},
            "seq_len": {"help": "tokens per window incl. BOS (default 128; 64 with --quick)"},
            "batch_size": {"help": "sequences per forward pass (default 8)"},
        },
    )
    p.add_argument(
        "--compare",
        nargs="+",
        default=None,
        metavar="REPORT_JSON",
        help="build the cross-model page from saved report.json files (or run folders) instead of running",
    )
    p.add_argument(
        "--n-heldout",
        type=positive_int,
        default=None,
        help="extra windows for faithfulness and pruning (default 8; 1 with --quick)",
    )
    p.add_argument("--quick", action="store_true", help="small workload, about 40 s idle on 2 cores")
    p.add_argument("--prompt", default=None, help="prompt of the example heatmaps")
    p.add_argument(
        "--example-layer",
        type=int,
        default=None,
        help="layer of the example heatmaps (-1: the last; default: most disagreement)",
    )
    p.add_argument("--sections", default=None, help="comma-separated subset of sections (see --list-sections)")
    p.add_argument("--list-sections", action="store_true", help="print the sections available in this install")
    p.add_argument("--seed", type=int, default=0, help="seed of the random baselines")
    p.add_argument(
        "--compat",
        action="store_true",
        help="TransformerLens compatibility mode: HookedTransformer numerics (folded norms, centred W_O, b_V folded into b_O); off by default",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_out(p)
    p.set_defaults(func=run)
