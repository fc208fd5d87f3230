"""Protocol 3's per-term endpoint in words (docs/faithfulness/v3/PROTOCOL.md): the lines a run prints
(:func:`norm_controlled_text`) and its README section (:func:`norm_controlled_markdown`), from the
``per_term_effects`` of its summary (:func:`geolens.faithfulness.norm_controlled_summary.norm_controlled_summary`).
:func:`geolens.pipelines.faithfulness_text.per_term_text` and ``per_term_markdown`` call them for a
protocol-3 run."""

from __future__ import annotations

from geolens.faithfulness.ground_truth import TERM_METRICS


def norm_controlled_text(part: dict) -> str:
    """The primary statistic and its family as printed lines."""
    nc = part["norm_controlled"]
    lines = [
        f"per-term endpoint, protocol 3 ({part['n_positions']} positions, {part['n_documents']} documents, "
        f"{part['n_terms']} terms; float64): mean partial Spearman with the KL given ||alpha v~|| [95% CI]"
    ]
    for m in sorted(nc["metrics"], key=lambda m: -m["mean"]):
        lines.append(f"  {m['metric']:<26} {m['mean']:+.3f} [{m['ci_low']:+.3f}, {m['ci_high']:+.3f}]")
    lines.append("pairs (one Holm family):")
    for p in nc["pairs"]:
        ci = "" if p.get("ci_low") is None else f" [{p['ci_low']:+.3f}, {p['ci_high']:+.3f}]"
        lines.append(f"  {p['a']} -> {p['b']}: {p['estimate']:+.3f}{ci}  {p['verdict']}")
    return "\n".join(lines)


def _num(x: float) -> str:
    """``+0.123``; a value that rounds to ±0.000 but is not 0 keeps two significant digits (``+0.00021``)."""
    text = f"{x:+.3f}"
    return f"{x:+.2g}" if x != 0 and text in ("+0.000", "-0.000") else text


def _in_words(metrics: list[dict]) -> str:
    """One sentence sorting the metrics by where their mean partial ρ's 95 % interval lies."""
    above = [m["metric"] for m in metrics if m["ci_low"] > 0]
    below = [m["metric"] for m in metrics if m["ci_high"] < 0]
    zero = [m["metric"] for m in metrics if m["ci_low"] == m["ci_high"] == 0]
    other = [m["metric"] for m in metrics if m["metric"] not in above + below + zero]
    parts = [
        f"predict the KL beyond the norm (interval above 0): {', '.join(above) or 'none'}",
        f"rank against it once the norm is fixed (interval below 0): {', '.join(below) or 'none'}",
        f"cannot be told from 0: {', '.join(other) or 'none'}",
        f"0 by construction: {', '.join(zero) or 'none'}",
    ]
    return "In words (per-metric 95 % intervals, before any correction): " + "; ".join(parts) + "."


