"""The report document (geolens.report.document): a self-contained page, the example heatmaps, the
first screen (findings and one figure before the claims), no verdict without an interval, no zero-
width or one-window interval, no superseded protocol in a quick report, parameters as small tables."""

from __future__ import annotations

import json
import re

import torch

from geolens.report import (
    render_html,
)
from geolens.viz.common import circuitsvis_bundle
from report.conftest import VERDICT, verdict_cells


def test_report_is_self_contained(tiny_report):
    _, report, paths = tiny_report
    page = paths["html"].read_text(encoding="utf-8")
    assert circuitsvis_bundle()[:5000] in page and page.count("var CircuitsVis") == 1
    assert not re.search(r"<script[^>]*\bsrc\s*=", page), "no script is fetched"
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", page), "no external resource"
    assert "unpkg.com" not in page
    assert 'src="data:image/png;base64,' in page
    assert page.count('class="geolens-circuitsvis"') >= 3
    for s in report.sections:
        assert f'<section id="{s.key}">' in page
    assert page == render_html(report)


def test_report_example_heatmaps_hold_the_prompt_contributions(tiny_report):
    model, report, _ = tiny_report
    import geolens

    section = next(s for s in report.sections if s.key == "contributions")
    heat = next(
        f for f in section.figures if getattr(f, "components", None) and f.components[0].name == "AttentionHeads"
    )
    prompt = model.to_tokens("the cat sat on the mat", prepend_bos=True)
    _, cache = model.run_with_cache(prompt)
    c = geolens.contribution_weights(model, cache, heat.data["layer"], mode="intra")[0]
    torch.testing.assert_close(heat.data["contribution"], c.double(), atol=1e-6, rtol=0)


def test_no_verdict_without_a_confidence_interval_in_the_page(tiny_report):
    _, report, paths = tiny_report
    page = paths["html"].read_text(encoding="utf-8")
    cells = verdict_cells(page)
    assert len(cells) == len(report.claims) and cells
    assert not [c for c in cells if VERDICT.search(c)], cells
    indicative = [c for c in cells if c.startswith("indicative (n = ")]
    assert "indicative (n = 2 corpus windows)" in cells and len(indicative) == sum(
        c.holds is not None or c.ci for c in report.claims
    )
    assert {c for c in cells if not c.startswith("indicative (n = ")} <= {"descriptive"}


def test_a_claim_decided_by_intervals_on_enough_windows_reads_its_verdict(tiny_report):
    """The other side of the rule, in the same page template: the verdict is shown when it is due."""
    from geolens.claims import Claim, sample_size
    from geolens.report import Report, Section

    _, report, _ = tiny_report
    claims = [
        Claim(
            "A is above B",
            "paper A §3.1",
            "Δ = +0.3 [+0.1, +0.5]",
            True,
            "95% CI above 0",
            {"sample": sample_size(64)},
            ci=True,
        ),
        Claim(
            "C is above D",
            "paper A §3.1",
            "Δ = −0.2 [−0.4, +0.1]",
            False,
            "95% CI above 0",
            {"sample": sample_size(64)},
            ci=True,
        ),
        Claim("E is above F", "paper A §3.1", "Δ = +0.3", True, "Δ > 0", {"sample": sample_size(64)}),  # no CI
        Claim(
            "G is above H",
            "paper A §3.1",
            "Δ = +0.3 [+0.1, +0.5]",
            True,
            "95% CI above 0",
            {"sample": sample_size(19)},
            ci=True,
        ),
    ]
    page = render_html(Report([Section("s", "S", "intro", claims=claims)], dict(report.params), dict(report.versions)))
    assert verdict_cells(page) == [
        "holds (n = 64 corpus windows)",
        "does not hold (n = 64 corpus windows)",
        "indicative (n = 64 corpus windows)",
        "indicative (n = 19 corpus windows)",
    ]
    assert '<span class="holds">holds (n = 64' in page and '<span class="fails">does not hold (n = 64' in page
    assert (
        'title="no confidence interval">indicative (n = 64' in page
        and 'title="below the minimum sample: 19 &lt; 20 corpus windows"' in page
    )


def _visible_text(page: str) -> str:
    """The page's text without its <head>, scripts, styles and tags (entities left as they are)."""
    body = page.split("</head>", 1)[1]
    body = re.sub(r"<(script|style)\b.*?</\1>", " ", body, flags=re.S)
    return re.sub(r"<[^>]+>", " ", body)


def test_first_screen_has_the_run_findings_and_one_figure_before_the_claims(tiny_report):
    from geolens.report.document import MAX_FINDINGS, headline

    _, report, paths = tiny_report
    page = paths["html"].read_text(encoding="utf-8")
    data = json.loads(paths["json"].read_text())
    first = page.split('<header id="first-screen">', 1)[1].split("</header>", 1)[0]
    assert page.index('<header id="first-screen">') < page.index('<section id="claims">')
    run = data["first_screen"]["run"]
    assert run["model"] == "tiny-gqa" and run["n_windows"] == 2 and run["n_tokens"] == 3 * 16
    for text in ("tiny-gqa", "2 windows × 16 tokens", "48 tokens", f"geolens {report.versions['geolens']}", "built in"):
        assert text in first, text
    findings = data["first_screen"]["findings"]
    assert 3 <= len(findings) <= MAX_FINDINGS and len(findings) == len(headline(report))
    items = re.findall(r'<li class="finding">(.*?)</li>', first, re.S)
    assert len(items) == len(findings)
    for item, f in zip(items, findings):
        assert f["estimate"] in item and f["sample"] in item and f'href="#{f["section"]}"' in item
        assert f"n = {f['n']} " in f["sample"]
        assert (f["ci_low"] is None) == ("[" not in f["estimate"])  # the JSON keeps the interval the page prints
    assert first.count("<img ") == 1  # one figure, a matplotlib one
    fig = data["first_screen"]["figure"]
    assert fig["title"] == data["sections"][fig["section"]]["figures"][fig["index"]]["title"]


