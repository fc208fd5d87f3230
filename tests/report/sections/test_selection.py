"""The report's token-selection section (geolens.report.sections.selection): quick and full
settings, its headline finding read from a hand-built comparison table, and the section it builds
on the tiny model (the windows, conditions and sample it says it used are those it ran)."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

from geolens.pipelines.selection import MAIN, NO_SINK
from geolens.report.sections.selection import analyses, build, finding, params
from geolens.selection.analysis import DEFAULT_CONDITIONS
from report.conftest import tiny_context


def _ctx(quick: bool):
    return SimpleNamespace(config=SimpleNamespace(quick=quick, seed=7, batch_size=3))


def test_quick_mode_scores_the_two_cosine_conditions_with_fewer_samples():
    quick, full = params(_ctx(True)), params(_ctx(False))
    assert [c.name for c in quick.conditions] == [MAIN, NO_SINK] and (quick.n_random, quick.n_boot) == (4, 200)
    assert list(full.conditions) == list(DEFAULT_CONDITIONS) and (full.n_random, full.n_boot) == (16, 2000)
    for p in (quick, full):
        assert p.seed == 7 and p.batch_size == 3 and p.regime is False  # the report fits no regime here


def test_the_finding_is_the_main_condition_at_its_smallest_n():
    comparison = pd.DataFrame(
        [
            dict(condition=MAIN, N=4, diff=0.30, diff_lo=0.20, diff_hi=0.40),
            dict(condition=MAIN, N=2, diff=0.12, diff_lo=0.05, diff_hi=0.19),
            dict(condition=NO_SINK, N=1, diff=0.90, diff_lo=0.80, diff_hi=0.95),  # not the main condition
        ]
    )
    [f] = finding(dict(comparison=comparison, n_documents=5))
    assert (f.value, f.low, f.high, f.n, f.units, f.figure) == (0.12, 0.05, 0.19, 5, "corpus windows", 0)
    assert f.what.startswith("F_N of the top-2 set minus a random 2-set")
    assert finding(dict(comparison=comparison[comparison.condition != MAIN], n_documents=5)) == []


def test_the_built_section_reports_what_it_ran():
    """Built from the shared corpus pass (its ``analyses`` run over the report's windows), the section
    holds what the selection pipeline computes in its own pass over the same windows."""
    from conftest import make_tiny

    from geolens.pipelines.selection import run_selection
    from geolens.runner import run_corpus

    ctx = tiny_context(make_tiny("gqa"))
    shared = analyses(ctx)
    run_corpus(ctx.model, ctx.tokens, list(shared.values()), batch_size=2, progress=False)
    section = build(ctx, shared)
    n = int(ctx.tokens.shape[0])
    assert section.key == "selection" and section.params["conditions"] == [MAIN, NO_SINK]
    assert section.params["n_random"] == 4 and section.params["n_boot"] == 200
    assert f"({n} windows; 4 random rankings)" in section.intro and section.numbers["n_documents"] == n
    [(caption, table, _)] = section.tables
    assert caption.startswith("top-N vs random F_N") and table is section.numbers["comparison"]
    own = run_selection(ctx.model, ctx.tokens, params(ctx), progress=False).scores["comparison"]
    pd.testing.assert_frame_equal(table, own)
    assert set(table.condition) == {MAIN, NO_SINK} and table["N"].min() == 1
    main = table[table.condition == MAIN].sort_values("N").iloc[0]
    [f] = section.findings
    assert (f.value, f.low, f.high, f.n) == pytest.approx((main["diff"], main.diff_lo, main.diff_hi, n))
    assert len(section.figures) == 1
    section.figures[0].close()
