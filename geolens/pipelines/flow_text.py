"""The README of a ``geolens flow --erasure`` folder, in words, from its ``summary.json``
(:func:`erasure_markdown`): written by the command, read by nobody else. The pipeline itself is
:mod:`geolens.pipelines.flow`."""

from __future__ import annotations

from geolens.flow import DIRECTIONS
from geolens.pipelines.flow import LABELS


def erasure_markdown(summary: dict, *, title: str, command: str) -> str:
    """The README of a ``geolens flow --erasure`` folder, from its ``summary.json``: sample,
    range check, each method's nAOPC (KL, both replacements), the primary family's pairs with
    their Holm-level intervals and verdicts, the most faithful method per direction, the verdicts
    that change under the second replacement, integrated gradients' completeness and the
    known-answer check. Every number comes from ``summary``."""
    fams = summary["families"]
    primary = fams["primary"]
    robust = fams.get("robustness")
    ci = lambda e: f"{e['naopc']:.3f} [{e['ci_low']:.3f}, {e['ci_high']:.3f}]"  # noqa: E731
    lines = [
        f"# Input-token erasure: {title}",
        "",
        f"Command: `{command}` ({summary.get('seconds', '?')} s in this invocation; the per-document stage "
        f"{summary.get('erasure_seconds', '?')} s). Protocol: `{summary.get('protocol_path', 'docs/flow/protocol.json')}` "
        f"(version {summary.get('protocol_version', '?')}, sha256 `{str(summary.get('protocol_sha256', '?'))[:12]}…`), {summary.get('status', '?')}.",
        "",
    ]
    if summary.get("status") == "exploratory" and summary.get("differences"):
        lines += [f"**Exploratory run, no verdicts**: {'; '.join(summary['differences'])}.", ""]
    lines += [
        f"Sample: {summary['n_documents']} documents, {summary['n_predictions']} predictions. Range check (PROTOCOL.md §4): "
        + "; ".join(
            f"{r}: {c['excluded_kl']} of {c['n_predictions']} predictions excluded (KL)"
            for r, c in summary["range_check"].items()
        )
        + f". Intervals: document-cluster bootstrap; pairs are one Holm family of {len(primary['pairs'])} tests per replacement, each interval at its Holm level.",
        "",
        "Normalised AOPC of KL (comprehensiveness: higher = more faithful; sufficiency: lower = more faithful; 95% intervals, "
        f"n = {primary['n_predictions']} predictions from {primary['n_documents']} documents):",
        "",
        f"| method | comprehensiveness ({primary['replacement']}) | sufficiency ({primary['replacement']}) |"
        + (f" comprehensiveness ({robust['replacement']}) | sufficiency ({robust['replacement']}) |" if robust else ""),
        "|---|---|---|" + ("---|---|" if robust else ""),
    ]
    for m in dict.fromkeys(e["method"] for e in primary["methods"]):
        cells = []
        for fam in [primary] + ([robust] if robust else []):
            by = {e["direction"]: e for e in fam["methods"] if e["method"] == m}
            cells += [ci(by[d]) if d in by else "–" for d in DIRECTIONS]
        lines.append(f"| {LABELS.get(m, m)} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Primary family ({primary['replacement']} replacement, KL): Δ = nAOPC(b) − nAOPC(a), signed so that + favours b "
        "in each direction; interval at the pair's Holm level.",
        "",
        "| direction | a → b | Δ [interval] | level | p_adj | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for p in primary["pairs"]:
        lines.append(
            f"| {p['direction']} | {LABELS.get(p['a'], p['a'])} → {LABELS.get(p['b'], p['b'])} | {p['delta']:+.4f} "
            f"[{p['ci_low']:+.4f}, {p['ci_high']:+.4f}] | {p['level']:.4f} | {p['p_adj']:.3g} | {p['verdict']} |"
        )
    lines += [
        "",
        "Most faithful method (its pairs with every other method decided in its favour; its smallest margin):",
        "",
    ]
    for d in DIRECTIONS:
        b = summary.get("most_faithful", {}).get(d)
        lines.append(
            f"- {d}: "
            + (
                f"**{LABELS.get(b['method'], b['method'])}**, by at least {b['by']:+.4f} [{b['ci_low']:+.4f}, {b['ci_high']:+.4f}] "
                f"over {LABELS.get(b['against'], b['against'])}"
                if b
                else "no method beats every other"
            )
        )
    changes = summary.get("verdict_changes")
    if changes is not None:
        lines += [
            "",
            f"Verdicts that differ under the {robust['replacement'] if robust else 'second'} replacement: "
            + (
                "; ".join(
                    f"{c['direction']} {LABELS.get(c['a'], c['a'])} → {LABELS.get(c['b'], c['b'])}: {c['primary']} vs {c['robustness']}"
                    for c in changes
                )
                if changes
                else "none"
            )
            + ".",
        ]
    ig = summary.get("ig_completeness")
    if ig:
        lines += [
            "",
            f"Integrated gradients ({ig['n_steps']} steps): median |completeness gap| {ig['median_abs_gap']:.3g} "
            f"(median relative {ig['median_rel_gap']:.3g}; within 5% for {100 * ig['share_rel_gap_within_5pct']:.0f}% of predictions).",
        ]
        if ig.get("grid") == "local":  # docs/flow/v3: the local grid
            q = ig["steps_quantiles"]
            lines[-1] = (
                f"Integrated gradients on the local grid ({ig['n_steps']} even steps, then intervals split where the local "
                f"completeness error is largest, up to {ig['max_steps']} gradients; gradients used: median "
                f"{ig['median_steps']:.0f}, 10-90% {q['p10']:.0f}-{q['p90']:.0f}, at most {ig['max_steps_used']}; "
                f"{ig['total_gradients']} gradients and {ig['total_forward']} forward passes in all): within 1% of "
                f"completeness ({ig['rule']}) for {100 * ig['share_rel_gap_within_1pct']:.1f}% of predictions; "
                f"median |completeness gap| {ig['median_abs_gap']:.3g}."
            )
        elif "share_rel_gap_within_1pct" in ig:  # docs/flow/v2: adaptive steps
            lines[-1] = (
                f"Integrated gradients, adaptive steps ({ig['n_steps']} tripled up to {ig['max_steps']}; steps used: "
                + ", ".join(f"{k} × {v}" for k, v in ig["steps_used"].items())
                + f"): within 1% of completeness ({ig['rule']}) for {100 * ig['share_rel_gap_within_1pct']:.1f}% "
                f"of predictions; median |completeness gap| {ig['median_abs_gap']:.3g}."
            )
    ic = summary.get("induction_check")
    if ic and "skipped" not in ic:
        lines += [
            "",
            "Known-answer check (PROTOCOL.md §6; whole-model flow row of the second occurrence; pass = largest share outside "
            "the query on the token that followed the first occurrence):",
            "",
            "| method | pass | pass without BOS | median rank of that token | median gap when failing |",
            "|---|---|---|---|---|",
        ]
        for m, r in ic.items():
            lines.append(
                f"| {LABELS.get(m, m)} | {r['passed']}/{r['n']} | {r['passed_no_bos']}/{r['n']} | {r['median_rank_target']:g} | {r['median_gap_when_failing']:.3g} |"
            )
    elif ic:
        lines += ["", f"Known-answer check skipped: {ic['skipped']}"]
    lines += [
        "",
        "Files: `summary.json` (everything above), `naopc.csv`, `pairs.csv`, `curves.csv`, `replacements.csv`, `induction.csv`, "
        "`naopc.png`; per document: `erasure_conditions.csv.gz`, `erasure_predictions.csv.gz`, `erasure_rankings.csv.gz`.",
        "",
    ]
    return "\n".join(lines)
