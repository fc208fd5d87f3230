"""The README's first screen: what geolens is, the quickstart, install, then a few findings, each
stable under the leave-one-out analysis and each number taken from a published results file.

Every number in the findings section must be a value of some published ``summary.json`` (or
``controls_summary.json``, ``corrected_family.json``, the stability results) rounded as printed,
and every finding must link the results it comes from.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FINDINGS = "## What holds"
RESULT_FILES = ("summary.json", "controls_summary.json", "corrected_family.json", "stability.json")


def _section(text: str, heading: str) -> str:
    return text.split(heading, 1)[1].split("\n## ", 1)[0]


def _leaves(x):
    if isinstance(x, dict):
        for v in x.values():
            yield from _leaves(v)
    elif isinstance(x, list):
        for v in x:
            yield from _leaves(v)
    elif isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x):
        yield float(x)


def published_values() -> list[float]:
    values = set()
    for name in RESULT_FILES:
        for path in (ROOT / "docs").rglob(name):
            values.update(_leaves(json.loads(path.read_text(encoding="utf-8"))))
    return sorted(values)


NUMBER = re.compile(r"(?<![\w.])[+−-]?\d+(?:\.\d+)?(?![\w.])")


def numbers_in(text: str) -> list[str]:
    """The numbers a reader sees in ``text``, links and code left out.

    >>> numbers_in("gradient × activation +0.212 [+0.197, +0.229] over 200 positions ([link](docs/a-2.md))")
    ['+0.212', '+0.197', '+0.229', '200']
    """
    text = re.sub(r"\]\([^)]*\)", "]", text)  # link targets
    text = re.sub(r"`[^`]*`", "", text)  # code
    return NUMBER.findall(text)


def matches(token: str, values: list[float]) -> bool:
    """Whether some published value prints as ``token`` (its decimals; a percentage also as a share)."""
    x = float(token.replace("−", "-"))
    decimals = len(token.split(".")[1]) if "." in token else 0
    half = 0.5 * 10**-decimals
    return any(abs(v - x) <= half + 1e-12 or abs(100 * v - x) <= half + 1e-12 for v in values)


def test_the_first_screen_leads_with_what_geolens_is_the_quickstart_and_install():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings[:3] == ["## Quickstart", "## Install", FINDINGS], headings[:4]
    intro = text.split("## Quickstart", 1)[0]
    assert not re.search(r"\d\.\d{3}", intro), "the introduction quotes no statistic"


def test_every_number_of_the_findings_is_in_a_published_results_file():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    findings = _section(text, FINDINGS)
    values = published_values()
    tokens = numbers_in(findings)
    assert len(tokens) >= 6
    missing = [t for t in tokens if not matches(t, values)]
    assert not missing, f"numbers in the README's findings that no published results file holds: {missing}"


def test_findings_are_few_and_each_links_its_results():
    findings = _section((ROOT / "README.md").read_text(encoding="utf-8"), FINDINGS)
    items = [line for line in findings.splitlines() if line.startswith("- ")]
    assert 3 <= len(items) <= 5
    paragraphs = findings.split("\n- ")[1:]
    for item in paragraphs:
        assert "](docs/" in item, f"a finding without its link: {item[:80]}"
    assert "fragile" in findings or "stable" in findings  # says how it was chosen
