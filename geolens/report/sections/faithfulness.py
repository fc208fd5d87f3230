"""Report section: faithfulness of the attribution metrics (docs/method.md §3, docs/faithfulness/PROTOCOL.md).

**Primary: protocol 2's per-term endpoint** (PROTOCOL.md §2), from the faithfulness pipeline's
:func:`~geolens.pipelines.faithfulness.run_per_term`, as ``geolens faithfulness --protocol …
--stage per_term`` measures it: for (layer, query) positions drawn per window, the exact effect of
removing each attention term alone (KL of the next-token distribution), and per metric the mean
Spearman correlation of its scores with those effects, with a document-cluster bootstrap CI, plus
the pre-registered pairs as one Holm family. It runs on the report's corpus windows, each window a
cluster: in quick mode 1 position per window (8 positions on the 8 corpus windows of
``geolens report --quick``; measured on SmolLM2 with 64-token windows, 1.2–2.0 CPU-seconds per
window on one thread, the clean forwards and Value Zeroing included, about 12 for the 8),
otherwise 2 positions on each of up to 32 windows; 1000 bootstrap resamples in quick mode, the
protocol's 2000 otherwise.

**Secondary: protocol 1's curves** (superseded: every layer masked at once, which takes the model
off its distribution), from :func:`~geolens.pipelines.faithfulness.run_faithfulness` with
:class:`~geolens.faithfulness.MaskingConfig`'s defaults (``query`` ranking on the inter-head scale,
sink and current token removable, every prediction after the first 8 positions scored) on the
report's held-out windows (up to 8; in quick mode 1 window and k ∈ {0.05, 0.5}), with every metric
of :mod:`geolens.metrics` registered with ``default=True``.

Every claim follows :mod:`geolens.claims`: it reads holds / does not hold only when decided by
intervals on at least :data:`geolens.claims.PROTOCOL_MIN_DOCUMENTS` documents, so a report's
claims read indicative, with their sample; the tables of pairs show their verdicts under the same
rule (:func:`geolens.claims.table_verdict`).
"""

from __future__ import annotations

import pandas as pd

from geolens.claims import PROTOCOL_MIN_DOCUMENTS, describe_sample, sample_size, table_verdict
from geolens.faithfulness import FRACTIONS, MaskingConfig
from geolens.metrics import metric_names
from geolens.pipelines.faithfulness import QUANTITY, FaithfulnessParams, PerTermParams, run_faithfulness, run_per_term
from geolens.report.document import Section

PER_TERM_WINDOWS = "corpus windows"
SUPERSEDED = "all-layer masking, protocol 1: superseded, secondary"


def settings(ctx) -> dict:
    """Run size of protocol 1's curves; the metrics are every registered one with ``default=True`` (geolens.metrics), in registry order."""
    n = ctx.heldout.shape[0]
    metrics = metric_names(default_only=True)
    skip = min(8, max(0, ctx.heldout.shape[1] - 4))
    if ctx.config.quick:
        return {
            "n_sequences": min(1, n),
            "fractions": (0.05, 0.5),
            "n_boot": 200,
            "metrics": metrics,
            "chunk_size": 12,
            "skip_prefix": skip,
        }
    return {
        "n_sequences": min(8, n),
        "fractions": FRACTIONS,
        "n_boot": 1000,
        "metrics": metrics,
        "chunk_size": 12,
        "skip_prefix": skip,
    }


def per_term_params(ctx) -> PerTermParams:
    """MaskingConfig 2's per-term endpoint at report size (module docstring)."""
    if ctx.config.quick:
        return PerTermParams(n_positions=1, n_boot=1000, seed=ctx.config.seed)
    return PerTermParams(n_positions=2, n_boot=2000, seed=ctx.config.seed)


def per_term_windows(ctx):
    """The corpus windows the per-term endpoint runs on (all of them in quick mode, else up to 32)."""
    return ctx.tokens if ctx.config.quick else ctx.tokens[:32]


def per_term_tables(run, sample: dict) -> dict[str, pd.DataFrame]:
    """The per-term tables as the report shows them: mean Spearman per metric (KL outcome, both
    scopes) and the Holm family's pairs with their verdict under the claims rule."""
    metrics = run.tables["metrics"]
    kl = metrics[metrics.outcome == "kl"][
        ["scope", "metric", "spearman", "ci_low", "ci_high", "top5", "n_positions", "n_documents"]
    ]
    pairs = run.tables["pairs"]
    keep = [
        c
        for c in ("scope", "a", "b", "estimate", "ci_low", "ci_high", "level", "p_adj", "verdict")
        if c in pairs.columns
    ]
    shown = pairs[keep].assign(verdict=[table_verdict(v, sample) for v in pairs.verdict]) if len(pairs) else pairs[keep]
    return {"metrics": kl.reset_index(drop=True), "pairs": shown.reset_index(drop=True)}


