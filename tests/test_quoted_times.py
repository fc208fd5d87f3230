"""Every duration the README, the docs and ``--help`` quote about geolens' everyday calls is the
first-hour benchmark's (benchmarks/first_hour.py, its record docs/benchmarks/first_hour.json, its
tables in docs/benchmarks.md): the quoted seconds are the benchmark's idle median, rounded, and an
"under N" bound is above it. A quote that drifts from the record, or a new duration quoted next to
one of these calls without an entry here, fails with the file and the sentence."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "docs" / "benchmarks" / "first_hour.json"
REPORT = "geolens report --quick (whole command)"
ONE, THREE = "evaluate_attribution, 1 metric", "evaluate_attribution, 3 metrics"

# (file, pattern with one number, the record's call, rule): "about" = the idle median rounded to
# the second ("loaded": the loaded median); "under" = the idle median is below the number
QUOTES = [
    ("README.md", r"`--quick` takes about (\d+) s", REPORT, "about"),
    ("docs/getting-started.md", r"`--quick` \(8 windows of 64 tokens\) takes about (\d+) s", REPORT, "about"),
    ("docs/commands.md", r"small workload, about (\d+) s idle on 2 cores", REPORT, "about"),
    ("geolens/commands/report.py", r"small workload, about (\d+) s idle on 2 cores", REPORT, "about"),
    ("geolens/commands/report.py", r"to finish in about (\d+) s", REPORT, "about"),
    ("docs/evaluate.md", r"with the model loaded, one metric in about (\d+) s", ONE, "about"),
    ("docs/evaluate.md", r"three in about (\d+) s", THREE, "about"),
    (
        "docs/evaluate.md",
        r"from a fresh process \(import and model load included\) one metric in about (\d+) s",
        "fresh",
        "about",
    ),
    ("docs/evaluate.md", r"the first call of a machine, which fills the cache, about (\d+) s", "cold", "about"),
    ("README.md", r"and (\d+) s beside three busy processes", REPORT, "loaded"),
]
# phrases that sit next to a quoted duration of these calls: every such sentence must be a QUOTE
WATCHED = re.compile(r"(--quick|reference set|evaluate_attribution)[^.\n]{0,120}?\b\d+(\.\d+)? ?s\b")


def _record() -> dict:
    return json.loads(RECORD.read_text(encoding="utf-8"))


def _measured(call: str, rule: str) -> float:
    record = _record()
    if call in ("fresh", "cold"):  # one fresh-process call each, idle (benchmarks/first_hour.py)
        return float(record[f"{'fresh_process' if call == 'fresh' else 'cold'}_evaluate_seconds"])
    return float(record["calls"][call]["loaded" if rule == "loaded" else "idle"]["wall"])


@pytest.mark.parametrize(("path", "pattern", "call", "rule"), QUOTES)
def test_each_quoted_duration_is_the_benchmarks(path, pattern, call, rule):
    text = (ROOT / path).read_text(encoding="utf-8")
    found = re.findall(pattern, text.replace("\n", " "))
    assert found, f"{path} no longer quotes /{pattern}/: update QUOTES in {Path(__file__).name}"
    measured = _measured(call, rule)
    for number in found:
        if rule in ("about", "loaded"):
            assert int(number) == round(measured), (
                f"{path} quotes {number} s for {call!r}; the benchmark: {measured:.1f} s"
            )
        else:
            assert measured < int(number), f"{path} says under {number} s for {call!r}; the benchmark: {measured:.1f} s"


def test_no_other_duration_is_quoted_next_to_these_calls():
    """A sentence quoting seconds beside --quick, the reference set or evaluate_attribution in the
    README or the docs must be one of QUOTES (measured results' pages and the benchmark's own excepted)."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    skip = {"benchmarks.md", "results.md", "models.md", "test-robustness.md", "tl-notes.md"}
    quoted = {(p, pat) for p, pat, _, _ in QUOTES}
    unlisted = []
    for page in pages:
        if page.name in skip:
            continue
        text = page.read_text(encoding="utf-8").replace("\n", " ")
        for m in WATCHED.finditer(text):
            sentence = m.group(0)
            rel = page.relative_to(ROOT).as_posix()
            if not any(p == rel and re.search(pat, text[m.start() - 200 : m.end() + 200]) for p, pat in quoted):
                unlisted.append(f"{rel}: …{sentence}…")
    assert not unlisted, "durations quoted outside benchmarks/first_hour.py's record:\n" + "\n".join(unlisted)


def test_the_record_is_the_benchmarks_and_names_its_commit():
    record = _record()
    assert record["model"] == "smollm2-135m" and record["rounds"] >= 3 and record["busy"] == 3
    assert re.fullmatch(r"[0-9a-f]{7,}", record["commit"])
    for call in (REPORT, ONE, THREE):
        row = record["calls"][call]
        assert row["idle"]["wall"] > 0 and row["loaded"]["wall"] > 0 and "loaded_over_idle" in row
    tables = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert "python benchmarks/first_hour.py" in tables and f"commit {record['commit']}" in tables


def test_the_first_hour_tables_in_the_docs_are_printed_from_the_record():
    import subprocess
    import sys

    script = ROOT / "benchmarks" / "first_hour.py"
    printed = subprocess.run(
        [sys.executable, str(script), "--markdown", str(RECORD)], capture_output=True, text=True, check=True
    ).stdout.strip()
    tables = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    for block in printed.split("\n\n"):  # the header line, the first table, the second table
        assert block in tables, block.splitlines()[0]


def test_the_loaded_range_in_getting_started_is_the_records():
    text = " ".join((ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8").split())
    quoted = re.search(r"took (\d+\.\d)–(\d+\.\d) times its idle wall time", text)
    assert quoted, "docs/getting-started.md no longer quotes the loaded / idle range"
    ratios = [row["loaded_over_idle"]["geometric_mean"] for row in _record()["calls"].values()]
    assert (float(quoted[1]), float(quoted[2])) == (round(min(ratios), 1), round(max(ratios), 1))
