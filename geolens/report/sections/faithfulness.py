"""Report section: faithfulness of the attribution metrics (docs/method.md §3, docs/faithfulness/v3/PROTOCOL.md).

Protocol 3's per-term endpoint, from :func:`~geolens.pipelines.norm_controlled.run_norm_controlled`
(the functions ``geolens faithfulness --protocol docs/faithfulness/v3/protocol.json --stage
per_term`` runs): for (layer, query) positions drawn per window as the protocol draws them, the
exact effect of removing each attention term alone (KL of the next-token distribution, the model in
float64 for the section and back in its own dtype afterwards), and per metric the mean over
positions of the partial Spearman correlation of its scores with those effects given the norm
‖α_ij^h ṽ_j^h‖ of the removed term, with a document-cluster bootstrap CI, the pre-registered pairs
as one Holm family, and protocol 2's plain Spearman on the same effects beside it. It runs on the
report's corpus windows, each window a cluster: in quick mode 1 position per window (8 positions on
the 8 corpus windows of ``geolens report --quick``), otherwise 1 position on each of up to 24
windows; 1000 bootstrap resamples in quick mode, the protocol's 10 000 otherwise. Measured once
each, one torch thread, on the project's 2-core machine shared with other jobs (load average about
8): the quick section on tiny-gqa's test report (2 windows of 16 tokens, 2 positions, 76 terms)
0.5 s; on SmolLM2-135M's 8 quick windows of 64 tokens (8 positions, 1917 terms, float64) 30.6
CPU-seconds, 78 s of wall time under that load (protocol 2's float32 version took about 12
CPU-seconds there). Not measured here: the full report's 24 positions on 128-token windows, at
protocol 3's own timing of about 17 s per SmolLM2 position of average size (PROTOCOL.md §8), would
take about 7 minutes (24 positions, not protocol 2's 64, to keep the full report near its former
length).

What changed from protocol 2 (which this section ran before): the plain ρ mostly ranks the norm
(value-weighted attention is the norm of the removed vector, and the KL of a small removal is second
order in it), and float32 rounding moved the per-position ρ by as much as the differences between
metrics; protocol 3 asks what a metric predicts beyond the norm, in float64 (PROTOCOL.md, "Why a new
version"). For context only, the section quotes the published protocol-3 run
(``docs/faithfulness/v3/<model>/summary.json``) when the report's model is one of the protocol's.

Protocol 1's all-layer curves (superseded: every layer masked at once, which takes the model off
its distribution) are not part of this section: the full report shows them in an appendix
(:mod:`geolens.report.sections.faithfulness_protocol1`), the quick report not at all.

Every claim follows :mod:`geolens.claims`: it reads holds / does not hold only when decided by
intervals on at least :data:`geolens.claims.PROTOCOL_MIN_DOCUMENTS` documents in a run under the
protocol's settings; the report's windows, positions and bootstrap differ from the protocol's, so
the run is exploratory and its claims read indicative, with their sample; the table of pairs shows
its verdicts under the same rule (:func:`geolens.claims.table_verdict`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from geolens.claims import PROTOCOL_MIN_DOCUMENTS, counted, describe_sample, estimate_text, sample_size, table_verdict
from geolens.pipelines.norm_controlled import NormControlledParams, run_norm_controlled
from geolens.report.document import Finding, Section

PER_TERM_WINDOWS = "corpus windows"
PROTOCOL_TEXT = "docs/faithfulness/v3/PROTOCOL.md"
PUBLISHED = Path(__file__).resolve().parents[3] / "docs" / "faithfulness" / "v3"
PROTOCOL_MODELS = ("smollm2-135m", "gemma3-270m")  # docs/faithfulness/v3/protocol.json, data.models


def per_term_params(ctx) -> NormControlledParams:
    """Protocol 3's per-term endpoint at report size (module docstring)."""
    if ctx.config.quick:
        return NormControlledParams(n_positions=1, n_boot=1000, seed=ctx.config.seed)
    return NormControlledParams(n_positions=1, n_boot=10_000, seed=ctx.config.seed)


QUICK_WINDOWS = 3  # quick mode: the first 3 corpus windows (benchmarks/first_hour.py: the quick report within 45 s)


def per_term_windows(ctx):
    """The corpus windows the per-term endpoint runs on: the first :data:`QUICK_WINDOWS` in quick
    mode (each costs a float64 removal of every term of one position), else up to 24."""
    return ctx.tokens[:QUICK_WINDOWS] if ctx.config.quick else ctx.tokens[:24]


def quick_sample(ctx) -> str:
    """What quick mode samples down here, in a few words (the report's quick-mode line)."""
    n = int(per_term_windows(ctx).shape[0])
    return (
        f"per-term effects on {n} of {counted(int(ctx.tokens.shape[0]), 'window')}, one position each, 1000 resamples"
    )


