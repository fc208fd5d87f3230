"""geolens.claims: a claim reads holds / does not hold only when decided by confidence intervals on
at least its minimum sample; the claims live below the pipelines and the report."""

from __future__ import annotations

import ast
import doctest
import itertools
import json
import re
from pathlib import Path

import pytest

import geolens.claims
from geolens.claims import MIN_WINDOWS, PROTOCOL_MIN_DOCUMENTS, Claim, describe_sample, sample_size

ROOT = Path(__file__).parent.parent
VERDICT_WORDS = re.compile(r"\bholds\b|does not hold|\breversed\b|\btie\b", re.IGNORECASE)


def test_doctests():
    finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    tests = [t for t in finder.find(geolens.claims) if t.examples]
    assert len(tests) >= 3
    for t in tests:
        runner.run(t)
    assert runner.summarize(verbose=False).failed == 0


def test_sample_size_and_its_minimum():
    assert MIN_WINDOWS == 20
    assert not sample_size(20)["low_power"] and not sample_size(64, n_seeds=3)["low_power"]
    assert sample_size(19)["low_power_reason"] == "19 < 20 corpus windows"
    one = sample_size(64, windows="held-out windows", n_seeds=1)
    assert one["low_power"] and one["low_power_reason"] == "one seed"
    both = sample_size(3, windows="documents", n_seeds=1, minimum=PROTOCOL_MIN_DOCUMENTS)
    assert both["low_power_reason"] == "3 < 100 documents; one seed" and both["minimum"] == 100
    assert not sample_size(100, windows="documents", minimum=PROTOCOL_MIN_DOCUMENTS)["low_power"]
    assert sample_size(99, windows="documents", minimum=PROTOCOL_MIN_DOCUMENTS)["low_power"]
    assert describe_sample(one) == "n = 64 held-out windows, 1 seed"
    assert describe_sample(sample_size(32, n_seeds=5)) == "n = 32 corpus windows, 5 seeds"
    for bad in (dict(n_windows=10, n_seeds=0), dict(n_windows=-1), dict(n_windows=5, minimum=0)):
        with pytest.raises(ValueError, match="a sample needs"):
            sample_size(**bad)


def test_protocol_minimum_is_the_faithfulness_protocols():
    protocol = json.loads((ROOT / "docs" / "faithfulness" / "protocol.json").read_text(encoding="utf-8"))
    assert PROTOCOL_MIN_DOCUMENTS == protocol["primary"]["min_documents"] == protocol["data"]["n_documents"]


def _expected(holds, ci, sample) -> str:
    """The verdict rule written out case by case."""
    if holds is None and not ci:
        return "descriptive"
    enough = sample is not None and sample["n_windows"] >= sample["minimum"] and sample["n_seeds"] in (None, 2, 3)
    if not (ci and enough):
        return "indicative"
    return {True: "holds", False: "does not hold", None: "undecided"}[holds]


def test_every_combination_follows_the_rule():
    samples = [
        None,
        sample_size(19),
        sample_size(20),
        sample_size(64, n_seeds=1),
        sample_size(64, n_seeds=2),
        sample_size(99, windows="documents", minimum=100),
        sample_size(100, windows="documents", n_seeds=3, minimum=100),
    ]
    seen = set()
    for holds, ci, sample in itertools.product((True, False, None), (True, False), samples):
        numbers = {} if sample is None else {"sample": sample}
        c = Claim("claim", "paper A §3.1", "x = 1", holds, "x > 0", numbers, ci=ci)
        want = _expected(holds, ci, sample)
        assert c.decision == want, (holds, ci, sample)
        seen.add(want)
        if want in ("holds", "does not hold", "undecided", "indicative"):
            assert c.verdict == want + (f" ({describe_sample(sample)})" if sample else "")
        else:
            assert c.verdict == "descriptive"
        if want == "indicative":  # never a verdict word, and always a reason
            assert not VERDICT_WORDS.search(c.verdict) and c.why
            assert ("no confidence interval" in c.why) == (not ci)
            assert ("below the minimum sample" in c.why) == bool(sample and sample["low_power"])
        else:
            assert c.why == ""
    assert seen == set(geolens.claims.DECISIONS)
    # the example: an underpowered claim reads its n and unit
    c = Claim("claim", "paper A §3.1", "x = 1", True, "x > 0", {"sample": sample_size(8, windows="windows")}, ci=True)
    assert c.verdict == "indicative (n = 8 windows)"


