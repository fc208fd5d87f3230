"""Report section: faithfulness of the attribution metrics (docs/method.md §3, docs/faithfulness/PROTOCOL.md).

Protocol 2's per-term endpoint (PROTOCOL.md §2), from the faithfulness pipeline's
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

Protocol 1's all-layer curves (superseded: every layer masked at once, which takes the model off
its distribution) are not part of this section: the full report shows them in an appendix
(:mod:`geolens.report.sections.faithfulness_protocol1`), the quick report not at all.

Every claim follows :mod:`geolens.claims`: it reads holds / does not hold only when decided by
intervals on at least :data:`geolens.claims.PROTOCOL_MIN_DOCUMENTS` documents, so a report's
claims read indicative, with their sample; the table of pairs shows its verdicts under the same
rule (:func:`geolens.claims.table_verdict`).
"""

from __future__ import annotations

import pandas as pd

from geolens.claims import PROTOCOL_MIN_DOCUMENTS, describe_sample, sample_size, table_verdict
from geolens.pipelines.faithfulness import PerTermParams, run_per_term
from geolens.report.document import Finding, Section

PER_TERM_WINDOWS = "corpus windows"


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


def finding(summary: dict, sample: dict) -> list[Finding]:
    """The headline number: mean Spearman ρ of contribution weights minus raw attention's (term
    scope, KL), the pre-registered pair's estimate with its interval at the pair's Holm level."""
    [pair] = [
        p
        for p in summary["pairs"]
        if (p["a"], p["b"], p["scope"], p["outcome"]) == ("raw_attention", "contribution", "term", "kl")
    ] or [None]
    if pair is None or pair.get("estimate") is None:
        return []
    return [
        Finding(
            title="Contribution weights vs raw attention against each term's measured effect",
            what="mean Spearman ρ with the per-term KL effects, contribution c minus raw attention α (+ = c agrees better)",
            value=float(pair["estimate"]),
            low=pair.get("ci_low"),
            high=pair.get("ci_high"),
            level=float(pair.get("level") or 0.95),
            n=int(sample["n_windows"]),
            units=sample["windows"],
        )
    ]


def build(ctx, analyses: dict) -> Section:
    if not ctx.config.quick:  # protocol 1, superseded: an appendix of the full report only
        from geolens.report.sections import faithfulness_protocol1

        ctx.shared.setdefault("appendix", []).append(faithfulness_protocol1.build)
    model = ctx.model
    pt_params = per_term_params(ctx)
    pt_windows = per_term_windows(ctx)
    per_term = run_per_term(model, pt_windows, pt_params, progress=ctx.progress)
    summary = per_term.summary
    pt_sample = sample_size(summary["n_documents"], windows=PER_TERM_WINDOWS, minimum=PROTOCOL_MIN_DOCUMENTS)
    pt_tables = per_term_tables(per_term, pt_sample)
    queries = pt_params.query_range(int(pt_windows.shape[1]))
    effects = summary["single_term_effects"]
    intro = (
        "Which attribution metric tells how much an attention term matters? The test (protocol 2, docs/faithfulness/PROTOCOL.md §2) "
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
        "Protocol 1 (every layer masked at once, superseded) is not shown here"
        + (": the full report has it in an appendix." if ctx.config.quick else "; it is in the appendix.")
    )
    return Section(
        key="faithfulness",
        title="Faithfulness",
        intro=intro,
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
        ],
        numbers={"per_term": summary, "per_term_sample": pt_sample},
        claims=per_term.claims(windows=PER_TERM_WINDOWS),
        params={"per_term": per_term.parameters},
        findings=finding(summary, pt_sample),
    )
