"""``geolens selection``: token-selection geometry with the authors' protocol (docs/method.md §5–6).

For each corpus, one pass computes (:class:`geolens.selection.analysis.SelectionAnalysis`) P_N,
R_N, F_N of the final query of every window for all layers × query heads and N ∈ {1, 2, 4, …}
below the visible count (capped by ``--max-n``), for top-N by attention and 16 random rankings
nested across N, in value space with Euclidean and cosine distance, sink kept / excluded /
forced; plus ranking by contribution norm and the projected space for top-N; and the sink-aware
regime fit (:class:`geolens.selection.regime.RegimeAnalysis`). Averages: repeats → heads and
layers within a document → documents, with document-bootstrap CIs (``--n-boot``). Then the
effective set size N* on ``--nstar-sequences`` windows of ``--nstar-corpus``.

Example (offline)::

    geolens selection --model smollm2-135m --corpora lee enwiki --n-sequences 200 --seq-len 128 --out docs/selection --overwrite
"""

from __future__ import annotations

import json
import sys
import time


def headline(res: dict, regime: dict) -> dict:
    """The numbers the README quotes for one corpus."""
    main = res["main_condition"]
    cmp = res["comparison"]
    out = {"n_documents": res["n_documents"], "sizes": res["sizes"], "main_condition": main}
    for cond, g in cmp.groupby("condition", sort=False):
        g = g.set_index("N")
        out[f"{cond}"] = {
            int(n): {
                k: float(r[k])
                for k in (
                    "top",
                    "top_lo",
                    "top_hi",
                    "random",
                    "random_lo",
                    "random_hi",
                    "diff",
                    "diff_lo",
                    "diff_hi",
                    "win_share",
                    "win_lo",
                    "win_hi",
                    "tie_share",
                )
            }
            for n, r in g.iterrows()
        }
        nontrivial = g[g.tie_share < 0.999]
        out[f"{cond}|largest_advantage_N"] = int(nontrivial["diff"].idxmax()) if len(nontrivial) else None
    s = res["scores"]
    f = s[(s.metric == "f") & (s.kind == "top")]
    sink = {}
    for dist in ("euclidean", "cosine"):
        for sm in ("keep", "exclude", "force"):
            g = f[(f.space == "value") & (f.by == "attention") & (f.distance == dist) & (f.sink == sm)].set_index("N")
            if len(g):
                sink[f"{dist}|{sm}"] = {int(n): float(v) for n, v in g["mean"].items()}
    out["f_top_by_sink_mode"] = sink
    byn = {}
    for dist in ("euclidean", "cosine"):
        g = f[(f.space == "value") & (f.sink == "keep") & (f.distance == dist)]
        byn[dist] = {b: {int(n): float(v) for n, v in gg.set_index("N")["mean"].items()} for b, gg in g.groupby("by")}
    out["f_top_by_ranking"] = byn
    g = f[(f.space == "projected") & (f.sink == "keep") & (f.by == "attention")]
    out["f_top_projected"] = {
        d: {int(n): float(v) for n, v in gg.set_index("N")["mean"].items()} for d, gg in g.groupby("distance")
    }
    out["sink_in_top_share"] = {
        int(r.N): float(r.sink_in_top_share)
        for r in res["sink_in_top"][res["sink_in_top"].condition == main].itertuples()
    }
    out["correlations"] = res["correlations"].to_dict(orient="records")
    out["violations_total"] = (
        res["violations"][["n_cases", "precision_bound", "recall_bound", "equivalence"]].sum().to_dict()
    )
    out["regime_medians"] = regime["summary"]
    return out