def test_a_report_json_entry_reads_back_under_the_same_rule():
    from geolens.report import Report, Section, report_json

    claims = [
        Claim("A", "paper A §3.1", "Δ = +0.3 [+0.1, +0.5]", True, "CI above 0", {"sample": sample_size(64)}, ci=True),
        Claim("B", "paper B", "x = 0.1", True, "x < 0.5", {"sample": sample_size(64)}),
        Claim("C", "paper B", "x = 0.1", None, "none given", {"sample": sample_size(8)}),
    ]
    data = report_json(Report([Section("s", "S", "intro", claims=claims)], {}, {}))
    for c, entry in zip(claims, data["claims"]):
        back = Claim.from_json(entry)
        assert (back.decision, back.verdict, back.why, back.holds, back.ci) == (
            c.decision,
            c.verdict,
            c.why,
            c.holds,
            c.ci,
        )
        assert entry["criterion_met"] == c.holds and entry["verdict"] == c.verdict
        assert entry["holds"] == (c.holds if c.decision in ("holds", "does not hold") else None)
    assert [e["holds"] for e in data["claims"]] == [True, None, None]
    # an entry written before the rule (no "ci"): its old "holds" is a point comparison, never a verdict
    old = {
        "claim": "A",
        "source": "paper A §3.1",
        "measured": "x [n = 64 corpus windows]",
        "holds": True,
        "verdict": "holds",
        "criterion": "x > 0",
        "numbers": {"sample": {"n_windows": 64, "windows": "corpus windows", "n_seeds": None, "low_power": False}},
    }
    back = Claim.from_json(old)
    assert back.verdict == "indicative (n = 64 corpus windows)" and back.why == "no confidence interval"


def _imports(path: Path) -> set[str]:
    """Every module a file imports, function-level imports included."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


def test_claims_sit_below_the_pipelines_and_the_report():
    pipelines = sorted((ROOT / "geolens" / "pipelines").glob("*.py"))
    assert len(pipelines) >= 6
    up = {
        p.name: sorted(m for m in _imports(p) if m == "geolens.report" or m.startswith("geolens.report."))
        for p in pipelines
    }
    assert not any(up.values()), up
    assert all(
        "geolens.claims" in _imports(p)
        for p in pipelines
        if p.stem in ("faithfulness", "pruning", "selection", "sinks", "taxonomy")
    )
    assert not [
        m for m in _imports(ROOT / "geolens" / "claims.py") if m.startswith("geolens")
    ]  # the bottom of the stack


def test_exploratory_runs_are_low_power_whatever_their_size():
    s = sample_size(150, windows="documents", minimum=PROTOCOL_MIN_DOCUMENTS, exploratory=True)
    assert s["low_power"] and s["low_power_reason"] == "exploratory run: settings differ from the protocol"
    both = sample_size(7, windows="corpus windows", minimum=PROTOCOL_MIN_DOCUMENTS, exploratory=True)
    assert both["low_power_reason"] == "7 < 100 corpus windows; exploratory run: settings differ from the protocol"
    c = Claim("A", "paper A §3.1", "Δ = +0.3 [+0.1, +0.5]", True, "CI above 0", {"sample": s}, ci=True)
    assert c.verdict == "indicative (n = 150 documents)" and "exploratory run" in c.why


def test_table_verdicts_follow_the_claims_rule():
    from geolens.claims import table_verdict

    enough = sample_size(100, windows="documents", minimum=PROTOCOL_MIN_DOCUMENTS)
    few = sample_size(7, windows="corpus windows", minimum=PROTOCOL_MIN_DOCUMENTS)
    for v in ("holds", "reversed", "tie"):
        assert table_verdict(v, enough) == v
        assert table_verdict(v, enough, decided=False) == "indicative (n = 100 documents)"
        assert table_verdict(v, few) == "indicative (n = 7 corpus windows)"
        assert table_verdict(
            v, sample_size(100, windows="documents", minimum=PROTOCOL_MIN_DOCUMENTS, exploratory=True)
        ).startswith("indicative")
    assert table_verdict("not testable", few) == table_verdict("not testable", enough) == "not testable"
    assert table_verdict(None, enough) == "indicative (n = 100 documents)"  # no interval: no verdict
    assert not VERDICT_WORDS.search(table_verdict("holds", few))
