"""The cross-model report (issue 11): ``geolens report --model A --model B`` and ``--compare``.

Two tiny random models (GQA Llama, and Gemma 3 with a 16-token sliding window on 24-token
windows), three report sections in quick mode, on a small local corpus.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from figures import overlaps, renderer

from geolens.cli import main
from geolens.report import write_report
from geolens.report.citations import PAPER_A, PAPER_B
from geolens.report.compare import compare_reports, load_report
from report.conftest import IDENTIFIER, NICKNAME, parse_page

pytestmark = pytest.mark.bridge_only  # the tiny Gemma 3 exists only as a TransformerBridge

MODELS = ("tiny-gqa", "tiny-gemma")


def write_corpus(path):
    rng = np.random.default_rng(0)
    words = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "far", "away", "news", "today"]
    path.write_text("\n\n".join(" ".join(rng.choice(words, 40)) + "." for _ in range(8)), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("compare")
    corpus = write_corpus(tmp / "corpus.txt")
    out = tmp / "out"
    args = [
        "report",
        "--model",
        MODELS[0],
        "--model",
        MODELS[1],
        "--corpus",
        corpus,
        "--quick",
        "--no-progress",
        "--sections",
        "sinks,taxonomy,selection",
        "--n-sequences",
        "3",
        "--seq-len",
        "24",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    return out


def test_one_claim_table_with_a_column_per_model(two_models):
    out = two_models
    data = json.loads((out / "compare.json").read_text())
    assert data["models"] == list(MODELS)
    runs = {m: json.loads((out / m / "report.json").read_text()) for m in MODELS}
    assert data["runs"]["tiny-gemma"]["params"]["model"] == "tiny-gemma"
    # every claim of each run appears once, with that run's own measurement, verdict and sample
    want = {m: {(c["section"], c["claim"]): c for c in runs[m]["claims"]} for m in MODELS}
    keys = {(row["section"], row["claim"]) for row in data["claims"]}
    assert keys == set(want["tiny-gqa"]) | set(want["tiny-gemma"])
    assert len(keys) == len(data["claims"])
    for row in data["claims"]:
        for m in MODELS:
            c = want[m].get((row["section"], row["claim"]))
            got = row["models"][m]
            if c is None:
                assert got is None
                continue
            assert got["measured"] == c["measured"] and got["verdict"] == c["verdict"] and got["holds"] == c["holds"]
            assert (got["decision"], got["why"]) == (c["decision"], c["why"])
            assert (
                got["sample"] == c["numbers"]["sample"]
                and got["sample"]["n_windows"] == 3
                or "semantic cone" in row["claim"]
            )
        assert row["agree"] == (
            len({row["models"][m]["decision"] for m in MODELS if row["models"][m]}) == 1 and all(row["models"].values())
        )


def test_figures_share_their_axes(two_models):
    data = json.loads((two_models / "compare.json").read_text())
    figs = {f["title"]: f["data"] for f in data["figures"]}
    sink = next(v for k, v in figs.items() if k.startswith("Mean sink rate"))
    report = json.loads((two_models / "tiny-gemma" / "report.json").read_text())
    rows = report["sections"]["sinks"]["numbers"]["geometry_heads"]["rows"]
    for m in MODELS:
        depth = sink["series"][m]["relative_depth"]
        assert depth[0] == 0 and depth[-1] == 1  # 2 layers → relative depths 0 and 1
    # the Gemma curve is the mean over heads of its own report's per-head sink rate
    for l in (0, 1):
        expected = np.mean([r["sink_rate"] for r in rows if r["layer"] == l])
        assert sink["series"]["tiny-gemma"]["mean"][l] == pytest.approx(expected)
    tax = next(v for k, v in figs.items() if k.startswith("Head taxonomy"))
    assert set(tax["shares"]) == set(MODELS) and "offset-dominated" in tax["categories"]
    dist = report["sections"]["taxonomy"]["numbers"]["distribution"]
    assert tax["shares"]["tiny-gemma"]["Reset"] == pytest.approx(dist["Reset"])
    sel = next(v for k, v in figs.items() if k.startswith("Selection"))
    comp = sorted(
        (
            r
            for r in report["sections"]["selection"]["numbers"]["comparison"]["rows"]
            if r["condition"] == sel["condition"]
        ),
        key=lambda r: r["N"],
    )
    assert comp and sel["series"]["tiny-gemma"] == {
        "N": [r["N"] for r in comp],
        "top": [r["top"] for r in comp],
        "random": [r["random"] for r in comp],
    }


def test_page_is_self_contained_and_reads_no_verdict_without_a_ci(two_models):
    page = (two_models / "compare.html").read_text(encoding="utf-8")
    assert not re.search(r"<script[^>]*\bsrc\s*=", page)
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", page)
    assert page.count("<th>tiny-gqa</th>") == 1 and page.count("<th>tiny-gemma</th>") == 1
    assert page.count('src="data:image/png;base64,') >= 3
    data = json.loads((two_models / "compare.json").read_text())
    cells = [m for row in data["claims"] for m in row["models"].values() if m]
    # 3 windows: nothing is decided; every claim with a criterion reads "indicative (n = …)", with why on hover
    assert all(m["decision"] in ("indicative", "descriptive") and m["holds"] is None for m in cells)
    n_indicative = sum(m["decision"] == "indicative" for m in cells)
    assert n_indicative and page.count('<span class="indicative" title="') == n_indicative
    for text in {m["verdict"] for m in cells}:
        assert page.count(f">{text}</span>") == sum(m["verdict"] == text for m in cells), text
    assert "indicative (n = 3 corpus windows)" in {m["verdict"] for m in cells}
    assert not re.search(r'<span class="(holds|fails)"', page)
    assert (two_models / "tiny-gqa" / "report.html").exists() and (two_models / "tiny-gemma" / "report.html").exists()


def test_compare_saved_runs_gives_the_same_table(two_models, tmp_path, capsys):
    a, b = two_models / "tiny-gqa" / "report.json", two_models / "tiny-gemma"  # a file or a run folder
    assert main(["report", "--compare", str(a), str(b), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert (
        "tiny-gqa | tiny-gemma" in out
        and "indicative (n = 3 corpus windows) | indicative (n = 3 corpus windows)" in out
    )
    assert not re.search(r"\bholds\b|does not hold|low power", out.split("per model", 1)[1].split("wrote", 1)[0])
    again = json.loads((tmp_path / "compare.json").read_text())
    first = json.loads((two_models / "compare.json").read_text())
    assert again["claims"] == first["claims"] and again["figures"] == first["figures"]


def _usage_error(capsys, argv, match):
    """A user error: exit code 2 and one line on stderr (the CLI convention, issue 12)."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and re.search(match, err), err


