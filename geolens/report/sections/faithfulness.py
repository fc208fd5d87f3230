"""Report section: faithfulness curves by causal masking (docs/method.md §3, paper A §2.3, §3.1).

The primary protocol of :mod:`geolens.faithfulness` (the default :class:`Protocol`): every layer
masked at once, ``query`` ranking (all (head, source) terms of a query ranked together on the
inter-head scale), sink and current token removable, every prediction after the first 8 positions
scored. It runs on the report's held-out windows (up to 8; in quick mode 1 window and
k ∈ {0.05, 0.5}) with every metric of :mod:`geolens.metrics` registered with ``default=True``, so
Value Zeroing is left out (one forward per source token) and a metric registered by the user takes
part. The claims are
decided by paired bootstrap CIs over documents, after the range check; with fewer than
:data:`geolens.faithfulness.MIN_DOCUMENTS` documents or without range they stay undecided.
"""

from __future__ import annotations

from geolens.faithfulness import CLAIMED_ORDER, CLAIMED_STEPS, FRACTIONS, MIN_DOCUMENTS, Protocol, claimed_order_holds, faithfulness_curves
from geolens.metrics import metric_names
from geolens.report.build import sample_size
from geolens.report.document import Claim, Section
from geolens.viz.faithfulness import faithfulness_curves_plot

ORDER = CLAIMED_ORDER
QUANTITY = "delta_logprob"  # mean Δ log-prob: linear in the NLL, so not dominated by the largest k as ΔPPL is


def settings(ctx) -> dict:
    """Run size; the metrics are every registered one with ``default=True`` (geolens.metrics), in registry order."""
    n = ctx.heldout.shape[0]
    metrics = metric_names(default_only=True)
    skip = min(8, max(0, ctx.heldout.shape[1] - 4))
    if ctx.config.quick:
        return {"n_sequences": min(1, n), "fractions": (0.05, 0.5), "n_boot": 200, "metrics": metrics, "chunk_size": 12, "skip_prefix": skip}
    return {"n_sequences": min(8, n), "fractions": FRACTIONS, "n_boot": 1000, "metrics": metrics, "chunk_size": 12, "skip_prefix": skip}


def _decided(order: dict) -> bool | None:
    """True/False when every step has a CI verdict; None (undecided) otherwise."""
    return bool(order["holds"]) if order["decided"] else None


def claims_from(pairs, range_check: dict) -> list[Claim]:
    comp = claimed_order_holds(pairs, "comprehensiveness", QUANTITY)
    suff = claimed_order_holds(pairs, "sufficiency", QUANTITY)
    steps = comp["steps"]
    gains = {f"{a} → {b}": steps[f"{a} < {b}"]["auc_diff"] for a, b in CLAIMED_STEPS if f"{a} < {b}" in steps}
    cos_step = "output_normalized → contribution"
    others = [k for k in gains if k != cos_step]
    if comp["decided"] and cos_step in gains and others:
        largest = max(gains, key=gains.get)
        # the alignment step must be the largest gain and its CI must exclude 0 (it "holds")
        alignment = largest == cos_step and steps["output_normalized < contribution"]["verdict"] == "holds"
    else:
        alignment = None
    why = "" if comp["decided"] else (
        f" (undecided: {'no range' if not range_check.get('has_range') else f'fewer than {MIN_DOCUMENTS} documents'})"
    )
    rc = f"range check: random ΔPPL at k = {range_check['max_fraction']}: {100 * (range_check.get('random_delta_ppl_rel_at_max_fraction') or 0):+.2f} %"
    return [
        Claim(
            claim="Faithfulness order raw attention < value-weighted < output-normalised < contribution weights (comprehensiveness)",
            source="paper A §3.1",
            measured="paired Δ log-prob AUC differences (b − a, + = b more faithful): "
            + ", ".join(f"{k}: {v['auc_diff']:+.3g} [{v['ci'][0]:+.3g}, {v['ci'][1]:+.3g}] {v['verdict']}" for k, v in steps.items())
            + f"; {rc}{why}",
            holds=_decided(comp),
            criterion="every step's paired 95% bootstrap CI over documents lies above 0, after the range check (random ranking moves PPL ≥ 1 %)",
            numbers={"steps": steps, "range_check": range_check},
        ),
        Claim(
            claim="The same order under sufficiency (removing the least important terms hurts least for contribution weights)",
            source="paper A §3.1",
            measured="pairs " + ", ".join(f"{k}: {v}" for k, v in suff["pairs"].items()) + why,
            holds=_decided(suff),
            criterion="every step's paired 95% CI of the sufficiency Δ log-prob AUC difference lies above 0, after the range check",
            numbers={"steps": suff["steps"]},
        ),
        Claim(
            claim="Alignment (the cosine factor) gives the largest single gain in faithfulness",
            source="paper A §3.1",
            measured="comprehensiveness Δ log-prob AUC gains per step: " + ", ".join(f"{k} {v:+.3g}" for k, v in gains.items()) + why,
            holds=alignment,
            criterion="the output-normalised → contribution step has the largest gain of the three and its paired CI lies above 0",
            numbers={"gains": gains},
        ),
    ]


def _with_sample(claims: list[Claim], sample: dict) -> list[Claim]:
    for c in claims:
        c.numbers["sample"] = sample
    return claims


def build(ctx, analyses: dict) -> Section:
    s = settings(ctx)
    protocol = Protocol(fractions=tuple(s["fractions"]), skip_prefix=s["skip_prefix"])
    result = faithfulness_curves(
        ctx.model, ctx.heldout[: s["n_sequences"]], protocol, s["metrics"],
        chunk_size=s["chunk_size"], seed=ctx.config.seed, progress=ctx.progress, n_boot=s["n_boot"],
    )  # fmt: skip
    auc = result.auc()
    pairs = result.pairs()
    rc = result.range_check()
    text = result.protocol_text()
    fig = faithfulness_curves_plot(result.curves, QUANTITY, subtitle=text)
    intro = (
        "Masking removes the terms α_ij ṽ_j that a metric ranks highest (comprehensiveness: a faithful metric "
        "hurts the model most) or lowest (sufficiency: hurts least), without renormalising α, in every layer at once; "
        "all (head, source) terms of a query are ranked together. "
        f"{text}. Verdicts: paired bootstrap over documents, holds / tie / reversed by the 95% CI of the AUC difference."
    )
    return Section(
        key="faithfulness",
        title="Faithfulness curves",
        intro=intro,
        figures=[fig],
        tables=[("paired AUC differences (b − a; + = b more faithful), 95% CI over documents", pairs),
                ("area under the curve (bootstrap 95% CI over documents)", auc)],  # fmt: skip
        numbers={"curves": result.curves, "auc": auc, "pairs": pairs, "range_check": rc, "clean": result.clean, "protocol": result.protocol},
        claims=_with_sample(claims_from(pairs, rc), sample_size(s["n_sequences"], windows="held-out windows")),
        params={"protocol": result.protocol, "n_sequences": s["n_sequences"], "metrics": list(s["metrics"]), "n_boot": s["n_boot"]},
    )
