"""The text ``geolens mc`` prints, from its run's summary and result (:mod:`geolens.pipelines.mc`)."""

from __future__ import annotations

import pandas as pd


def mc_text(info: dict, result) -> str:
    """Accuracy, CI, chance and eligibility per task, the tasks excluded at chance, the pairs of the
    Holm family (estimate, interval, p, p_adj, verdict) and, for an exploratory run, why it decides
    nothing; ``info`` is the run's ``summary.json``, ``result`` its
    :class:`~geolens.faithfulness.multiple_choice.MCResult`."""
    with pd.option_context("display.width", 200):
        lines = [result.tasks.to_string(index=False, float_format=lambda x: f"{x:.3f}")]
        for t in info["excluded_tasks"]:
            lines.append(
                f"excluded (at chance): {t['task']}, accuracy {t['accuracy']:.3f} [{t['ci_low']:.3f}, {t['ci_high']:.3f}], chance {t['chance']:.3f}, n = {t['n_questions']}"
            )
        if len(result.pairs):
            cols = ["a", "b", "estimate", "ci_low", "ci_high", "p", "p_adj", "verdict"]
            pairs = pd.DataFrame(info["pairs"])[cols]
            lines.append(f"pairs (mean margin drop of b − a, {info['n_questions_masked']} questions; Holm family):")
            lines.append(pairs.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    if info["label"] == "exploratory":
        lines.append("exploratory run, no verdicts: " + "; ".join(info["differences"]))
    return "\n".join(lines)