def norm_controlled_markdown(summary: dict) -> str:
    """README.md section of a protocol-3 run, in words and tables."""
    part = summary["per_term_effects"]
    nc = part["norm_controlled"]
    fl = part["numerical_floor"]
    lines = [
        "## Per-term endpoint, controlled for the norm (protocol 3)",
        "",
        f"{part['n_positions']} (layer, query) positions of {part['n_documents']} documents, {part['n_terms']} attention "
        f"terms, each removed alone and its effect measured in float64 (the model cast to float64, softmax and RMS "
        f"norms in float64). The question: what does a metric predict about a term's KL that the norm "
        f"‖α ṽ‖ of the removed term (value-weighted attention) does not? Statistic: per position, the partial "
        f"Spearman correlation of the metric with the KL given the norm; mean over positions, 95 % "
        f"document-cluster bootstrap intervals (B = {nc['n_boot']}). Value-weighted and output-normalised inter "
        f"rank as the norm does, so theirs is 0 by construction.",
        "",
        _in_words(nc["metrics"]),
        "",
        "| metric | mean partial ρ | 95 % CI | protocol 2's plain ρ (float64) |",
        "|---|---|---|---|",
    ]
    plain = {m["metric"]: m for m in part["plain"]["metrics"]}
    for m in sorted(nc["metrics"], key=lambda m: -m["mean"]):
        p = plain.get(m["metric"])
        ptxt = f"{p['mean']:+.3f} [{p['ci_low']:+.3f}, {p['ci_high']:+.3f}]" if p else "–"
        lines.append(f"| {m['metric']} | {m['mean']:+.3f} | [{m['ci_low']:+.3f}, {m['ci_high']:+.3f}] | {ptxt} |")
    lines += [
        "",
        f"Pre-registered pairs a → b (Δ = mean partial ρ(b) − ρ(a), + = b predicts more beyond the norm), one Holm "
        f"family, intervals at each pair's Holm level; verdicts from the intervals. The claimed order "
        f"(raw < value-weighted < output-normalised < contribution) beyond the norm: "
        f"**{nc['claimed_order_beyond_norm']}**.",
        "",
        "| pair | Δ | interval | p_adj | verdict |",
        "|---|---|---|---|---|",
    ]
    for p in nc["pairs"]:
        ci = "–" if p.get("ci_low") is None else f"[{_num(p['ci_low'])}, {_num(p['ci_high'])}]"
        padj = "–" if p.get("p_adj") is None else f"{p['p_adj']:.3g}"
        lines.append(f"| {p['a']} → {p['b']} | {p['estimate']:+.3f} | {ci} | {padj} | {p['verdict']} |")
    for p in nc["not_testable"]:
        lines.append(f"| {p['a']} → {p['b']} | – | – | – | not testable ({p['why']}) |")
    res = part["resolvable"]
    lines += [
        "",
        f"**Numerical floor.** Per position, the first-order bound on a computed KL's error from the in-batch clean "
        f"row: median {fl['kl_floor_median']:.2g} nats (max {fl['kl_floor_max']:.2g}); the smallest effect of a "
        f"position has median {fl['kl_min_median']:.2g}, the largest {fl['kl_max_median']:.2g}. "
        f"{100 * res['share_of_terms']:.1f} % of the {res['n_terms']} terms are resolvable (KL ≥ "
        f"{res['factor']:.0f} × floor).",
        "",
        "Exploratory analyses (95 % intervals, no family, no verdict):",
        "",
        "| metric | strata ρ | resolvable partial | top-decile partial | signed partial (−Δ log p next) | magnitude partial |",
        "|---|---|---|---|---|---|",
    ]

    def cell(block: dict, metric: str) -> str:
        for m in block.get("metrics", []):
            if m["metric"] == metric:
                return f"{m['mean']:+.3f} [{m['ci_low']:+.3f}, {m['ci_high']:+.3f}] (n={m['n_positions']})"
        return "–"

    for m in TERM_METRICS:
        lines.append(
            f"| {m} | {cell(part['strata'], m)} | {cell(res['partial'], m)} | {cell(part['top_decile']['partial'], m)} "
            f"| {cell(part['signed']['partial'], m)} | {cell(part['signed']['magnitude']['partial'], m)} |"
        )
    thirds = [g for g in part["per_layer"]["groups"] if g["group"].startswith("layers ")]
    names = list(dict.fromkeys(g["group"] for g in thirds))
    lines += [
        "",
        "Per third of the stack (mean partial ρ, 95 % interval from a bootstrap over the (document, layer) "
        "clusters of the third; exploratory; `per_layer` in summary.json has every layer):",
        "",
        "| metric | "
        + " | ".join(f"{n} (n={next(g['n_positions'] for g in thirds if g['group'] == n)})" for n in names)
        + " |",
        "|---|" + "---|" * len(names),
    ]
    for m in TERM_METRICS:
        row = {g["group"]: g for g in thirds if g["metric"] == m}
        cells = [
            f"{row[n]['mean']:+.3f} [{row[n]['ci_low']:+.3f}, {row[n]['ci_high']:+.3f}]" if n in row else "–"
            for n in names
        ]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


__all__ = ["norm_controlled_markdown", "norm_controlled_text"]
