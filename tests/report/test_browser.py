"""The generated report in a real browser: headless Debian ``chromium`` renders every circuitsvis view.

Skipped, with the reason, only when no ``chromium`` binary is installed
(``bash scripts/install.sh --browser`` installs it; CI does). The report is built on a tiny random
model so that the test stays fast; the page is the same code path as ``geolens report``.

Every launch goes through :func:`chromium.run_chromium` (tests/chromium.py): one module-wide profile, warmed once, a
``TIMEOUT``-second limit per launch with the whole process group killed when it is reached (a
renderer left behind can otherwise hold the output pipes open and block the test), and one retry
with a fresh profile when a launch times out, fails or writes nothing. A page that renders wrongly
is not retried: only a launch that produced no output is.
"""

from __future__ import annotations

import re
import time

import pytest
import torch
from chromium import CHROMIUM, run_chromium

from geolens.report import ReportConfig, build_report, write_report
from geolens.testing import tiny_tokens

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (bash scripts/install.sh --browser)"),
    pytest.mark.tl_agnostic,  # rendering in a browser: .venvs/min runs it on TransformerLens 2.x (scripts/test.sh)
]


@pytest.fixture(scope="module")
def report_page(tmp_path_factory):
    from conftest import make_tiny

    model = make_tiny("gqa")
    tokens = tiny_tokens(model, ("the cat sat on the mat.", "a dog ran far away!!"), length=16)
    config = ReportConfig(
        model="tiny-gqa", corpus="tiny", batch_size=2, n_heldout=1, prompt="the cat sat on the mat", quick=True
    )
    report = build_report(model, tokens, config, progress=False)
    out = tmp_path_factory.mktemp("browser")
    return report, write_report(report, out)["html"], out


def _components(report) -> list:
    # circuitsvis components only: the flow section's routes view is plain HTML, with no React root
    return [c for s in report.sections for f in s.figures for c in getattr(f, "components", []) if hasattr(c, "id")]


def test_every_circuitsvis_component_renders(report_page, tmp_path):
    report, page, _ = report_page
    run = run_chromium(page, "--dump-dom")
    dom = run.stdout
    assert run.returncode == 0 and "</html>" in dom, run.stderr[-2000:]
    components = _components(report)
    assert components
    for comp in components:
        # the (initially empty) div must now hold the React tree
        m = re.search(rf'<div id="{comp.id}"[^>]*>(.*?)</div>\s*<script>', dom, re.S)
        assert m and len(m.group(1)) > 200, f"{comp.name} {comp.id} did not render"
        if comp.name == "AttentionHeads":
            n_heads = len(comp.props["attention"])
            assert m.group(1).count("<canvas") >= n_heads + 1  # one per head + the zoomed one
            for name in comp.props["attentionHeadNames"]:
                assert name in m.group(1)
        if comp.name == "ColoredTokens":
            assert 'class="colored-tokens"' in m.group(1)
            assert m.group(1).count("background-color: rgb(") >= len(comp.props["tokens"])


def test_screenshot_is_not_blank_and_shows_both_signs(report_page, tmp_path):
    from matplotlib.image import imread

    _, page, out = report_page
    shot = out / "report.png"
    run = run_chromium(page, f"--screenshot={shot}", "--window-size=1280,2400")
    assert run.returncode == 0 and shot.exists(), run.stderr[-2000:]
    img = torch.tensor(imread(shot)[..., :3])  # floats in [0, 1]
    assert img.shape[0] >= 2000 and img.shape[1] >= 1200
    non_white = (img < 0.95).any(-1).double().mean().item()
    assert non_white > 0.05, f"only {non_white:.1%} of the page is not white"
    # both signs in the contribution section's views (the claim table above it fills the first
    # 2400 pixels of the whole page, and the red of a "does not hold" verdict must not count)
    view = _section_only(page, "contributions", tmp_path / "contributions.html")
    shot = tmp_path / "contributions.png"
    run = run_chromium(view, f"--screenshot={shot}", "--window-size=1280,2400")
    assert run.returncode == 0 and shot.exists(), run.stderr[-2000:]
    red, blue = _red_blue(shot)
    assert blue > 2000 and red > 200, (red, blue)


