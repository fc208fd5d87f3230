"""``geolens pruning``: head-pruning curves by order and the single-head sensitivity scan (docs/method.md §6).

Example (the README run)::

    geolens pruning --out docs/pruning

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

    from geolens.interventions.ablation import MeanHeadZ
    from geolens.models import load_model
    from geolens.pruning import RETENTION, AttentionEntropy, head_sensitivity, pruning_curves, pruning_orders
    from geolens.runner import run_corpus
    from geolens.taxonomy import TaxonomyAnalysis
    from geolens.viz.faithfulness import pruning_curves_plot, sensitivity_map_plot

    from geolens.commands._options import check_corpus, check_model_name, check_out_dir, corpus_windows

    model_name = check_model_name(args.model)
    out = check_out_dir(args.out)
    check_corpus(args.corpus)
    retention = tuple(args.retention) if args.retention else RETENTION
    seeds = tuple(args.seeds)
    torch.set_grad_enabled(False)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model(model_name)
    cfg = model.cfg
    n_eval, n_ref = args.n_sequences, args.ref_sequences
    tokens = corpus_windows(model, args.corpus, args.seq_len, n_eval + n_ref)
    ref, evaluation = tokens[n_eval:], tokens[:n_eval]
    scan = evaluation[: args.scan_sequences]
    desc = (
        f"{args.model}; {args.mode}-ablation of hook_z; references (taxonomy, entropy, means) on {n_ref} windows, "
        f"ΔPPL on {n_eval} other windows × {args.seq_len} tokens of {args.corpus}"
        + (f", last {args.n_scored} predictions scored" if args.n_scored else "")
    )
    print(desc)
    t0 = time.time()
    # one pass over the reference windows for the taxonomy, the entropies and the means of z
    references = [TaxonomyAnalysis.for_model(model), AttentionEntropy(cfg.n_layers, cfg.n_heads), MeanHeadZ.for_model(model)]
    run_corpus(model, ref, references, batch_size=args.batch_size, desc="references")
    tax = references[0].result()
    tax.table.to_csv(out / "taxonomy.csv", index=False)
    print("regimes:", {k: round(v, 3) for k, v in tax.distribution.items()})
    orders = pruning_orders(model, ref, taxonomy_table=tax.table, entropy=references[1].result(), seeds=seeds)
    (out / "orders.json").write_text(json.dumps({k: [list(h) for h in v] for k, v in orders.items()}))
    means = references[2].result() if args.mode == "mean" else None
    df = pruning_curves(model, evaluation, orders, retention, mode=args.mode, means=means, batch_size=args.batch_size, n_scored=args.n_scored)
    df.to_csv(out / "pruning.csv", index=False)
    print(df.pivot_table(index="order", columns="retention", values="delta_ppl", sort=False).to_string(float_format=lambda v: f"{v:.2f}"))
    view = pruning_curves_plot(df, subtitle=desc)
    view.save(out / "pruning.png", dpi=80)
    view.close()
    sens = None
    if args.scan_sequences > 0:
        sens = head_sensitivity(model, scan, mode=args.mode, means=means, n_scored=args.n_scored)
        sens.table.merge(tax.table[["layer", "head", "regime"]], on=["layer", "head"]).to_csv(out / "sensitivity.csv", index=False)
        crit = sens.critical.merge(tax.table[["layer", "head", "regime", "share_sink", "share_current", "share_other"]], on=["layer", "head"])
        crit.to_csv(out / "critical_heads.csv", index=False)
        print(f"single-head scan on {scan.shape[0]} windows (clean PPL {sens.clean_ppl:.2f}); critical heads (|robust z| > {sens.threshold}):")
        print(crit.head(20).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
        view = sensitivity_map_plot(sens.delta_ppl, sens.critical, subtitle=f"{args.mode}-ablation, one head at a time, {scan.shape[0]} windows × {args.seq_len}")
        view.save(out / "sensitivity.png", dpi=80)
        view.close()
    run_info = dict(
        description=desc, model=args.model, corpus=args.corpus, n_sequences=n_eval, ref_sequences=n_ref,
        scan_sequences=args.scan_sequences, seq_len=args.seq_len, mode=args.mode, retention=list(retention),
        seeds=list(seeds), n_scored=args.n_scored, n_heads_total=cfg.n_layers * cfg.n_heads,
        regime_order="Reset first, then Mixer, Retrievers last; ties by ascending share_current, then (layer, head)",
        seconds=round(time.time() - t0, 1),
    )  # fmt: skip
    (out / "run.json").write_text(json.dumps(run_info, indent=2))
    print(f"results in {out}/ ({run_info['seconds']} s)")
    return 0


def _retention(text: str):
    from geolens.commands._options import float_list

    return [] if text == "" else float_list(0, 1, low_open=True)(text)


def register(subparsers) -> None:
    from geolens.commands._options import add_out, add_run_options, int_list, non_negative_int, positive_int

    p = subparsers.add_parser("pruning", help="head pruning by regime vs baselines, and the single-head sensitivity scan (docs/method.md §6)")
    add_run_options(p, model="smollm2-135m", corpus="lee", n_sequences=4, seq_len=64, batch_size=8, threads=0, own={
        "n_sequences": {"help": "evaluation windows for ΔPPL"}, "seq_len": {"help": None}, "batch_size": {"help": None},
    })  # fmt: skip
    p.add_argument("--ref-sequences", type=positive_int, default=8, help="windows for the taxonomy, entropy and mean-ablation references")
    p.add_argument("--scan-sequences", type=non_negative_int, default=1, help="windows for the single-head scan (0: skip)")
    p.add_argument("--mode", default="mean", choices=["mean", "zero"])
    p.add_argument("--retention", type=_retention, default=[], help="comma-separated retention levels in (0, 1] (default 0.9 … 0.1)")
    p.add_argument("--seeds", type=int_list(), default=[0, 1, 2], help="seeds of the random orders (default 0,1,2)")
    p.add_argument("--n-scored", type=positive_int, default=None, help="score only the last N predictions of each window")
    add_out(p, default="docs/pruning")
    p.set_defaults(func=run)
