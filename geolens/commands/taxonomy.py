"""``geolens taxonomy``: the Retriever / Mixer / Reset head taxonomy on one or more corpora (docs/method.md §6).

For each corpus: the per-head table (shares of sink / current / other winners of
argmax_j α_ij‖v_j‖, regime, mean sink and current-token alignment, most frequent relative offset w_i − i of the
"other" winners with its share and the ``label`` flagging offset-dominated heads, e.g.
"Reset (offset −1, 83 %)"), the regime distribution, the head count per regime and layer, the
top offsets per head (``offsets_<corpus>.csv``) and the regime shares on window prefixes
(``by_length_<corpus>.csv``: how much they depend on the window length); across the first two corpora: the agreement rate, the
regime shares side by side, the confusion table and the correlation of each share over heads.
Figures: ``regime_grid.png`` (layer × head, one panel per corpus) and ``regime_grid.html``.

Example (offline)::

    geolens taxonomy --model smollm2-135m --corpora lee enwiki --n-sequences 200 --seq-len 128 --out docs/taxonomy --overwrite
"""

from __future__ import annotations

import json
import sys
import time


def run(args) -> int:

    from geolens.commands._options import check_corpus, check_model_name, out_folder
    from geolens.commands._options import corpus_windows as windows
    from geolens.data import corpus_label
    from geolens.models import load_model
    from geolens.pipelines import write_tables
    from geolens.pipelines.taxonomy import TaxonomyParams, run_taxonomy
    from geolens.taxonomy import REGIMES, compare_taxonomies
    from geolens.viz.taxonomy import regime_grid_plot, save_regime_grid_html

    model_name = check_model_name(args.model, tiny=True)
    out = out_folder(args, "taxonomy")  # a later usage error removes it again
    for corpus in args.corpora:
        check_corpus(corpus, "--corpora")
    from geolens.threads import apply

    apply(args.threads or None)  # --threads, else GEOLENS_THREADS, else the free cores
    t0 = time.time()
    model = load_model(model_name)
    params = TaxonomyParams(
        space=args.space, queries=args.queries, prefix_lengths=args.prefix_lengths, batch_size=args.batch_size
    )
    results, n_windows = {}, {}
    for corpus in args.corpora:
        name = corpus_label(corpus)
        tokens = windows(model, corpus, args.seq_len, args.n_sequences, "--corpora")
        result = run_taxonomy(model, tokens, params, desc=f"taxonomy {name}")
        results[name] = result.taxonomy
        n_windows[name] = int(tokens.shape[0])
        write_tables(out, result.tables, ("heads",), suffix=f"_{name}")
        write_tables(out, result.tables, ("per_layer",), suffix=f"_{name}", float_format=None, index=True)
        write_tables(out, result.tables, ("offsets", "by_length"), suffix=f"_{name}")
    summary = {
        "command": "geolens " + " ".join(sys.argv[1:]),
        "settings": {k: v for k, v in vars(args).items() if k != "func"},
        "model_mode": next(iter(results.values())).model_mode,
        "rule": "winner w_i = argmax_{j in T_i} alpha_ij ||v_j|| (T_i = visible keys, sliding windows included); regime = largest share: sink->Mixer, current->Retriever, other->Reset; no threshold",
        "queries": args.queries,
        "offset_rule": "top_offset = most frequent w_i - i among 'other' winners; offset-dominated (flagged in label) if its share of the head's counted queries > 0.5",
        "offset_dominated_heads": {
            name: r.table.loc[r.table.offset_dominant, ["layer", "head", "label"]].values.tolist()
            for name, r in results.items()
        },
        "by_length": {name: r.by_length().to_dict(orient="records") for name, r in results.items()},
        "n_windows": n_windows,
        "distribution": {name: r.distribution for name, r in results.items()},
        "n_heads": {name: int(r.regimes.size) for name, r in results.items()},
        "retriever_heads": {
            name: r.table.query("regime == 'Retriever'")[["layer", "head"]].values.tolist()
            for name, r in results.items()
        },
        "mean_shares": {
            name: r.table[["share_sink", "share_current", "share_other"]].mean().to_dict()
            for name, r in results.items()
        },
    }
    names = list(results)
    if len(names) >= 2:
        cmp = compare_taxonomies(results[names[0]], results[names[1]], (names[0], names[1]))
        cmp["distribution"].to_csv(out / "distribution_side_by_side.csv", float_format="%.6g")
        cmp["confusion"].to_csv(out / "confusion.csv")
        summary["stability"] = {
            "corpora": names[:2],
            "agreement": cmp["agreement"],
            "share_correlation": cmp["share_correlation"],
            "confusion": cmp["confusion"].to_dict(),
        }
    title = f"{args.model}: head regimes ({args.n_sequences} × {args.seq_len} tokens, {args.space} space)"
    plot = regime_grid_plot(results, title=title)
    plot.save(out / "regime_grid.png", dpi=110)
    plot.close()
    note = summary["rule"] + (
        f"; agreement between {names[0]} and {names[1]}: {100 * summary['stability']['agreement']:.1f}%"
        if len(names) >= 2
        else ""
    )
    save_regime_grid_html(results, out / "regime_grid.html", title=title, note=note)
    summary["seconds"] = round(time.time() - t0, 1)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str), encoding="utf-8")
    for name, r in results.items():
        print(
            f"{name}: "
            + ", ".join(f"{k} {100 * r.distribution[k]:.1f}%" for k in REGIMES)
            + f"; offset-dominated heads: {int(r.table.offset_dominant.sum())}"
        )
    if "stability" in summary:
        print(f"agreement {names[0]} vs {names[1]}: {100 * summary['stability']['agreement']:.1f}%")
    print(f"wrote {out}")
    return 0


def register(subparsers) -> None:
    from geolens.commands._options import add_out, add_run_options, int_at_least

    p = subparsers.add_parser("taxonomy", help="Retriever/Mixer/Reset head taxonomy on corpora (docs/method.md §6)")
    add_run_options(
        p, tiny=True, model="smollm2-135m", corpora=["lee", "enwiki"], n_sequences=200, seq_len=128, batch_size=8
    )
    p.add_argument(
        "--space", choices=["value", "projected"], default="value", help="‖v‖ (as in Mudarisov et al. 2026) or ‖v W_O‖"
    )
    p.add_argument(
        "--queries",
        choices=["all", "final"],
        default="all",
        help="count every query ≥ 1, or the final query of each window (the authors' protocol)",
    )
    p.add_argument(
        "--prefix-lengths",
        type=int_at_least(2),
        nargs="*",
        default=[16, 32, 64, 128],
        help="window prefixes on which the regime shares are re-counted (each ≥ 2)",
    )
    add_run_options(p, threads=1)
    add_out(p)
    p.set_defaults(func=run)
