"""Report section: contribution flow through the whole model (docs/method.md §10).

Two parts, both from the flow pipeline (:mod:`geolens.pipelines.flow`) that ``geolens flow`` runs:

- the report's prompt (:func:`~geolens.pipelines.flow.prompt_flow`, as ``geolens flow "prompt"``):
  the top input tokens of its last prediction by contribution flow, ALTI and attention rollout,
  and the interactive information-flow routes of that prediction (contribution shares above 0.05);
- the input-token erasure test and the induction known-answer check
  (:func:`~geolens.pipelines.flow.run_flow`, the functions ``geolens flow --erasure`` runs per
  document under docs/flow/PROTOCOL.md), on the report's corpus windows, one window per cluster
  of the bootstrap. The report's windows and settings are not the protocol's, so the run is
  exploratory: its claims read indicative, with their sample.

Quick mode: the first :data:`QUICK_WINDOWS` corpus windows, the prediction at position 15 of each
(the protocol's first), the space replacement only, the methods without Value Zeroing rollout (it
reruns the model once per layer and source) and integrated gradients (8 forward and backward
passes per prediction at least): the three flows, gradient × input and random, with 1000 bootstrap
resamples; about 2 CPU-seconds per window on SmolLM2 (one thread). The full report:
the protocol's positions that fit the windows (15, 31, 63), both replacements (the unigram one
from the Lee corpus), every method, 2000 resamples, on up to 16 windows; the two gradient methods
start from the prefix-mean baseline (docs/flow/v2/PROTOCOL.md: version 1's started integrated
gradients from the erasure itself), and integrated gradients refines version 3's local grid
(docs/flow/v3/PROTOCOL.md) from 32 even steps until the completeness gap is within 1 % or at most 96
gradients (the protocol's 864 cost minutes per window on SmolLM2); the section states how many
predictions ended within 1 %.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from geolens.claims import counted, describe_sample, sample_size, table_verdict
from geolens.flow import ERASURE_METHODS, ErasureSettings
from geolens.pipelines.flow import LABELS, LISTED, PROTOCOL_MIN_DOCUMENTS, FlowParams, prompt_flow, run_flow
from geolens.report.document import Finding, Section
from geolens.viz.common import HTMLView

PROTOCOL_POSITIONS = (15, 31, 63)  # docs/flow/protocol.json, predictions.positions
THRESHOLD = 0.05  # least share of a route's edge (geolens flow's default)
TOP_K = 5
WINDOWS = "corpus windows"
# per window on SmolLM2 (64-token windows, the prediction at 15; CPU seconds, one thread): the flows, random and gradient ×
# input 2.1 s, integrated gradients 8 steps +1.7 s, Value Zeroing rollout +2.8 s: quick mode leaves out the last two
QUICK_LEFT_OUT = ("value_zeroing_rollout", "integrated_gradients")
IG_TOLERANCE, IG_MAX_STEPS = 0.01, 96  # full mode: docs/flow/v3's rule, capped at 96 gradients (section docstring)


def positions(seq_len: int, quick: bool) -> tuple[int, ...]:
    """The protocol's prediction positions that fit windows of ``seq_len`` tokens (the first one in
    quick mode), or the last position when none fits.

    >>> positions(40, quick=False), positions(64, quick=True), positions(12, quick=True)
    ((15, 31), (15,), (11,))
    """
    fit = tuple(p for p in PROTOCOL_POSITIONS if p < seq_len) or (seq_len - 1,)
    return fit[:1] if quick else fit


def params(ctx) -> FlowParams:
    seq_len = int(ctx.tokens.shape[1])
    if seq_len < 3:
        raise ValueError(f"the flow section needs windows of at least 3 tokens, got {seq_len}")
    if ctx.config.quick:
        methods = tuple(m for m in ERASURE_METHODS if m not in QUICK_LEFT_OUT)
        s = ErasureSettings(positions=positions(seq_len, True), methods=methods, replacements=("space",), n_boot=1000)
    else:
        s = ErasureSettings(
            positions=positions(seq_len, False),
            ig_steps=32,
            n_boot=2000,
            ig_baseline="prefix_mean",
            ig_tolerance=IG_TOLERANCE,
            ig_max_steps=IG_MAX_STEPS,
            ig_grid="local",
        )
    return FlowParams(erasure=s)


def ig_note(summary: dict, s: ErasureSettings) -> str:
    """What the section says of the gradient methods' baseline and integrated gradients'
    completeness (empty when integrated gradients did not run).

    >>> s = ErasureSettings(ig_baseline="prefix_mean", ig_tolerance=0.01, ig_max_steps=96, ig_grid="local")
    >>> ig_note({"n_predictions": 4, "ig_completeness": {"share_within_tolerance": 0.75, "max_steps_used": 96}}, s)
    '; the gradient methods start from the prefix-mean baseline (docs/flow/v2/PROTOCOL.md), and integrated gradients ended within 1% of completeness in 3 of 4 predictions (at most 96 gradients, local grid of docs/flow/v3/PROTOCOL.md)'
    """
    ic = summary.get("ig_completeness")
    if "integrated_gradients" not in s.methods or not ic:
        return ""
    base = (
        "the prefix-mean baseline (docs/flow/v2/PROTOCOL.md)"
        if s.ig_baseline == "prefix_mean"
        else "the erased prefix (docs/flow/PROTOCOL.md, version 1)"
    )
    n = int(summary["n_predictions"])
    if s.ig_tolerance is None:
        done = f"integrated gradients' median relative completeness gap is {ic['median_rel_gap']:.2g} at {s.ig_steps} steps"
    else:
        within = round(float(ic["share_within_tolerance"]) * n)
        done = (
            f"integrated gradients ended within {s.ig_tolerance:.0%} of completeness in {within} of {counted(n, 'prediction')} "
            + (
                f"(at most {int(ic['max_steps_used'])} steps)"
                if s.ig_grid == "even"
                else f"(at most {int(ic['max_steps_used'])} gradients, local grid of docs/flow/v3/PROTOCOL.md)"
            )
        )
    return f"; the gradient methods start from {base}, and {done}"


QUICK_WINDOWS = 3  # quick mode: the first 3 corpus windows (benchmarks/first_hour.py: the quick report within 45 s)


def n_windows(ctx) -> int:
    """The corpus windows the erasure test runs on: the first :data:`QUICK_WINDOWS` in quick mode,
    else up to 16 (each full-size window costs tens of CPU-seconds: three predictions, two
    replacements, every method)."""
    n = int(ctx.tokens.shape[0])
    return min(QUICK_WINDOWS, n) if ctx.config.quick else min(16, n)


def quick_sample(ctx) -> str:
    """What quick mode samples down here, in a few words (the report's quick-mode line)."""
    left_out = " and ".join(m.replace("_", " ") for m in QUICK_LEFT_OUT)
    return (
        f"the erasure test on {n_windows(ctx)} of {counted(int(ctx.tokens.shape[0]), 'window')}, one prediction each, "
        f"space replacement only, without {left_out}"
    )


@dataclass
class _RoutesComponent:
    """The routes' own HTML (:func:`geolens.viz.flow.flow_routes_html`) as a component of an
    :class:`~geolens.viz.common.HTMLView`, so that the report embeds it like its other views.
    The fragment is made once (its element id is random), so the page renders the same each time."""

    graph: object
    name: str = "FlowRoutes"
    props: dict = field(default_factory=dict)
    html: str = ""

    def __post_init__(self) -> None:
        from geolens.viz.flow import flow_routes_html

        self.html = flow_routes_html(self.graph)

    def markup(self) -> str:
        return self.html


def routes_view(graph) -> HTMLView:
    """The interactive routes of one prediction (hover a node: its sources and shares)."""
    words = graph.tokens
    title = f"Information-flow routes of the prompt's last prediction (position {graph.position}, {words[graph.position]!r})"
    return HTMLView([_RoutesComponent(graph)], title=title, data=graph.to_dict())


def _labelled(df: pd.DataFrame, columns: dict[str, str]) -> pd.DataFrame:
    """``df`` with the method-name columns ``columns`` (old → new name) read as labels."""
    out = df.rename(columns=columns).copy()
    for col in columns.values():
        out[col] = out[col].map(lambda m: LABELS.get(m, m))
    return out


def tables(run, sample: dict) -> dict[str, pd.DataFrame]:
    """The run's primary-family tables as the report shows them: nAOPC per method and direction,
    the pairs with their verdict under the claims rule (:func:`geolens.claims.table_verdict`;
    ``sample`` is the claims' sample, low-power for an exploratory run), and the induction check
    per method; with two replacements, each method's nAOPC difference between them (no verdict:
    the protocol fixes no rule for it)."""
    naopc, pairs = run.tables["naopc"], run.tables["pairs"]
    primary = naopc[naopc.family == "primary"][["direction", "method", "naopc", "ci_low", "ci_high"]]
    shown = pairs[pairs.family == "primary"]
    shown = shown.assign(verdict=[table_verdict(v, sample) for v in shown.verdict])
    keep = [
        c
        for c in ("direction", "a", "b", "delta", "ci_low", "ci_high", "level", "p_adj", "verdict")
        if c in shown.columns
    ]
    out = {
        "naopc": _labelled(primary, {"direction": "erasure", "method": "method"}),
        "pairs": _labelled(shown[keep], {"direction": "erasure", "a": "method_a", "b": "method_b"}),
    }
    if "replacements" in run.tables:
        r = run.summary["replacement_differences"]
        first, second = r["primary"], r["robustness"]
        moved = run.tables["replacements"][
            ["direction", "method", "naopc_primary", "naopc_robustness", "delta", "ci_low", "ci_high", "level", "p_adj"]
        ]
        moved = moved.rename(
            columns={
                "naopc_primary": f"nAOPC ({first})",
                "naopc_robustness": f"nAOPC ({second})",
                "delta": f"Δ {second} − {first}",
            }
        )
        out["replacements"] = _labelled(moved, {"direction": "erasure", "method": "method"})
    ic = run.summary.get("induction_check", {})
    if ic and "skipped" not in ic:
        rows = [
            dict(
                method=m,
                queries_checked=r["n"],
                passed=r["passed"],
                passed_no_bos=r["passed_no_bos"],
                median_rank_target=r["median_rank_target"],
                median_gap_when_failing=r["median_gap_when_failing"],
            )
            for m, r in ic.items()
        ]
        out["induction"] = _labelled(pd.DataFrame(rows), {"method": "method"})
    return out


def finding(run, sample: dict) -> list[Finding]:
    """The headline number: contribution flow against a random ranking under comprehensiveness
    (primary family), the pair's nAOPC difference in contribution flow's favour with its interval
    at the pair's Holm level."""
    pairs = run.tables["pairs"]
    rows = pairs[
        (pairs.family == "primary")
        & (pairs.direction == "comprehensiveness")
        & (pairs.a.isin(["contribution", "random"]) & pairs.b.isin(["contribution", "random"]))
        & (pairs.a != pairs.b)
    ]
    if not len(rows):
        return []
    p = rows.iloc[0]
    sign = 1.0 if p.b == "contribution" else -1.0
    lo, hi = sorted((sign * float(p.ci_low), sign * float(p.ci_high)))
    return [
        Finding(
            title="Contribution flow vs a random ranking: input-token erasure",
            what="how much more the prediction moves (KL, normalised AOPC) when the input tokens contribution flow "
            "ranks highest are erased than when random tokens are; above 0, contribution flow finds the tokens "
            "the prediction depends on better than chance",
            value=sign * float(p.delta),
            low=lo,
            high=hi,
            level=float(p.level),
            level_why=f"the level of the Holm step of this comparison among the {int((pairs.family == 'primary').sum())} "
            "primary tests, so that the family keeps a 5% error rate",
            n=int(sample["n_windows"]),
            units=sample["windows"],
            fmt="+.3g",
        )
    ]


def build(ctx, analyses: dict) -> Section:
    model = ctx.model
    p = params(ctx)
    s = p.erasure
    found = prompt_flow(model, ctx.prompt_tokens, LISTED, threshold=THRESHOLD, route_method="contribution")
    windows = ctx.tokens[: n_windows(ctx)]
    run = run_flow(model, windows, p, progress=ctx.progress)
    primary = run.summary["families"]["primary"]
    sample = sample_size(
        primary["n_documents"],
        windows=WINDOWS,
        minimum=PROTOCOL_MIN_DOCUMENTS,
        exploratory=run.status != "pre-registered",
    )
    shown = tables(run, sample)
    rc = run.summary["range_check"][s.primary]
    n_pred = int(run.summary["n_predictions"])
    size = (
        f"{counted(windows.shape[0], WINDOWS[:-1])} × {counted(len(s.positions), 'prediction')} (position{'s' if len(s.positions) > 1 else ''} "
        f"{', '.join(map(str, s.positions))}) = {counted(n_pred, 'prediction')}, {rc['excluded_kl']} out of range under the {s.primary} replacement; "
        f"{describe_sample(sample)} in range (the protocol asks for {PROTOCOL_MIN_DOCUMENTS} documents)"
    )
    methods = ", ".join(LABELS[m] for m in s.methods)
    intro = (
        "Which input tokens a prediction is made of, through every layer: each attention layer's mixing of positions, with the "
        "residual stream, is read from the exact decomposition of the residual after attention into per-source terms, and composed "
        "across layers (contribution flow; ALTI, Ferrando, Gállego & Costa-jussà 2022; attention rollout, Abnar & Zuidema 2020; "
        "Value Zeroing rollout, Mohebbi et al. 2023). The routes view shows, for the prompt's last prediction, every edge whose "
        f"contribution share exceeds {THRESHOLD:g} (Ferrando & Voita 2024's routes, with contribution shares); hover a node for its sources. "
        "The erasure test (DeYoung et al. 2020's comprehensiveness and sufficiency, docs/flow/PROTOCOL.md) replaces the input tokens "
        "a method ranks highest, or all but those, and measures KL(clean ‖ erased) of the next-token distribution; normalised AOPC "
        f"averages it over the fractions, divided by the KL of erasing every erasable token. Methods in this run: {methods}"
        + (" (integrated gradients: Sundararajan, Taly & Yan 2017)" if "integrated_gradients" in s.methods else "")
        + ig_note(run.summary, s)
        + f". Pairs are compared on document-cluster bootstrap resamples, one Holm family (Holm 1979) per replacement. Sample: {size}. "
        "Each window counts as one cluster here, although several windows can come from one article; the settings are not the "
        "protocol's, so every claim is indicative."
    )
    figures = [routes_view(found.routes)]
    if "naopc" in run.figures:
        figures.append(run.figures["naopc"]())
    table_list = [
        (
            f"top {TOP_K} input tokens of the prompt's last prediction, by method",
            _labelled(found.table(TOP_K), {"method": "method"}),
            "Share of the prediction's residual stream after the last layer that comes from each input position.",
        ),
        (
            f"normalised AOPC per method ({s.primary} replacement, KL; 95% CI over {WINDOWS})",
            shown["naopc"],
            "Comprehensiveness: larger is more faithful; sufficiency: smaller is more faithful.",
        ),
        (
            f"paired differences (b − a, + = b more faithful; Holm family of the {s.primary} replacement, KL)",
            shown["pairs"],
            "The interval is at the pair's Holm level; the verdict follows the claims rule (indicative below the protocol's sample).",
        ),
    ]
    if "replacements" in shown:
        moved = run.summary["replacement_differences"]
        table_list.append(
            (
                f"nAOPC under the {moved['robustness']} replacement minus under the {moved['primary']} one (KL, "
                f"{counted(moved['n_predictions'], 'prediction')} in range under both)",
                shown["replacements"],
                "The interval is at the test's Holm level (one family over methods and directions). The protocol fixes no rule "
                "for this comparison, so it decides nothing: the robustness claim is indicative.",
            )
        )
    if "induction" in shown:
        table_list.append(
            (
                "known-answer check: induction on a repeated random sequence",
                shown["induction"],
                "A query passes when its largest share outside itself is on the token that followed the first occurrence.",
            )
        )
    return Section(
        key="flow",
        title="Contribution flow",
        intro=intro,
        figures=figures,
        tables=table_list,
        numbers={
            "prompt": {
                "tokens": found.words,
                "position": found.position,
                "flow": {m: [float(v) for v in row.tolist()] for m, row in found.rows.items()},
                "top": found.top(TOP_K),
                "routes": found.routes.to_dict(),
            },
            "erasure": {k: v for k, v in run.summary.items() if k != "curves"},
            "naopc": run.tables["naopc"],
            "pairs": run.tables["pairs"],
            "curves": run.tables["curves"],
            "sample": sample,
        },
        claims=run.claims(windows=WINDOWS),
        params={
            "erasure": s.to_dict(),
            "n_windows": int(windows.shape[0]),
            "status": run.status,
            "threshold": THRESHOLD,
            "route_method": "contribution",
            "induction": {"n_tokens": p.induction_tokens, "seed": p.induction_seed},
        },
        findings=finding(run, sample),
    )