def per_term_tables(run, sample: dict) -> dict[str, pd.DataFrame]:
    """The tables as the report shows them: per metric the mean partial Spearman given the norm
    (95% CI, positions, windows) with protocol 2's plain Spearman beside it; the Holm family's
    pairs with their verdict under the claims rule (an exploratory run decides none) and the plain
    Δ beside each."""
    metrics = run.tables["metrics"]
    shown = ["metric", "partial_spearman", "ci_low", "ci_high", "n_positions", "n_documents"]
    shown += ["n_excluded_positions", "plain_spearman", "plain_ci_low", "plain_ci_high"]
    pairs = run.tables["pairs"]
    keep = [
        c
        for c in ("a", "b", "estimate", "ci_low", "ci_high", "level", "p_adj", "verdict", "plain_estimate")
        if c in pairs.columns
    ]
    verdicts = [table_verdict(v, sample, decided=False) for v in pairs.verdict] if len(pairs) else []
    pairs = pairs[keep].assign(verdict=verdicts) if len(pairs) else pairs[keep]
    return {"metrics": metrics[shown].reset_index(drop=True), "pairs": pairs.reset_index(drop=True)}


def published(model_name: str, root: Path = PUBLISHED) -> dict | None:
    """The published protocol-3 run of ``model_name`` (its ``summary.json``: the metrics' mean partials
    with their intervals and n, the claimed order's verdict), or None when the model is not one of the
    protocol's or the file is not there (an installed package has no docs/)."""
    path = root / str(model_name) / "summary.json"
    if model_name not in PROTOCOL_MODELS or not path.is_file():
        return None
    summary = json.loads(path.read_text(encoding="utf-8"))
    part = summary["per_term_effects"]
    nc = part["norm_controlled"]
    return dict(
        path=path.relative_to(root.parents[2]).as_posix(),
        label=summary.get("label"),
        n_positions=int(part["n_positions"]),
        n_documents=int(part["n_documents"]),
        metrics={m["metric"]: dict(mean=m["mean"], ci_low=m["ci_low"], ci_high=m["ci_high"]) for m in nc["metrics"]},
        claimed_order_beyond_norm=nc.get("claimed_order_beyond_norm"),
        stability=published_stability("protocol 3 per-term", model_name, root.parents[1] / "stability" / "results"),
    )


def published_stability(family: str, model_name: str, results: Path) -> dict | None:
    """The leave-one-out stability of a published family (``docs/stability/results/stability.json``,
    :mod:`geolens.stability`): its number of verdicts and the fragile ones, None without the file."""
    path = results / "stability.json"
    if not path.is_file():
        return None
    for entry in json.loads(path.read_text(encoding="utf-8"))["families"]:
        if entry["family"] == family and entry["model"] == model_name:
            fragile = [t["test"] for t in entry["tests"] if t["label"] == "fragile"]
            return dict(n_tests=int(entry["n_tests"]), fragile=fragile)
    return None


def published_text(pub: dict | None) -> str:
    """One sentence quoting the published run, for context ("" without one)."""
    if pub is None:
        return ""
    m = pub["metrics"]

    def ci(name: str) -> str:
        x = m[name]
        return f"{x['mean']:+.3f} [{x['ci_low']:+.3f}, {x['ci_high']:+.3f}]"

    return (
        f" For context, the published protocol-3 run on this model ({pub['path']}, {pub['label']}, n = "
        f"{counted(pub['n_positions'], 'position')} of {counted(pub['n_documents'], 'Lee document')}, 128-token windows): mean partial ρ "
        f"of c {ci('contribution')}, of |c| {ci('contribution_abs')}, of gradient × activation {ci('grad_x_act')}, "
        f"of raw attention {ci('raw_attention')}; the claimed order beyond the norm: "
        f"{pub['claimed_order_beyond_norm']}. Those numbers are the published run's, not this report's."
        + _stability_text(pub.get("stability"))
    )


def _stability_text(stab: dict | None) -> str:
    if stab is None:
        return ""
    if not stab["fragile"]:
        return f" Each of its {stab['n_tests']} Holm verdicts survives leaving out any one document or layer (docs/stability)."
    return (
        f" {len(stab['fragile'])} of its {stab['n_tests']} Holm verdicts are fragile, changing when one document or one "
        f"layer is left out (docs/stability): {'; '.join(stab['fragile'])}."
    )


def finding(summary: dict, sample: dict) -> list[Finding]:
    """The headline number: the mean partial Spearman ρ of contribution weights c with the per-term KL
    given the norm (what c predicts beyond it; protocol 3's pair output-normalised inter →
    contribution, whose Δ it is), with its 95% interval over the windows."""
    [row] = [m for m in summary["norm_controlled"]["metrics"] if m["metric"] == "contribution"] or [None]
    if row is None or row.get("mean") is None:
        return []
    return [
        Finding(
            title="Contribution weights beyond the norm, against each term's measured effect",
            what="mean partial Spearman ρ of contribution weights c with the per-term KL given the norm ‖α ṽ‖ "
            f"(float64; + = c predicts the effect beyond the norm, 0 = nothing beyond it; {counted(row['n_positions'], 'position')})",
            value=float(row["mean"]),
            low=row.get("ci_low"),
            high=row.get("ci_high"),
            n=int(sample["n_windows"]),
            units=sample["windows"],
        )
    ]


