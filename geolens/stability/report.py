"""The stability results in one table: ``stability.json`` and its README (:func:`render`)."""

from __future__ import annotations


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


__all__ = ["render"]
