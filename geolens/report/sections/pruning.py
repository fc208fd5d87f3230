"""Report section: head pruning by regime vs baselines (docs/method.md §6, paper B).

References (head taxonomy, attention entropy, mean ``hook_z`` for mean-ablation) are streamed in
the report's shared corpus pass; ΔPPL is measured on the held-out windows, which that pass never
sees, for each order of :func:`geolens.pruning.pruning_orders` (regime: Reset → Mixer →
Retriever; weight magnitude; attention entropy; random seeds) at each retention level.
"""

from __future__ import annotations

import numpy as np

from geolens.interventions.ablation import MeanHeadZ
from geolens.pruning import RETENTION, AttentionEntropy, pruning_curves, pruning_orders
from geolens.report.build import sample_size
from geolens.report.document import Claim, Section
from geolens.taxonomy import TaxonomyAnalysis
from geolens.viz.faithfulness import pruning_curves_plot


def settings(ctx) -> dict:
    if ctx.config.quick:
        return {"retention": (0.8, 0.5), "seeds": (0,)}
    return {"retention": RETENTION, "seeds": (0, 1, 2)}


def analyses(ctx) -> dict:
    L, H = ctx.model.cfg.n_layers, ctx.model.cfg.n_heads
    return {"taxonomy": TaxonomyAnalysis(L, H), "entropy": AttentionEntropy(L, H), "mean_z": MeanHeadZ.for_model(ctx.model)}


def claims_from(df, sample: dict | None = None) -> list[Claim]:
    mean = df.groupby("order", sort=False).delta_ppl.mean()
    rand = mean[[o for o in mean.index if o.startswith("random")]]
    regime, random_mean = float(mean["regime"]), float(rand.mean())
    others = {o: float(mean[o]) for o in ("weight", "entropy") if o in mean.index}
    return [
        Claim(
            claim="Pruning heads in regime order (Reset first, Retrievers last) hurts less than pruning at random",
            source="paper B (docs/method.md §6)",
            measured=(
                f"mean ΔPPL over retention levels: regime {regime:.3g}, random {random_mean:.3g} "
                f"({len(rand)} seeds); " + ", ".join(f"{k} {v:.3g}" for k, v in others.items())
            ),
            holds=bool(regime < random_mean),
            criterion="regime-order mean ΔPPL < mean of the random orders",
            numbers={"regime": regime, "random": random_mean, **others, **({"sample": sample} if sample else {})},
        )
    ]


def build(ctx, analyses: dict) -> Section:
    model, cfg = ctx.model, ctx.config
    s = settings(ctx)
    ref, evaluation = ctx.tokens, ctx.heldout
    tax = analyses["taxonomy"].result()
    orders = pruning_orders(
        model, ref, taxonomy_table=tax.table, entropy=analyses["entropy"].result(), seeds=s["seeds"], batch_size=cfg.batch_size
    )
    means = analyses["mean_z"].result()
    df = pruning_curves(model, evaluation, orders, s["retention"], mode="mean", means=means, batch_size=cfg.batch_size, progress=ctx.progress)
    desc = (
        f"mean-ablation of hook_z; references (taxonomy, entropy, mean z) on the {ref.shape[0]} corpus-pass windows, "
        f"ΔPPL on {evaluation.shape[0]} held-out windows × {evaluation.shape[1]} tokens"
    )
    fig = pruning_curves_plot(df, subtitle=desc)
    wide = df.pivot_table(index="order", columns="retention", values="delta_ppl", sort=False).reset_index()
    wide.columns = [str(c) for c in wide.columns]
    intro = (
        "Heads are mean-ablated at hook_z in a fixed order down to each retention level. Orders: "
        "<b>regime</b> (Reset heads first, then Mixer, Retrievers last; ties by ascending current-token "
        "share), <b>weight</b> (ascending ‖W_V‖·‖W_O‖), <b>entropy</b> (most diffuse attention first) "
        f"and random permutations. {desc}."
    )
    return Section(
        key="pruning",
        title="Pruning curves",
        intro=intro,
        figures=[fig],
        tables=[("ΔPPL per order (rows) and retention (columns)", wide)],
        numbers={"curves": df, "orders": {k: [list(h) for h in v] for k, v in orders.items()}, "clean_ppl": float(np.asarray(df.clean_ppl)[0])},
        claims=claims_from(df, sample_size(evaluation.shape[0], windows="held-out windows", n_seeds=len(s["seeds"]))),
        params={"mode": "mean", "retention": list(s["retention"]), "seeds": list(s["seeds"]), "eval_windows": int(evaluation.shape[0]), "reference_windows": int(ref.shape[0])},
    )