INTERVAL = re.compile(r"\[([+\-−]?\d[\d.eE+\-−]*%?), ([+\-−]?\d[\d.eE+\-−]*%?)\]")


def test_no_interval_of_zero_width_or_from_one_window_is_printed(tiny_report):
    import pandas as pd

    from geolens.claims import Claim, sample_size
    from geolens.report import Report, Section
    from geolens.report.document import Finding, _interval_columns

    _, report, paths = tiny_report
    page, data = paths["html"].read_text(encoding="utf-8"), json.loads(paths["json"].read_text())
    intervals = INTERVAL.findall(_visible_text(page))
    assert intervals and not [(a, b) for a, b in intervals if a == b]
    for c in data["claims"]:
        if c["numbers"]["sample"]["n_windows"] < 2:
            assert not INTERVAL.search(c["measured"]), c["measured"]
    n_pairs = 0
    for key, section in data["sections"].items():  # the tables' interval columns, as shown (report.json = page)
        for caption, table in section["tables"].items():
            for lo, hi in _interval_columns(table["columns"]):
                for row in table["rows"]:
                    n_pairs += row[lo] is not None
                    assert row[lo] is None or f"{row[lo]:.4g}" != f"{row[hi]:.4g}", (key, caption, lo, row)
    assert n_pairs
    # a run on one window: the value with "n = 1, no interval", never [+0.214, +0.214]
    one = sample_size(1, windows="held-out windows")
    section = Section(
        "s",
        "S",
        "intro",
        claims=[Claim("X", "paper A §3.1", "Δ = +0.214 [+0.214, +0.214]", True, "CI > 0", {"sample": one}, ci=True)],
        tables=[("t", pd.DataFrame({"layer": [0, 1], "ci_low": [0.5, 0.1], "ci_high": [0.5, 0.3]}))],
        findings=[Finding("One window", "a difference", 0.214, 0.214, 0.214, 1, "held-out windows")],
    )
    small = Report([section], dict(report.params), dict(report.versions))
    page = render_html(small)
    text = _visible_text(page)
    assert "+0.214 (n = 1, no interval)" in text and "[+0.214, +0.214]" not in text
    assert "n = 1 held-out window, no interval" in text
    from geolens.report import report_json

    data = report_json(small)
    assert data["claims"][0]["measured"] == "Δ = +0.214 (n = 1, no interval)"
    rows = data["sections"]["s"]["tables"]["t"]["rows"]
    assert rows[0]["ci_low"] is None and rows[0]["ci_high"] is None and rows[1]["ci_low"] == 0.1
    [finding] = data["first_screen"]["findings"]
    assert finding["ci_low"] is None and finding["estimate"] == "+0.214"
    assert finding["sample"] == "n = 1 held-out window, no interval"


def test_quick_report_shows_no_superseded_protocol(tiny_report):
    _, report, paths = tiny_report
    page = paths["html"].read_text(encoding="utf-8")
    data = json.loads(paths["json"].read_text())
    assert not any(s.appendix for s in report.sections) and 'class="appendix"' not in page
    assert "faithfulness_protocol1" not in data["sections"]
    for key, section in data["sections"].items():
        assert not section["appendix"]
        labels = [f["title"] for f in section["figures"]] + list(section["tables"])
        labels += [c["claim"] for c in section["claims"]]
        assert not [t for t in labels if re.search(r"superseded|protocol 1|all-layer", t, re.I)], key
    faith = data["sections"]["faithfulness"]
    assert "curves" not in faith["numbers"] and "protocol" not in faith["params"]


def test_parameters_render_as_small_tables_not_json(tiny_report):
    from geolens.report.document import param_rows

    _, report, paths = tiny_report
    page = paths["html"].read_text(encoding="utf-8")
    assert "parameters: {" not in page
    tables = re.findall(r'<table class="params"><caption>(.*?)</caption>(.*?)</table>', page, re.S)
    captions = [c for c, _ in tables]
    assert "parameters of this run" in captions and "versions" in captions
    for s in report.sections:
        if not s.params:
            continue
        section = page.split(f'<section id="{s.key}"', 1)[1].split("</section>", 1)[0]
        [(caption, body)] = re.findall(r'<table class="params"><caption>(.*?)</caption>(.*?)</table>', section, re.S)
        assert caption.startswith("parameters (") and caption.endswith(" s)")
        cells = re.findall(r"<tr><td><code>(.*?)</code></td><td>(.*?)</td></tr>", body, re.S)
        assert len(cells) == len(param_rows(s.params)) and cells, s.key
        assert not [v for _, v in cells if re.search(r'[{}]|&#34;|"\s*:', v)], s.key  # no JSON in a cell
    assert param_rows({"a": {"b": 1, "c": [1, 2]}, "d": None, "e": True, "f": 0.25}) == [
        ("a.b", "1"),
        ("a.c", "1, 2"),
        ("d", "none"),
        ("e", "yes"),
        ("f", "0.25"),
    ]


def test_timing_lines_give_each_parts_wall_and_cpu(tiny_report):
    from geolens.report.document import timing_lines

    _, report, _ = tiny_report
    lines = timing_lines(report, 1.25, 2)
    assert lines[0].startswith("\nquick mode samples down: ") and "(quick run, 2 torch threads)" in lines[1]
    assert lines[3].startswith("model load") and lines[3].endswith("1.2 s")
    assert len(lines) == 5 + len(report.sections) and all(line.count(" s") == 2 for line in lines[5:])