def test_bad_comparisons_are_refused(two_models, tmp_path, capsys):
    one = str(two_models / "tiny-gqa" / "report.json")
    _usage_error(capsys, ["report", "--compare", one, "--out", str(tmp_path)], "at least two")
    _usage_error(capsys, ["report", "--compare", one, one, "--model", "tiny-gqa", "--out", str(tmp_path)], "not both")
    _usage_error(
        capsys,
        ["report", "--compare", one, str(tmp_path / "missing.json"), "--out", str(tmp_path)],
        "no such report.json",
    )
    with pytest.raises(FileNotFoundError, match="no report.json"):
        load_report(tmp_path / "nothing")
    (tmp_path / "x.json").write_text('{"a": 1}')
    with pytest.raises(ValueError, match="not a geolens report.json"):
        load_report(tmp_path / "x.json")
    (tmp_path / "y.json").write_text("{nope")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_report(tmp_path / "y.json")
    with pytest.raises(ValueError, match="at least two reports"):
        compare_reports([load_report(one)])
    # the same model twice gets distinct column labels
    twice = compare_reports([load_report(one), load_report(one)])["data"]
    assert twice["models"] == ["tiny-gqa (1)", "tiny-gqa (2)"]
    _usage_error(capsys, ["report", "--model", "tiny-gqa", "--model", "tiny-gqa", "--out", str(tmp_path)], "same name")


