"""Shared inputs of the report tests: the quick report of the tiny GQA model (every section, built
once for the package), the full report's faithfulness section, and helpers to read a section
(``tiny_inputs``, ``tiny_context``, ``report_section`` and ``section_json`` are imported as
``from report.conftest import ...``)."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest

from geolens.report import ReportConfig, build_report, write_report
from geolens.testing import tiny_tokens

TEXTS = ("the cat sat on the mat.", "a dog ran far away!!", "one two three")


def tiny_inputs(model):
    """The tiny report's windows and configuration (2 corpus windows, 1 held out, 16 tokens)."""
    tokens = tiny_tokens(model, TEXTS, length=16)
    config = ReportConfig(
        model="tiny-gqa", corpus="tiny", batch_size=2, n_heldout=1, prompt="the cat sat on the mat", quick=True
    )
    return tokens, config


def tiny_context(model):
    """The context every section of the tiny report was built with."""
    from geolens.report import ReportContext

    tokens, config = tiny_inputs(model)
    return ReportContext(model=model, tokens=tokens[:-1], heldout=tokens[-1:], config=config, progress=False)


@pytest.fixture(scope="package")
def tiny_report(tmp_path_factory):
    """(model, report, written paths) of the quick report on the tiny GQA model, every section."""
    from conftest import make_tiny

    model = make_tiny("gqa")
    tokens, config = tiny_inputs(model)
    report = build_report(model, tokens, config, progress=False)
    out = tmp_path_factory.mktemp("report")
    paths = write_report(report, out)
    return model, report, paths


@pytest.fixture(scope="package")
def report_files(tiny_report):
    """The tiny report as (report, its HTML page, its JSON)."""
    _, report, paths = tiny_report
    return report, paths["html"].read_text(encoding="utf-8"), json.loads(paths["json"].read_text())


@pytest.fixture(scope="package")
def full_faithfulness(tmp_path_factory):
    """The faithfulness section of a full (not quick) report on the tiny model: protocol 2's
    per-term endpoint, then protocol 1's superseded curves in an appendix."""
    from conftest import make_tiny

    model = make_tiny("gqa")
    tokens, config = tiny_inputs(model)
    config.quick, config.sections = False, ["faithfulness"]
    report = build_report(model, tokens, config, progress=False)
    return report, write_report(report, tmp_path_factory.mktemp("full"))


def section_json(paths, key: str, module: str) -> dict:
    """Section ``key`` of the report's JSON; skips the test when ``module`` is not installed (no such section)."""
    data = json.loads(paths["json"].read_text())
    if key not in data["sections"]:
        pytest.skip(f"{module} is not installed")
    return data["sections"][key]


def report_section(report, key: str):
    """Section ``key`` of a built report."""
    return next(s for s in report.sections if s.key == key)


# Reading the page: verdict cells, headers and legends of its tables

# Verdict words that need a CI-decided claim on enough data (geolens.claims), as the page and the
# command print them.
VERDICT = re.compile(r"\bholds\b|does not hold", re.IGNORECASE)


def verdict_cells(page: str) -> list[str]:
    """The text of the verdict column (the 4th cell) of every row of the page's claim table."""
    table = page.split('<section id="claims">', 1)[1].split("</section>", 1)[0]
    rows = re.findall(r"<tr><td>.*?</tr>", table, re.S)
    return [re.sub(r"<[^>]+>", "", re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)[3]) for row in rows]


IDENTIFIER = re.compile(r"^[a-z0-9]+(_[a-z0-9]+)+$")

NICKNAME = re.compile(r"\bpapers? [AB]\b", re.IGNORECASE)


class ParsedPage(HTMLParser):
    """The texts of every <th>, and the tables with what follows each table box."""

    def __init__(self):
        super().__init__()
        self.headers: list[str] = []
        self.text: list[str] = []  # visible text (no script, no style)
        self._th = None
        self._skip = 0
        self.events: list[str] = []  # "table-box", "legend" in page order

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("script", "style"):
            self._skip += 1
        if tag == "th":
            self._th = []
        if tag == "div" and "table-scroll" in (a.get("class") or ""):
            self.events.append("table-box")
        if tag == "p" and "table-legend" in (a.get("class") or ""):
            self.events.append("legend")

    def handle_endtag(self, tag):
        if tag in ("script", "style"):
            self._skip -= 1
        if tag == "th" and self._th is not None:
            self.headers.append("".join(self._th).strip())
            self._th = None

    def handle_data(self, data):
        if self._th is not None:
            self._th.append(data)
        if not self._skip:
            self.text.append(data)


def parse_page(page: str) -> ParsedPage:
    p = ParsedPage()
    p.feed(page)
    return p
