"""Table columns in the report (geolens.report.columns): no header is a raw identifier, every table has
a legend line, every shown column has a human name and a meaning."""

from __future__ import annotations

import re

from geolens.report.columns import COLUMNS, header, is_identifier
from report.conftest import IDENTIFIER, parse_page


def test_no_table_header_is_a_raw_identifier(report_files):
    _, page, _ = report_files
    headers = parse_page(page).headers
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
    events = parse_page(page).events
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
