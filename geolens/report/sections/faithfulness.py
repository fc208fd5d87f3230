"""Report section: faithfulness curves by causal masking (docs/method.md §3, paper A §2.3, §3.1).

The faithfulness pipeline (:func:`geolens.pipelines.faithfulness.run_faithfulness`) with the
primary protocol of :mod:`geolens.faithfulness` (the default :class:`Protocol`): every layer
masked at once, ``query`` ranking (all (head, source) terms of a query ranked together on the
inter-head scale), sink and current token removable, every prediction after the first 8 positions
scored. It runs on the report's held-out windows (up to 8; in quick mode 1 window and
k ∈ {0.05, 0.5}) with every metric of :mod:`geolens.metrics` registered with ``default=True``, so
Value Zeroing is left out (one forward per source token) and a metric registered by the user takes
part. The claims are
decided by paired bootstrap CIs over documents, after the range check; with fewer than
:data:`geolens.faithfulness.MIN_DOCUMENTS` documents or without range they stay undecided, and
below the protocol's :data:`geolens.claims.PROTOCOL_MIN_DOCUMENTS` documents they read indicative.
"""

from __future__ import annotations

from geolens.faithfulness import FRACTIONS, Protocol
from geolens.metrics import metric_names
from geolens.pipelines.faithfulness import QUANTITY, FaithfulnessParams, run_faithfulness
from geolens.report.document import Section


def settings(ctx) -> dict:
    """Run size; the metrics are every registered one with ``default=True`` (geolens.metrics), in registry order."""
    n = ctx.heldout.shape[0]
    metrics = metric_names(default_only=True)
    skip = min(8, max(0, ctx.heldout.shape[1] - 4))
    if ctx.config.quick:
        return {"n_sequences": min(1, n), "fractions": (0.05, 0.5), "n_boot": 200, "metrics": metrics, "chunk_size": 12, "skip_prefix": skip}
    return {"n_sequences": min(8, n), "fractions": FRACTIONS, "n_boot": 1000, "metrics": metrics, "chunk_size": 12, "skip_prefix": skip}


def build(ctx, analyses: dict) -> Section:
    s = settings(ctx)
    protocol = Protocol(fractions=tuple(s["fractions"]), skip_prefix=s["skip_prefix"])
    params = FaithfulnessParams(protocol=protocol, metrics=s["metrics"], chunk_size=s["chunk_size"], seed=ctx.config.seed, n_boot=s["n_boot"])
    run = run_faithfulness(ctx.model, ctx.heldout[: s["n_sequences"]], params, progress=ctx.progress)
    result = run.result
    auc, pairs = run.tables["auc"], run.tables["pairs"]
    text = result.protocol_text()
    intro = (
        "The faithfulness test of Cunningham & Muça Cirone 2026, comparing raw attention, value-weighted attention "
        "(Kobayashi et al. 2020), its output-normalised form and contribution weights against random scores. "
        "Masking removes the terms α_ij ṽ_j that a metric ranks highest (comprehensiveness: a faithful metric "
        "hurts the model most) or lowest (sufficiency: hurts least), without renormalising α, in every layer at once; "
        "all (head, source) terms of a query are ranked together. "
        f"{text}. Verdicts: paired bootstrap over documents, holds / tie / reversed by the 95% CI of the AUC difference."
    )
    return Section(
        key="faithfulness",
        title="Faithfulness curves",
        intro=intro,
        figures=[run.figures[f"curves_{QUANTITY}"]()],
        tables=[("paired AUC differences (b − a; + = b more faithful), 95% CI over documents", pairs,
                 "AUC of ΔPPL in perplexity × k, of Δ log-prob in nats × k; + = b more faithful."),
                ("area under the curve (bootstrap 95% CI over documents)", auc,
                 "AUC of ΔPPL in perplexity × k, of Δ log-prob in nats × k.")],  # fmt: skip
        numbers={"curves": result.curves, "auc": auc, "pairs": pairs, "range_check": result.range_check(), "clean": result.clean, "protocol": result.protocol},
        claims=run.claims(windows="held-out windows"),
        params={"protocol": result.protocol, "n_sequences": s["n_sequences"], "metrics": list(s["metrics"]), "n_boot": s["n_boot"]},
    )