def build(ctx, analyses: dict) -> Section:
    model = ctx.model
    # primary: protocol 2's per-term endpoint
    pt_params = per_term_params(ctx)
    pt_windows = per_term_windows(ctx)
    per_term = run_per_term(model, pt_windows, pt_params, progress=ctx.progress)
    summary = per_term.summary
    pt_sample = sample_size(summary["n_documents"], windows=PER_TERM_WINDOWS, minimum=PROTOCOL_MIN_DOCUMENTS)
    pt_tables = per_term_tables(per_term, pt_sample)
    queries = pt_params.query_range(int(pt_windows.shape[1]))
    effects = summary["single_term_effects"]

    # secondary: protocol 1's all-layer curves, on the held-out windows
    s = settings(ctx)
    protocol = MaskingConfig(fractions=tuple(s["fractions"]), skip_prefix=s["skip_prefix"])
    params = FaithfulnessParams(
        protocol=protocol, metrics=s["metrics"], chunk_size=s["chunk_size"], seed=ctx.config.seed, n_boot=s["n_boot"]
    )
    run = run_faithfulness(model, ctx.heldout[: s["n_sequences"]], params, progress=ctx.progress)
    result = run.result
    auc, pairs = run.tables["auc"], run.tables["pairs"]
    curve_sample = sample_size(len(result.clean), windows="held-out windows", minimum=PROTOCOL_MIN_DOCUMENTS)
    shown_pairs = pairs.assign(verdict=[table_verdict(v, curve_sample) for v in pairs.verdict]) if len(pairs) else pairs
    curves = run.figures[f"curves_{QUANTITY}"]()
    curves.title = f"{curves.title} [{SUPERSEDED}]"
    claims = per_term.claims(windows=PER_TERM_WINDOWS)
    for c in run.claims(windows="held-out windows"):
        c.claim = f"{c.claim} [{SUPERSEDED}]"
        claims.append(c)

    intro = (
        "Which attribution metric tells how much an attention term matters? The primary test (protocol 2, docs/faithfulness/PROTOCOL.md §2) "
        "removes each term α_ij^h ṽ_j^h of a (layer, query) position alone, everything else clean, measures KL(clean ‖ removed) of "
        "the next-token distribution, and asks how well each metric's scores rank those measured effects (Spearman correlation per "
        "position, averaged; document-cluster bootstrap CIs; the pre-registered pairs as one Holm family, Holm 1979). The effects are "
        "measured, not implied by a metric's definition, so the test is not circular. Metrics: raw attention, value-weighted "
        "attention (Kobayashi et al. 2020), its output normalisation per head (intra) and per layer (inter), contribution weights c "
        "(Cunningham & Muça Cirone 2026) signed and |c|, gradient × activation (attribution patching, Syed et al. 2023), Value Zeroing "
        f"(Mohebbi et al. 2023, source scope) and random scores. Sample: {summary['n_positions']} positions, {pt_params.n_positions} per "
        f"window drawn with layer uniform and query uniform in {queries[0]} … {queries[1]}, {describe_sample(pt_sample)}, each window one "
        f"cluster; the protocol asks for {PROTOCOL_MIN_DOCUMENTS} documents and 2000 positions, so every verdict here is indicative. "
        f"Median KL of the largest single term {effects['median_kl_of_largest_term']:.3g} nats. "
        "The curves below are the superseded protocol 1 (secondary): the terms α_ij ṽ_j that a metric ranks highest "
        "(comprehensiveness) or lowest (sufficiency) removed in every layer at once, without renormalising α, which takes the model "
        f"off its distribution; {result.protocol_text()}, on {len(result.clean)} held-out window{'s' if len(result.clean) != 1 else ''}."
    )
    return Section(
        key="faithfulness",
        title="Faithfulness",
        intro=intro,
        figures=[curves],
        tables=[
            (
                f"per-term endpoint: mean Spearman ρ with the measured effects (KL), 95% CI over {PER_TERM_WINDOWS}",
                pt_tables["metrics"],
                "Primary endpoint of protocol 2; term scope: each head's term; source scope: a source removed from every head.",
            ),
            (
                "per-term endpoint: pre-registered pairs (Δ = ρ(b) − ρ(a), + = b agrees better; one Holm family)",
                pt_tables["pairs"],
                "The interval is at the pair's Holm level; the verdict follows the claims rule.",
            ),
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
            "per_term": summary,
            "per_term_sample": pt_sample,
            "curves": result.curves,
            "auc": auc,
            "pairs": pairs,
            "range_check": result.range_check(),
            "clean": result.clean,
            "protocol": result.protocol,
        },
        claims=claims,
        params={
            "per_term": per_term.parameters,
            "protocol": result.protocol,
            "n_sequences": s["n_sequences"],
            "metrics": list(s["metrics"]),
            "n_boot": s["n_boot"],
        },
    )
