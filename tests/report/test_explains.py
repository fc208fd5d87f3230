"""The report explains itself (issue 26): citations instead of nicknames, human table headers with a
legend under every table, and figures whose legends and ticks do not cover or overlap the data.

Built on the tiny random GQA model (every section, quick mode) like tests/report/test_report.py.
"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pandas as pd
import pytest

from geolens.report import ReportConfig, build_report, write_report
from geolens.report.citations import DEYOUNG, PAPER_A, PAPER_B, REFERENCES, cite_text, references_of
from geolens.report.columns import COLUMNS, header, is_identifier
from geolens.testing import tiny_tokens

IDENTIFIER = re.compile(r"^[a-z0-9]+(_[a-z0-9]+)+$")
NICKNAME = re.compile(r"\bpapers? [AB]\b", re.IGNORECASE)


class _Page(HTMLParser):
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


def _parse(page: str) -> _Page:
    p = _Page()
    p.feed(page)
    return p


@pytest.fixture(scope="module")
def report_files(tmp_path_factory):
    from conftest import make_tiny

    model = make_tiny("gqa")
    tokens = tiny_tokens(model, ("the cat sat on the mat.", "a dog ran far away!!", "one two three"), length=16)
    config = ReportConfig(
        model="tiny-gqa", corpus="tiny", batch_size=2, n_heldout=1, prompt="the cat sat on the mat", quick=True
    )
    report = build_report(model, tokens, config, progress=False)
    paths = write_report(report, tmp_path_factory.mktemp("explains"))
    return report, paths["html"].read_text(encoding="utf-8"), json.loads(paths["json"].read_text())


def test_no_table_header_is_a_raw_identifier(report_files):
    _, page, _ = report_files
    headers = _parse(page).headers
    assert len(headers) > 30
    raw = [h for h in headers if IDENTIFIER.match(h)]
    assert not raw, f"raw column names shown as headers: {raw}"
    # metric and quantity names in the cells read as labels too
    cells = re.findall(r"<td>([^<]*)</td>", page.split("</head>", 1)[1])
    assert "raw attention α" in cells and "gradient × activation" in cells  # per-term metrics
    assert not {
        "raw_attention",
        "delta_logprob",
        "delta_ppl",
        "random_0",
        "output_normalized_intra",
        "grad_x_act",
    } & set(cells)
    assert "contribution flow" in cells and "attention rollout" in cells  # the flow methods by name
    assert not {c for c in cells if IDENTIFIER.match(c.strip())}, sorted(
        {c for c in cells if IDENTIFIER.match(c.strip())}
    )


def test_every_table_has_a_legend_line(report_files):
    report, page, data = report_files
    events = _parse(page).events
    n_tables = sum(len(s.tables) for s in report.sections) + 1  # + the claim table
    assert events.count("table-box") == n_tables
    # every table box is followed by its legend, before the next table
    assert all(events[i + 1] == "legend" for i, e in enumerate(events) if e == "table-box"), events
    for key, section in data["sections"].items():
        assert set(section["table_legends"]) == set(section["tables"])
        assert all(len(text) > 20 for text in section["table_legends"].values()), key


def test_every_shown_column_has_a_human_name_and_a_meaning(report_files):
    report, _, _ = report_files
    for s in report.sections:
        for caption, df, *_ in s.tables:
            for c in df.columns:
                assert str(c) in COLUMNS or header(c) != str(c), (s.key, caption, c)
    assert header("value_cos_mean_dir") == "cos(v_0, mean v_j)" and header("0.8") == "ΔPPL at 80% kept"
    assert is_identifier("value_cos_mean_dir") and not is_identifier("layer") and not is_identifier("ΔPPL")


def test_no_nickname_remains_and_both_papers_are_cited_in_full(report_files):
    _, page, data = report_files
    body = page.split("</head>", 1)[1]
    assert not NICKNAME.search(body), NICKNAME.search(body).group(0)
    text = " ".join(_parse(page).text)
    for ref in (PAPER_A, PAPER_B):
        assert ref.title in text and str(ref.year) in text
        assert all(name.strip() in text for name in ref.authors.split(","))
        assert ref.short in text  # author-year citations in the text
    assert 'id="references"' in page and page.count('<li id="ref-') == len(REFERENCES)
    # the claim table cites each claim's paper by author and year, linked to its one full citation
    rows = re.findall(r"<tr><td>.*?</tr>", page.split('<section id="claims">', 1)[1].split("</section>", 1)[0], re.S)
    assert rows
    flow_rows = [row for row in rows if 'href="#flow"' in row]
    assert flow_rows and len(flow_rows) < len(rows)
    for row in rows:
        if row in flow_rows:  # geolens' own pre-registered erasure test, after DeYoung et al. 2020
            assert f'<a href="#ref-{DEYOUNG.key}">{DEYOUNG.short}</a>' in row and "docs/flow/PROTOCOL.md" in row, row
        else:
            assert f'<a href="#ref-{PAPER_A.key}">' in row or f'<a href="#ref-{PAPER_B.key}">' in row, row[:300]
        assert not any(ref.title in row for ref in REFERENCES), row[:300]


def test_json_keeps_the_machine_source_and_carries_the_citation(report_files):
    _, _, data = report_files
    assert [r["key"] for r in data["references"]] == [r.key for r in REFERENCES]
    assert all({"authors", "title", "year", "full", "citation"} <= set(r) for r in data["references"])
    for c in data["claims"]:
        if c["section"] == "flow":  # geolens' own hypotheses, tested after DeYoung et al. 2020
            assert "docs/flow/PROTOCOL.md" in c["source"] and c["references"] == [DEYOUNG.full], c["source"]
        else:
            assert NICKNAME.search(c["source"])  # the machine key other code reads ("paper A §3.2")
        assert not NICKNAME.search(c["citation"]) and c["references"], c["source"]
        for field in ("claim", "measured", "criterion"):
            assert not NICKNAME.search(c[field]), (field, c[field])
    [sink] = [c for c in data["claims"] if c["source"] == "paper A §3.2" and c["section"] == "contributions"]
    assert sink["citation"] == "Cunningham & Muça Cirone 2026 §3.2" and sink["references"] == [PAPER_A.full]


def test_cite_text_replaces_every_nickname_form():
    assert cite_text("paper A §2.2–3.1") == "Cunningham & Muça Cirone 2026 §2.2–3.1"
    assert cite_text("papers A §3.2 and B") == "Cunningham & Muça Cirone 2026 §3.2 and Mudarisov et al. 2026"
    assert (
        cite_text("French summary of paper B (docs/method.md §5; unverified)")
        == "French summary of Mudarisov et al. 2026 (docs/method.md §5; unverified)"
    )
    assert cite_text("Paper A's claim") == "Cunningham & Muça Cirone 2026's claim"
    assert cite_text("none given by the paper") == "none given by the paper"
    assert [r.key for r in references_of("papers A §3.2 and B")] == [PAPER_A.key, PAPER_B.key]
    assert references_of("none") == []
    # the works the faithfulness and flow sections cite, by their author-year citation in the text
    text = "ALTI (Ferrando, Gállego & Costa-jussà 2022), routes (Ferrando & Voita 2024), ERASER (DeYoung et al. 2020), Holm 1979"
    assert [r.key for r in references_of(text)] == ["ferrando2022", "ferrando2024", "deyoung2020", "holm1979"]


def test_contribution_heatmap_caption_matches_its_colour_scale(report_files):
    report, _, _ = report_files
    section = next(s for s in report.sections if s.key == "contributions")
    heat = next(
        f for f in section.figures if getattr(f, "components", None) and f.components[0].name == "AttentionHeads"
    )
    contrib = heat.components[1]
    scale = heat.data["contribution_scale"]
    assert contrib.props["minValue"] == scale["min"] and contrib.props["maxValue"] == scale["max"]
    values = heat.data["contribution"][:, 1:]
    if (values < 0).any():  # the most negative weight is full red, whatever its size next to the positives
        assert scale["min"] == pytest.approx(values.min().item()) and "full red" in contrib.caption
    assert "symmetric" not in section.intro


def _overlaps(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def _renderer(fig):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def test_faithfulness_legend_is_outside_the_panels_and_ticks_do_not_overlap():
    from geolens.faithfulness import FRACTIONS
    from geolens.viz.faithfulness import faithfulness_curves_plot

    rows = [
        dict(
            metric=m,
            direction=d,
            fraction=k,
            delta_logprob=-(i + 1) * k,
            delta_logprob_lo=-(i + 1) * k - 0.1,
            delta_logprob_hi=-(i + 1) * k + 0.1,
        )
        for i, m in enumerate(["raw_attention", "value_weighted", "contribution", "random"])
        for d in ("comprehensiveness", "sufficiency")
        for k in FRACTIONS
    ]
    view = faithfulness_curves_plot(pd.DataFrame(rows), "delta_logprob")
    r = _renderer(view.figure)
    legend = view.figure.axes[0].get_legend()
    assert legend is not None
    box = legend.get_window_extent(r)
    for ax in view.figure.axes:
        assert not _overlaps(box, ax.get_window_extent(r)), "the legend covers a panel"
        labels = [t for t in ax.get_xticklabels() if t.get_visible() and t.get_text()]
        assert len(labels) >= 4
        extents = sorted((t.get_window_extent(r) for t in labels), key=lambda b: b.x0)
        assert all(a.x1 <= b.x0 for a, b in zip(extents, extents[1:])), [t.get_text() for t in labels]
    view.close()


def test_pruning_axis_fits_the_data_and_the_legend_is_outside():
    from geolens.viz.faithfulness import pruning_curves_plot

    pr = pd.DataFrame(
        [
            dict(order=o, retention=r, delta_ppl=(1.05 - r) * s)
            for o, s in (("regime", 500), ("weight", 800), ("random_0", 600), ("random_1", 650))
            for r in (0.9, 0.7, 0.5, 0.3, 0.1)
        ]
    )
    view = pruning_curves_plot(pr)
    ax = view.figure.axes[0]
    lo, hi = ax.get_ylim()
    assert ax.get_yscale() == "log" and lo > 0  # every ΔPPL is positive: no empty negative half
    assert lo >= pr.delta_ppl.min() / 2 and hi <= pr.delta_ppl.max() * 2
    r = _renderer(view.figure)
    assert not _overlaps(ax.get_legend().get_window_extent(r), ax.get_window_extent(r))
    view.close()
    mixed = pruning_curves_plot(
        pd.DataFrame([dict(order="regime", retention=r, delta_ppl=v) for r, v in ((0.9, -0.2), (0.5, 3.0))])
    )
    lo, hi = mixed.figure.axes[0].get_ylim()
    assert mixed.figure.axes[0].get_yscale() == "linear" and lo < -0.2 and hi > 3.0
    mixed.close()


def test_the_two_random_selection_curves_are_drawn_apart():
    from geolens.viz.selection import f_vs_n_plot

    rows = []
    for kind in ("top", "random"):
        for sink in ("keep", "exclude"):
            for n, base in zip((1, 2, 4, 8), (1.0, 0.5, 0.3, 0.2)):
                v = base if kind == "random" else min(1.0, base + 0.2)
                v += 0.002 if (kind, sink) == ("random", "exclude") else 0.0
                rows.append(
                    dict(
                        metric="f",
                        space="value",
                        by="attention",
                        distance="cosine",
                        kind=kind,
                        sink=sink,
                        N=n,
                        mean=v,
                        lo=v - 0.01,
                        hi=v + 0.01,
                    )
                )
    view = f_vs_n_plot(pd.DataFrame(rows))
    ax = view.figure.axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    keep, excl = lines["random N-set, sink kept"], lines["random N-set, sink excluded"]
    assert (keep.get_linestyle(), keep.get_marker(), keep.get_linewidth()) != (
        excl.get_linestyle(),
        excl.get_marker(),
        excl.get_linewidth(),
    )
    assert keep.get_marker() != excl.get_marker() and keep.get_linewidth() > 2 * excl.get_linewidth()
    assert view.data["random_coincide"]["cosine"] == pytest.approx(0.002)
    assert any("same random rankings" in t.get_text() for t in view.figure.texts)
    r = _renderer(view.figure)
    assert not _overlaps(ax.get_legend().get_window_extent(r), ax.get_window_extent(r))
    view.close()


def test_compare_page_cites_and_explains(report_files, tmp_path):
    from geolens.report.compare import load_report, write_comparison

    report, _, _ = report_files
    first = write_report(report, tmp_path / "a")["json"]
    data = json.loads(first.read_text())
    data["params"]["model"] = "tiny-gqa-b"
    second = tmp_path / "b" / "report.json"
    second.parent.mkdir()
    second.write_text(json.dumps(data))
    paths = write_comparison([load_report(first), load_report(second)], tmp_path / "cmp")
    page = paths["html"].read_text(encoding="utf-8")
    parsed = _parse(page)
    assert not NICKNAME.search(page)
    assert not [h for h in parsed.headers if IDENTIFIER.match(h)]
    assert all(parsed.events[i + 1] == "legend" for i, e in enumerate(parsed.events) if e == "table-box")
    text = " ".join(parsed.text)
    assert PAPER_A.title in text and PAPER_B.title in text and 'id="references"' in page
    cmp = json.loads(paths["json"].read_text())
    assert all(not NICKNAME.search(row["citation"]) and row["references"] for row in cmp["claims"])
    # the shared-axes figures: human axis labels, legends outside their axes
    from geolens.report.compare import compare_reports

    figs = compare_reports([load_report(first), load_report(second)])["figures"]
    assert figs
    for f in figs:
        ax = f.figure.axes[0]
        assert not IDENTIFIER.match(ax.get_ylabel()), ax.get_ylabel()
        r = _renderer(f.figure)
        assert not _overlaps(ax.get_legend().get_window_extent(r), ax.get_window_extent(r)), f.title
        f.close()
