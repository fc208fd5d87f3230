"""The text ``geolens mc`` prints (geolens.pipelines.mc_text), from a hand-built summary and result:
the task table, the tasks excluded at chance, the Holm family's pairs and why an exploratory run
decides nothing."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pandas as pd

from geolens.pipelines.mc_text import mc_text

TASKS = pd.DataFrame(
    [
        dict(task="sure", n_questions=4, accuracy=1.0, ci_low=1.0, ci_high=1.0, chance=0.4583, eligible=True),
        dict(task="wrong", n_questions=4, accuracy=0.0, ci_low=0.0, ci_high=0.0, chance=0.4583, eligible=False),
    ]
)
PAIR = dict(a="raw_attention", b="contribution", estimate=0.123456, ci_low=0.01, ci_high=0.2, p=0.004, p_adj=0.02)


def _info(label: str, verdict: str, pairs=(PAIR,)) -> dict:
    return dict(
        excluded_tasks=[dict(task="wrong", accuracy=0.0, ci_low=0.0, ci_high=0.0, chance=0.4583, n_questions=4)],
        pairs=[dict(p, verdict=verdict, level=0.05) for p in pairs],
        n_questions_masked=4,
        label=label,
        differences=["model tiny-gqa is not one of the protocol's", "10 questions"],
    )


def test_a_preregistered_run_prints_its_tasks_exclusions_and_pairs():
    result = SimpleNamespace(tasks=TASKS, pairs=pd.DataFrame([PAIR]))
    text = mc_text(_info("pre-registered", "holds"), result)
    lines = text.splitlines()
    assert lines[0].split() == ["task", "n_questions", "accuracy", "ci_low", "ci_high", "chance", "eligible"]
    assert lines[1].split() == ["sure", "4", "1.000", "1.000", "1.000", "0.458", "True"]
    assert "excluded (at chance): wrong, accuracy 0.000 [0.000, 0.000], chance 0.458, n = 4" in lines
    assert "pairs (mean margin drop of b − a, 4 questions; Holm family):" in lines
    row = lines[lines.index("pairs (mean margin drop of b − a, 4 questions; Holm family):") + 2].split()
    assert row == ["raw_attention", "contribution", "0.1235", "0.01", "0.2", "0.004", "0.02", "holds"]
    assert "exploratory" not in text and not re.search(r"\bNone\b|\bnan\b", text)


def test_an_exploratory_run_says_why_and_a_clean_run_prints_no_pairs():
    clean = SimpleNamespace(tasks=TASKS, pairs=pd.DataFrame())
    text = mc_text(_info("exploratory", "not decided (exploratory)", pairs=()), clean)
    assert "pairs (" not in text
    assert text.splitlines()[-1] == (
        "exploratory run, no verdicts: model tiny-gqa is not one of the protocol's; 10 questions"
    )