def _red_blue(shot) -> tuple[int, int]:
    """Pixels tinted red (negative values, mixed with white) and tinted blue (positive values)."""
    from matplotlib.image import imread

    img = torch.tensor(imread(shot)[..., :3])
    r, g, b = img.unbind(-1)
    red = (r > 0.85) & (r - g > 0.2) & (r - b > 0.2)
    blue = (b > 0.85) & (b - g > 0.2) & (b - r > 0.05)
    return red.sum().item(), blue.sum().item()


def test_negative_values_are_drawn_red(tmp_path):
    """The same heatmap with and without a negative cell: only the signed one adds red pixels."""
    from geolens.viz import signed_heatmaps

    signed = torch.tensor([[[1.0, 0.0, 0.0], [-0.8, 1.8, 0.0], [0.6, -0.9, 1.3]]])
    counts = {}
    for name, values in (("signed", signed), ("positive", signed.abs())):
        page = signed_heatmaps(values, ["a", "b", "c"], head_names=["demo"]).save(tmp_path / f"{name}.html")
        shot = tmp_path / f"{name}.png"
        run = run_chromium(page, f"--screenshot={shot}", "--window-size=1000,1000")
        assert run.returncode == 0 and shot.exists(), run.stderr[-2000:]
        counts[name] = _red_blue(shot)
    (red_s, blue_s), (red_p, blue_p) = counts["signed"], counts["positive"]
    assert red_s > red_p + 5000, counts  # two saturated negative cells of the zoomed heatmap
    assert blue_p > blue_s, counts


def _section_only(page, key: str, dest):
    """A copy of the report page that shows only the figures, views and tables of one section.

    Its heading and intro text are hidden too, so the screenshot is blank unless the section's
    content itself rendered.
    """
    css = (
        f"<style>body > *:not(#{key}) {{ display: none !important; }} "
        f"#{key} > h2, #{key} > p {{ display: none !important; }}</style>"
    )
    dest.write_text(page.read_text(encoding="utf-8").replace("</head>", css + "</head>", 1), encoding="utf-8")
    return dest


def _non_background(shot) -> int:
    from matplotlib.image import imread

    img = torch.tensor(imread(shot)[..., :3])
    return int((img < 0.9).any(-1).sum().item())


def test_every_section_screenshot_is_not_blank(report_page, tmp_path):
    report, page, _ = report_page
    keys = ["claims"] + [s.key for s in report.sections]
    assert len(keys) >= 6
    counts = {}
    for key in keys + ["no-such-section"]:  # the last one hides everything: the blank control
        shot = tmp_path / f"{key}.png"
        view = _section_only(page, key, tmp_path / f"{key}.html")
        run = run_chromium(view, f"--screenshot={shot}", "--window-size=1280,1600")
        assert run.returncode == 0 and shot.exists(), run.stderr[-2000:]
        counts[key] = _non_background(shot)
    blank = counts.pop("no-such-section")
    assert blank < 100, blank
    empty = {k: n for k, n in counts.items() if n < 5000}
    assert not empty, f"sections with almost nothing drawn (non-background pixels): {empty}; all: {counts}"


def test_wide_tables_scroll_inside_the_page(report_page, tmp_path):
    """A 60-column table stays inside its scrolling box: the page is no wider than the window."""
    import pandas as pd

    from geolens.report import write_report

    report, _, _ = report_page
    wide = pd.DataFrame([[1234.5678] * 60], columns=[f"column_{k}" for k in range(60)])
    report.sections[0].tables.append(("a deliberately wide table", wide))
    try:
        page = write_report(report, tmp_path / "wide")["html"]
    finally:
        report.sections[0].tables.pop()
    probe = (
        "<script>window.addEventListener('load', () => {"
        " const b = [...document.querySelectorAll('.table-scroll')].find(x => x.textContent.includes('column_59'));"
        " document.title = 'page=' + document.documentElement.scrollWidth + ' box=' + b.clientWidth + ' table=' + b.scrollWidth; });</script>"
    )
    page.write_text(page.read_text(encoding="utf-8").replace("</body>", probe + "</body>", 1), encoding="utf-8")
    run = run_chromium(page, "--dump-dom", "--window-size=1400,900")
    m = re.search(r"<title>page=(\d+) box=(\d+) table=(\d+)</title>", run.stdout)
    assert m, run.stdout[:500]
    page_width, box_width, table_width = map(int, m.groups())
    assert page_width <= 1400, page_width
    assert table_width > box_width  # the table is wider than its box: it scrolls inside it


