"""The stability results in one table: ``stability.json`` and its README (:func:`render`)."""

from __future__ import annotations

import re


def _share(part) -> str:
    if part is None:
        return "n/a"
    flips = ", ".join(f"{v} {n}" for v, n in part["flips"].items())
    return f"{part['kept']}/{part['n']}" + (f" (→ {flips})" if flips else "")


def render(results: list[dict]) -> tuple[dict, str]:
    """``(combined, markdown)`` from the per-family results of :func:`geolens.stability.assess`."""
    combined = dict(
        plan="docs/stability/PROTOCOL.md",
        fragile_below=0.95,
        n_families=len(results),
        n_tests=sum(r["n_tests"] for r in results),
        n_fragile=sum(r["n_fragile"] for r in results),
        all_reproduce=all(r["reproduces"] for r in results),
        families=results,
    )
    lines = [
        "# Stability of the published verdicts",
        "",
        "Registered plan: [docs/stability/PROTOCOL.md](../PROTOCOL.md). Command: "
        "`python -m geolens.stability --out docs/stability/results` then `--render`. Each family is "
        "recomputed from its stored rows with one document (multiple choice: one question) left out, "
        "and with one layer left out where rows carry layers; a verdict kept in fewer than 95 % of "
        "either is **fragile**.",
        "",
        f"{combined['n_fragile']} of {combined['n_tests']} verdicts in {combined['n_families']} families are fragile. "
        f"Every family recomputes to its published verdicts with nothing left out: {'yes' if combined['all_reproduce'] else 'NO'}.",
        "",
    ]
    for r in results:
        lines += [
            f"## {r['family']}, {r['model']}",
            "",
            f"{r['n_units']} {r['unit']}s, "
            + (
                f"{r['n_layers']} layers"
                if r["n_layers"] is not None
                else f"layers: not applicable ({r['layers_not_applicable']})"
            )
            + f"; {r['n_fragile']} of {r['n_tests']} fragile.",
            "",
            f"| test | verdict | kept, {r['unit']}s left out | kept, layers left out | label |",
            "|---|---|---|---|---|",
        ]
        for t in r["tests"]:
            if t["label"] is None:
                lines.append(f"| {t['test']} | not testable | – | – | – |")
                continue
            lines.append(
                f"| {t['test']} | {t['verdict']} | {_share(t['documents'])} | {_share(t['layers'])} | "
                + ("**fragile**" if t["label"] == "fragile" else "stable")
                + " |"
            )
        lines.append("")
    return combined, "\n".join(lines)


MARKER = re.compile(r"(<!-- stability: (?P<family>[^>]+?) -->\n)(?P<body>.*?)(<!-- /stability -->)", re.S)
MODEL_NAMES = {"smollm2-135m": "SmolLM2-135M", "gemma3-270m": "Gemma 3 270M"}


def stability_paragraph(combined: dict, family: str) -> str:
    """One paragraph on ``family``'s stability for each model: how many verdicts are fragile, and
    each fragile one with the shares kept and what it flips to."""
    parts = []
    for entry in combined["families"]:
        if entry["family"] != family:
            continue
        model = MODEL_NAMES.get(entry["model"], entry["model"])
        fragile = [t for t in entry["tests"] if t["label"] == "fragile"]
        if not fragile:
            parts.append(f"on {model}, all {entry['n_tests']} verdicts are stable")
            continue
        items = []
        for t in fragile:
            kept = [f"{t['documents']['kept']}/{t['documents']['n']} {entry['unit']} leave-outs"]
            if t["layers"] is not None:
                kept.append(f"{t['layers']['kept']}/{t['layers']['n']} layer leave-outs")
            flips = sorted({v for part in (t["documents"], t["layers"]) if part for v in part["flips"]})
            items.append(f"{t['test']} ({t['verdict']}; kept in {' and '.join(kept)}; else {', '.join(flips)})")
        parts.append(f"on {model}, {len(fragile)} of {entry['n_tests']} verdicts are fragile: " + "; ".join(items))
    if not parts:
        return ""
    return (
        "**Stability** (one document or one layer left out, [registered plan](stability/PROTOCOL.md), "
        "[all families](stability/results/README.md)): " + "; ".join(parts) + ".\n"
    )


def fill_markers(text: str, combined: dict) -> str:
    """``text`` with each ``<!-- stability: FAMILY -->`` … ``<!-- /stability -->`` block refilled
    by :func:`stability_paragraph` (docs/results.md carries them beside each family's verdicts)."""
    return MARKER.sub(lambda m: m.group(1) + stability_paragraph(combined, m.group("family")) + m.group(4), text)


__all__ = ["fill_markers", "render", "stability_paragraph"]