def test_compare_reads_the_report_main_selection_condition():
    from geolens.report.compare import SELECTION_MAIN
    from geolens.report.sections.selection import MAIN

    assert SELECTION_MAIN == MAIN


def test_a_claim_one_run_did_not_test_shows_not_run(two_models):
    from geolens.report.compare import render_compare_html

    a = load_report(two_models / "tiny-gqa")
    b = load_report(two_models / "tiny-gemma")
    b["claims"] = [c for c in b["claims"] if c["section"] != "taxonomy"]
    del b["sections"]["taxonomy"]
    cmp = compare_reports([a, b])
    rows = [r for r in cmp["data"]["claims"] if r["section"] == "taxonomy"]
    assert rows and all(r["models"]["tiny-gemma"] is None and not r["agree"] for r in rows)
    page = render_compare_html(cmp)
    assert page.count("not run</td>") == len(rows)
    tax = next(f.data for f in cmp["figures"] if f.title.startswith("Head taxonomy"))
    assert list(tax["shares"]) == ["tiny-gqa"]  # drawn for the run that has it only
    for f in cmp["figures"]:
        f.close()


def test_the_verdict_rule_is_applied_to_every_run(two_models):
    """A run's claim reads holds / does not hold only when decided by intervals on enough windows,
    whatever its report.json says: a report written before that rule (no "ci") reads indicative."""
    from geolens.report.compare import render_compare_html

    a, b = load_report(two_models / "tiny-gqa"), load_report(two_models / "tiny-gemma")
    [top_a] = [c for c in a["claims"] if c["claim"].startswith("Top-N sets")]
    [top_b] = [c for c in b["claims"] if c["claim"].startswith("Top-N sets")]
    assert top_a["ci"] and top_a["decision"] == "indicative"  # decided by CIs, but on 3 windows
    top_a["numbers"]["sample"] = {
        **top_a["numbers"]["sample"],
        "n_windows": 64,
        "low_power": False,
        "low_power_reason": "",
    }
    top_a["criterion_met"] = True
    old = {
        k: top_b[k] for k in ("claim", "source", "measured", "criterion", "section")
    }  # the old format: no ci, no criterion_met
    old.update(
        holds=True,
        verdict="holds",
        measured=top_b["measured"] + " [n = 64 corpus windows]",
        numbers={"sample": {"n_windows": 64, "windows": "corpus windows", "n_seeds": None, "low_power": False}},
    )
    b["claims"] = [old if c is top_b else c for c in b["claims"]]
    cmp = compare_reports([a, b])
    [row] = [r for r in cmp["data"]["claims"] if r["claim"].startswith("Top-N sets")]
    ma, mb = row["models"]["tiny-gqa"], row["models"]["tiny-gemma"]
    assert (ma["verdict"], ma["holds"]) == ("holds (n = 64 corpus windows)", True)
    assert (mb["verdict"], mb["holds"], mb["why"]) == (
        "indicative (n = 64 corpus windows)",
        None,
        "no confidence interval",
    )
    assert mb["measured"] == top_b["measured"] and not row["agree"]
    page = render_compare_html(cmp)
    assert page.count('<span class="holds">holds (n = 64 corpus windows)</span>') == 1
    assert '<span class="indicative" title="no confidence interval">indicative (n = 64 corpus windows)</span>' in page
    assert '<tr class="differs">' in page
    for f in cmp["figures"]:
        f.close()


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
    parsed = parse_page(page)
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
        r = renderer(f.figure)
        assert not overlaps(ax.get_legend().get_window_extent(r), ax.get_window_extent(r)), f.title
        f.close()