FIRST_SCREEN_PX = 1200  # the first screen of a desktop window 1280 px wide
LAYOUT_PROBE = """<script>window.addEventListener('load', () => {
  const box = (e) => { const r = e.getBoundingClientRect(); return [r.top + window.scrollY, r.bottom + window.scrollY]; };
  const out = {
    findings: [...document.querySelectorAll('#first-screen li.finding')].map(box),
    figures: [...document.querySelectorAll('figure')].slice(0, 1).map((f) => box(f).concat([f.closest('#first-screen') ? 1 : 0])),
    claims: box(document.getElementById('claims')),
    width: document.documentElement.scrollWidth,
  };
  const pre = document.createElement('pre'); pre.id = 'geolens-layout'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});</script>"""


def first_screen_layout(page, dest) -> dict:
    """The page rendered 1280 px wide: page coordinates (top, bottom) of each headline finding and
    of the first figure, and the claim table's, read from the DOM after load."""
    import json

    dest.write_text(page.read_text(encoding="utf-8").replace("</body>", LAYOUT_PROBE + "</body>", 1), encoding="utf-8")
    run = run_chromium(dest, "--dump-dom", "--window-size=1280,1000")
    m = re.search(r'<pre id="geolens-layout">(.*?)</pre>', run.stdout, re.S)
    assert m, run.stderr[-2000:]
    return json.loads(m.group(1))


def test_first_screen_holds_the_findings_and_the_first_figure(report_page, tmp_path):
    """At a 1280-px-wide desktop window the headline findings (3-5) and the page's first figure
    lie within the first 1,200 px, above the claim table; the page is no wider than the window."""
    _, page, _ = report_page
    layout = first_screen_layout(page, tmp_path / "layout.html")
    findings, [figure] = layout["findings"], layout["figures"]
    assert 3 <= len(findings) <= 5, layout
    assert max(bottom for _, bottom in findings) <= FIRST_SCREEN_PX, layout
    top, bottom, in_first_screen = figure
    assert in_first_screen and 0 < top < bottom <= FIRST_SCREEN_PX, layout
    assert layout["claims"][0] >= max(bottom, *(b for _, b in findings)), layout
    assert layout["width"] <= 1280, layout


@pytest.mark.bridge_only
def test_cross_model_page_renders(tmp_path):
    """Two saved tiny reports compared (``geolens report --compare``): the page renders its claim
    table with one column per model and its shared-axes figures."""
    from conftest import make_tiny

    from geolens.report.compare import load_report, write_comparison

    paths = []
    for kind in ("gqa", "gemma"):
        model = make_tiny(kind)
        tokens = tiny_tokens(model, ("the cat sat on the mat.", "a dog ran far away!!", "one two three"), length=20)
        config = ReportConfig(
            model=f"tiny-{kind}", corpus="tiny", batch_size=3, n_heldout=1, quick=True, sections=["sinks", "taxonomy"]
        )
        paths.append(write_report(build_report(model, tokens, config, progress=False), tmp_path / kind)["json"])
    page = write_comparison([load_report(p) for p in paths], tmp_path / "cmp")["html"]
    run = run_chromium(page, "--dump-dom")
    assert run.returncode == 0 and "</html>" in run.stdout, run.stderr[-2000:]
    dom = run.stdout
    assert "<th>tiny-gqa</th>" in dom and "<th>tiny-gemma</th>" in dom and "indicative (n = 2 corpus windows)" in dom
    shot = tmp_path / "cmp.png"
    run = run_chromium(page, f"--screenshot={shot}", "--window-size=1300,1800")
    assert run.returncode == 0 and shot.exists(), run.stderr[-2000:]
    from matplotlib.image import imread

    img = torch.tensor(imread(shot)[..., :3])
    assert (img < 0.95).any(-1).double().mean().item() > 0.05  # figures and table drawn, not a blank page


def test_a_launch_past_its_timeout_is_killed_not_waited_for(tmp_path):
    """The helper's guarantee: a launch that outlives its limit is killed with everything it
    started (both attempts here), and the call returns at once, saying so, instead of hanging."""
    page = tmp_path / "page.html"
    page.write_text("<html><body><p>never finishes in 0.3 s</p></body></html>", encoding="utf-8")
    t = time.perf_counter()
    run = run_chromium(page, "--dump-dom", timeout=0.3)
    assert time.perf_counter() - t < 30
    assert run.returncode is None and "killed after" in run.stderr and "[attempt 2: exit None" in run.stderr, (
        run.stderr[-500:]
    )