def run(args) -> int:
    import numpy as np

    from geolens.commands._options import check_corpus, check_model_name, out_folder
    from geolens.commands._options import corpus_windows as windows
    from geolens.data import corpus_label
    from geolens.models import load_model
    from geolens.pipelines import save_figures, write_tables
    from geolens.pipelines.selection import SelectionParams, run_selection
    from geolens.selection.effective_set import effective_set_size

    model_name = check_model_name(args.model, tiny=True)
    out = out_folder(args, "selection")  # a later usage error removes it again
    for corpus in args.corpora:
        check_corpus(corpus, "--corpora")
    if args.nstar_sequences > 0:
        check_corpus(args.nstar_corpus, "--nstar-corpus")
    from geolens.threads import apply

    apply(args.threads or None)  # --threads, else GEOLENS_THREADS, else the free cores
    t0 = time.time()
    model = load_model(model_name)
    summary = {
        "command": "geolens " + " ".join(sys.argv[1:]),
        "settings": {k: v for k, v in vars(args).items() if k != "func"},
        "protocol": "final query of each window (or all queries), all layers x query heads; random = n_random rankings nested across N; "
        "averages: repeats -> heads and layers within a document (window) -> documents; percentile bootstrap over documents",
        "corpora": {},
    }
    for corpus in args.corpora:
        name = corpus_label(corpus)
        tokens = windows(model, corpus, args.seq_len, args.n_sequences, "--corpora")
        params = SelectionParams(
            max_n=args.max_n,
            n_random=args.n_random,
            queries=args.queries,
            seed=args.seed,
            n_boot=args.n_boot,
            batch_size=args.batch_size,
            label=name,
            title=f"{args.model}, {name}: F_N top-N vs random",
        )
        result = run_selection(model, tokens, params, desc=f"selection {name}")
        regime = result.regime
        write_tables(out, result.tables, suffix=f"_{name}")
        np.savetxt(
            out / f"similarity_by_lag_{name}.csv",
            regime["lag_sim"].mean(1),
            delimiter=",",
            fmt="%.5g",
            header="rows: layers (head mean); columns: lag 1..T-2",
        )
        np.savetxt(
            out / f"attention_profile_{name}.csv",
            regime["profile"].mean(1),
            delimiter=",",
            fmt="%.5g",
            header="rows: layers (head mean); columns: distance 0..T-1 from the final query",
        )
        summary["corpora"][name] = headline(result.scores, regime)
        save_figures(out, result.figures, dpi=100, suffix=f"_{name}")
    if args.nstar_sequences > 0:
        tokens = windows(model, args.nstar_corpus, args.seq_len, args.nstar_sequences, "--nstar-corpus")
        eff = effective_set_size(model, tokens, sizes=args.nstar_sizes, batch_size=args.batch_size)
        eff["nll"].to_csv(out / "nstar_nll.csv", index=False, float_format="%.6g")
        eff["n_star"].to_csv(out / "nstar.csv", index=False)
        summary["n_star"] = {
            "corpus": args.nstar_corpus,
            "n_sequences": args.nstar_sequences,
            "table": eff["n_star"].to_dict(orient="records"),
            "nll": eff["nll"].to_dict(orient="records"),
        }
    summary["seconds"] = round(time.time() - t0, 1)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=float), encoding="utf-8")
    print(f"wrote {out} in {summary['seconds']} s")
    return 0


def register(subparsers) -> None:
    from geolens.commands._options import add_out, add_run_options, int_list, non_negative_int, positive_int

    p = subparsers.add_parser(
        "selection", help="token-selection geometry, random baseline, sink regime and N* (docs/method.md §5-6)"
    )
    add_run_options(
        p,
        tiny=True,
        model="smollm2-135m",
        corpora=["lee", "enwiki"],
        n_sequences=200,
        seq_len=128,
        batch_size=8,
        own={"corpora": {"nargs": "*", "help": "corpora (none: only N*)"}},
    )
    p.add_argument(
        "--max-n", type=positive_int, default=256, help="largest N of {1,2,4,...} (always below the visible count)"
    )
    p.add_argument("--n-random", type=positive_int, default=16)
    p.add_argument("--n-boot", type=positive_int, default=2000)
    p.add_argument("--queries", choices=["final", "all"], default="final")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--nstar-corpus", default="lee")
    p.add_argument("--nstar-sequences", type=non_negative_int, default=32, help="windows for N* (0 = skip)")
    p.add_argument(
        "--nstar-sizes",
        type=int_list(1),
        default=[1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96],
        help="grid of N for N* (comma-separated; default 1,2,4,8,12,16,24,32,48,64,96)",
    )
    add_run_options(p, threads=1)
    add_out(p)
    p.set_defaults(func=run)
