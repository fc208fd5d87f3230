"""geolens report (geolens.commands.report): the command is registered, and a quick report prints no
verdict without a confidence interval."""

from __future__ import annotations

import json

from report.conftest import VERDICT, verdict_cells

from geolens.report import (
    ReportConfig,
)


def test_report_command_is_registered(capsys):
    from geolens.cli import build_parser, main

    args = build_parser().parse_args(["report", "--quick", "--out", "x", "--n-sequences", "4"])
    assert args.quick and args.n_sequences == 4 and args.out == "x"
    assert main(["report", "--list-sections"]) == 0
    assert "contributions" in capsys.readouterr().out.split()
    config = ReportConfig.quick_defaults(n_sequences=4, seq_len=None)
    assert config.quick and config.n_sequences == 4 and config.seq_len == ReportConfig.quick_defaults().seq_len


def test_quick_report_command_prints_no_verdict_without_a_ci(tmp_path, capsys):
    """``geolens report --quick`` on a tiny model: every printed claim line reads indicative (n = …)
    or descriptive, never [holds] / [does not hold]; the same in its HTML page."""
    from geolens.cli import main

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(
        "\n\n".join(f"The cat number {i} sat on the mat and looked at the dog far away." * 3 for i in range(6)),
        encoding="utf-8",
    )
    out = tmp_path / "out"
    args = [
        "report",
        "--quick",
        "--model",
        "tiny-gqa",
        "--corpus",
        str(corpus),
        "--n-sequences",
        "3",
        "--seq-len",
        "24",
        "--no-progress",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    printed = capsys.readouterr().out.split("paper claim → measured", 1)[1]
    lines = [line.strip() for line in printed.splitlines() if line.startswith("  [")]
    data = json.loads((out / "report.json").read_text())
    assert len(lines) == len(data["claims"]) >= 10
    verdicts = [line[: line.index("]") + 1] for line in lines]  # "[indicative (n = 3 corpus windows)]"
    assert not [v for v in verdicts if VERDICT.search(v)], verdicts
    assert all(v == "[descriptive]" or v.startswith("[indicative (n = ") for v in verdicts), verdicts
    assert "[indicative (n = 3 corpus windows)]" in verdicts
    assert "[indicative (n = 1 held-out windows, 1 seed)]" in verdicts  # pruning
    # the contribution-flow claims and the per-term endpoint's claims, decided by intervals, read indicative with their n
    flow = [line for line in lines if "Contribution flow attributes" in line]
    per_term = [line for line in lines if "measured effect" in line]
    assert flow and len(per_term) == 2 and all(line.startswith("[indicative (n = ") for line in flow + per_term), (
        flow + per_term
    )
    cells = verdict_cells((out / "report.html").read_text(encoding="utf-8"))
    assert [f"[{c}]" for c in cells] == verdicts
