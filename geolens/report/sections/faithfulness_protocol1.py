"""Report appendix: protocol 1's all-layer masking curves (superseded), full report only.

Protocol 1 (docs/faithfulness/PROTOCOL.md §1) removes the terms α_ij ṽ_j that a metric ranks highest
(comprehensiveness) or lowest (sufficiency) in every layer at once, without renormalising α, which
takes the model off its distribution; the per-term endpoint superseded it (protocol 2, then protocol
3's norm-controlled version that the faithfulness section runs,
:mod:`geolens.report.sections.faithfulness`). The full report keeps its curves in an appendix,
labelled superseded (the faithfulness section asks for it, :mod:`geolens.report.build`); ``geolens
report --quick`` does not run it.

From :func:`~geolens.pipelines.faithfulness.run_faithfulness` with
:class:`~geolens.faithfulness.MaskingConfig`'s defaults (``query`` ranking on the inter-head scale,
sink and current token removable, every prediction after the first 8 positions scored) on the
report's held-out windows (up to 8), with every metric of :mod:`geolens.metrics` registered with
``default=True``.
"""

from __future__ import annotations

from geolens.claims import PROTOCOL_MIN_DOCUMENTS, sample_size, table_verdict
from geolens.faithfulness import FRACTIONS, MaskingConfig
from geolens.metrics import metric_names
from geolens.pipelines.faithfulness import QUANTITY, FaithfulnessParams, run_faithfulness
from geolens.report.document import Section

SUPERSEDED = "all-layer masking, protocol 1: superseded"
WINDOWS = "held-out windows"


def settings(ctx) -> dict:
    """Run size; the metrics are every registered one with ``default=True`` (geolens.metrics), in registry order."""
    skip = min(8, max(0, ctx.heldout.shape[1] - 4))
    return {
        "n_sequences": min(8, ctx.heldout.shape[0]),
        "fractions": FRACTIONS,
        "n_boot": 1000,
        "metrics": metric_names(default_only=True),
        "chunk_size": 12,
        "skip_prefix": skip,
    }


def build(ctx, analyses: dict | None = None) -> Section:
    s = settings(ctx)
    protocol = MaskingConfig(fractions=tuple(s["fractions"]), skip_prefix=s["skip_prefix"])
    params = FaithfulnessParams(
        protocol=protocol, metrics=s["metrics"], chunk_size=s["chunk_size"], seed=ctx.config.seed, n_boot=s["n_boot"]
    )
    run = run_faithfulness(ctx.model, ctx.heldout[: s["n_sequences"]], params, progress=ctx.progress)
    result = run.result
    auc, pairs = run.tables["auc"], run.tables["pairs"]
    sample = sample_size(len(result.clean), windows=WINDOWS, minimum=PROTOCOL_MIN_DOCUMENTS)
    shown_pairs = pairs.assign(verdict=[table_verdict(v, sample) for v in pairs.verdict]) if len(pairs) else pairs
    curves = run.figures[f"curves_{QUANTITY}"]()
    curves.title = f"{curves.title} [{SUPERSEDED}]"
    claims = run.claims(windows=WINDOWS)
    for c in claims:
        c.claim = f"{c.claim} [{SUPERSEDED}]"
    n = len(result.clean)
    intro = (
        "<b>Superseded.</b> Protocol 1 of docs/faithfulness/PROTOCOL.md, kept for reference: the terms α_ij ṽ_j that a "
        "metric ranks highest (comprehensiveness) or lowest (sufficiency) removed in every layer at once, without "
        "renormalising α, which takes the model off its distribution, so that perplexity differences of several "
        "orders of magnitude say little about the metrics. The faithfulness section's per-term endpoint (protocol 3, "
        f"docs/faithfulness/v3/PROTOCOL.md) replaces it. {result.protocol_text()}, on {n} held-out "
        f"window{'s' if n != 1 else ''}."
    )
    return Section(
        key="faithfulness_protocol1",
        title="Appendix: all-layer masking (protocol 1, superseded)",
        intro=intro,
        appendix=True,
        figures=[curves],
        tables=[
            (
                f"paired AUC differences (b − a; + = b more faithful), 95% CI over documents [{SUPERSEDED}]",
                shown_pairs,
                "AUC of ΔPPL in perplexity × k, of Δ log-prob in nats × k; + = b more faithful.",
            ),
            (
                f"area under the curve (bootstrap 95% CI over documents) [{SUPERSEDED}]",
                auc,
                "AUC of ΔPPL in perplexity × k, of Δ log-prob in nats × k.",
            ),
        ],
        numbers={
            "curves": result.curves,
            "auc": auc,
            "pairs": pairs,
            "range_check": result.range_check(),
            "clean": result.clean,
            "protocol": result.protocol,
            "sample": sample,
        },
        claims=claims,
        params={
            "protocol": result.protocol,
            "n_sequences": s["n_sequences"],
            "metrics": list(s["metrics"]),
            "n_boot": s["n_boot"],
        },
    )