def intro_text(summary: dict, params: NormControlledParams, sample: dict, queries, quick: bool, pub) -> str:
    """The section's opening: the test, what changed from protocol 2, the sample, this run's headline."""
    [c] = [m for m in summary["norm_controlled"]["metrics"] if m["metric"] == "contribution"]
    fl = summary["numerical_floor"]
    head = estimate_text(c["mean"], c["ci_low"], c["ci_high"], sample["n_windows"])
    return (
        "Which attribution metric tells how much an attention term matters? The test (protocol 3, "
        f"{PROTOCOL_TEXT}) removes each term α_ij^h ṽ_j^h of a (layer, query) position alone, everything else clean, "
        "measures KL(clean ‖ removed) of the next-token distribution in float64, and asks per position what each "
        "metric's scores predict about those measured effects beyond the norm ‖α_ij^h ṽ_j^h‖ of the removed term: the "
        "partial Spearman correlation with the KL given the norm, averaged over positions (document-cluster bootstrap "
        "CIs; the pre-registered pairs as one Holm family, Holm 1979). <b>What changed from protocol 2</b> "
        "(docs/faithfulness/PROTOCOL.md §2, which this section ran before): protocol 2 scored a metric by its plain "
        "Spearman correlation with the KL, but value-weighted attention (Kobayashi et al. 2020) is the norm of the "
        "removed vector and the KL of a small removal is second order in it, so the plain ρ mostly ranks the norm (under "
        "protocol 2 the norm alone ranked the effects at ρ = 0.98 on SmolLM2); and protocol 2 measured the effects in float32, whose rounding moved "
        "the per-position ρ by as much as the differences between metrics it reported. So protocol 3 asks what a "
        "metric predicts beyond the norm, in float64. Value-weighted attention and its output normalisation per layer "
        "(inter) rank the terms as the norm does, so their partial ρ is 0 by construction; the plain ρ (protocol 2's "
        "statistic, on the same float64 effects) stands beside it for comparison. Metrics: raw attention, "
        "value-weighted attention, its output normalisation per head (intra) and per layer (inter), contribution "
        "weights c (Cunningham & Muça Cirone 2026) signed and |c|, gradient × activation (attribution patching, Syed "
        "et al. 2023) and random scores; Value Zeroing (Mohebbi et al. 2023) scores sources and is not part of "
        f"protocol 3. Sample: {counted(summary['n_positions'], 'position')} ({counted(summary['n_terms'], 'term')}), {params.n_positions} per "
        f"window drawn with the layer uniform and the query uniform in {queries[0]} … {queries[1]}, "
        f"{describe_sample(sample)}, each window one cluster; median numerical floor of the KL "
        f"{fl['kl_floor_median']:.2g} nats, {100 * summary['resolvable']['share_of_terms']:.0f} % of the terms resolvable "
        f"(KL ≥ 10³ × floor). The protocol fixes {PROTOCOL_MIN_DOCUMENTS} documents of 128 tokens, so this run is "
        f"exploratory and every verdict here indicative. This run: mean partial ρ of c {head}."
        + published_text(pub)
        + " Protocol 1 (every layer masked at once, superseded) is not shown here"
        + (": the full report has it in an appendix." if quick else "; it is in the appendix.")
    )


def build(ctx, analyses: dict) -> Section:
    if not ctx.config.quick:  # protocol 1, superseded: an appendix of the full report only
        from geolens.report.sections import faithfulness_protocol1

        ctx.shared.setdefault("appendix", []).append(faithfulness_protocol1.build)
    params = per_term_params(ctx)
    windows = per_term_windows(ctx)
    run = run_norm_controlled(ctx.model, windows, params, progress=ctx.progress)
    summary = run.summary
    sample = sample_size(
        summary["n_documents"], windows=PER_TERM_WINDOWS, minimum=PROTOCOL_MIN_DOCUMENTS, exploratory=True
    )
    tables = per_term_tables(run, sample)
    pub = published(ctx.config.model)
    numbers = {"norm_controlled": summary, "norm_controlled_sample": sample}
    if pub is not None:
        numbers["published"] = pub
    queries = params.query_range(int(windows.shape[1]))
    return Section(
        key="faithfulness",
        title="Faithfulness",
        intro=intro_text(summary, params, sample, queries, ctx.config.quick, pub),
        tables=[
            (
                f"per-term endpoint (protocol 3): mean partial Spearman ρ with the KL given the norm ‖α ṽ‖, 95% CI over "
                f"{PER_TERM_WINDOWS}; protocol 2's plain ρ beside it",
                tables["metrics"],
                "Primary statistic of protocol 3, term scope; the plain ρ mostly ranks the norm.",
            ),
            (
                "per-term endpoint (protocol 3): pre-registered pairs (Δ = partial ρ(b) − partial ρ(a), + = b predicts "
                "more beyond the norm; one Holm family)",
                tables["pairs"],
                "The interval is at the pair's Holm level; the verdict follows the claims rule; the plain Δ decides nothing.",
            ),
        ],
        numbers=numbers,
        claims=run.claims(windows=PER_TERM_WINDOWS, exploratory=True),
        params={"norm_controlled": run.parameters},
        findings=finding(summary, sample),
    )
