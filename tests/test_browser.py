"""The generated report in a real browser: headless Debian ``chromium`` renders every circuitsvis view.

Skipped, with the reason, only when no ``chromium`` binary is installed
(``bash scripts/install.sh --browser`` installs it; CI does). The report is built on a tiny random
model so that the test stays fast; the page is the same code path as ``geolens report``.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import torch

from geolens.report import ReportConfig, build_report, write_report
from geolens.testing import tiny_tokens

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (bash scripts/install.sh --browser)")

FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--hide-scrollbars", "--run-all-compositor-stages-before-draw", "--virtual-time-budget=10000",
]  # fmt: skip


def _chromium(page, profile, *extra) -> subprocess.CompletedProcess:
    cmd = [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *extra, page.resolve().as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180)


@pytest.fixture(scope="module")
def report_page(tmp_path_factory):
    from conftest import make_tiny

    model = make_tiny("gqa")
    tokens = tiny_tokens(model, ("the cat sat on the mat.", "a dog ran far away!!"), length=16)
    config = ReportConfig(model="tiny-gqa", corpus="tiny", batch_size=2, n_heldout=1, prompt="the cat sat on the mat", quick=True)
    report = build_report(model, tokens, config, progress=False)
    out = tmp_path_factory.mktemp("browser")
    return report, write_report(report, out)["html"], out


def _components(report) -> list:
    return [c for s in report.sections for f in s.figures for c in getattr(f, "components", [])]


def test_every_circuitsvis_component_renders(report_page, tmp_path):
    report, page, _ = report_page
    run = _chromium(page, tmp_path / "profile", "--dump-dom")
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
    run = _chromium(page, tmp_path / "profile", f"--screenshot={shot}", "--window-size=1280,2400")
    assert run.returncode == 0 and shot.exists(), run.stderr[-2000:]
    img = torch.tensor(imread(shot)[..., :3])  # floats in [0, 1]
    assert img.shape[0] >= 2000 and img.shape[1] >= 1200
    non_white = (img < 0.95).any(-1).double().mean().item()
    assert non_white > 0.05, f"only {non_white:.1%} of the page is not white"
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
        run = _chromium(page, tmp_path / f"profile-{name}", f"--screenshot={shot}", "--window-size=1000,1000")
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
        run = _chromium(view, tmp_path / f"profile-{key}", f"--screenshot={shot}", "--window-size=1280,1600")
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
    run = _chromium(page, tmp_path / "profile", "--dump-dom", "--window-size=1400,900")
    m = re.search(r"<title>page=(\d+) box=(\d+) table=(\d+)</title>", run.stdout)
    assert m, run.stdout[:500]
    page_width, box_width, table_width = map(int, m.groups())
    assert page_width <= 1400, page_width
    assert table_width > box_width  # the table is wider than its box: it scrolls inside it


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
        config = ReportConfig(model=f"tiny-{kind}", corpus="tiny", batch_size=3, n_heldout=1, quick=True, sections=["sinks", "taxonomy"])
        paths.append(write_report(build_report(model, tokens, config, progress=False), tmp_path / kind)["json"])
    page = write_comparison([load_report(p) for p in paths], tmp_path / "cmp")["html"]
    run = _chromium(page, tmp_path / "profile", "--dump-dom")
    assert run.returncode == 0 and "</html>" in run.stdout, run.stderr[-2000:]
    dom = run.stdout
    assert "<th>tiny-gqa</th>" in dom and "<th>tiny-gemma</th>" in dom and "low power" in dom
    shot = tmp_path / "cmp.png"
    run = _chromium(page, tmp_path / "profile2", f"--screenshot={shot}", "--window-size=1300,1800")
    assert run.returncode == 0 and shot.exists(), run.stderr[-2000:]
    from matplotlib.image import imread

    img = torch.tensor(imread(shot)[..., :3])
    assert (img < 0.95).any(-1).double().mean().item() > 0.05  # figures and table drawn, not a blank page
