"""Protocol 3's per-term endpoint as a pipeline (geolens.pipelines.norm_controlled): its settings are
the registered twin's, its run is the protocol's functions on the caller's windows, the model gets
its dtype back (also after an error), and its claims follow the claims rule."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from geolens.faithfulness.norm_controlled import norm_controlled_document, norm_controlled_summary
from geolens.per_term import float64_exact
from geolens.pipelines.norm_controlled import (
    NORM_CONTROLLED_PAIRS,
    PROTOCOL3,
    NormControlledParams,
    norm_controlled_claims,
    run_norm_controlled,
)
from geolens.testing import tiny_tokens

V3 = Path(__file__).parents[2] / "docs" / "faithfulness" / "v3"
TEXTS = ("the cat sat on the mat.", "a dog ran far away!!", "seven wizards judge boxing")


def test_settings_are_the_registered_twins():
    twin = json.loads((V3 / "protocol.json").read_text())
    assert [list(p) for p in NORM_CONTROLLED_PAIRS] == twin["pairs"] == PROTOCOL3["pairs"]
    for key in ("claimed_order_pairs", "not_testable_by_construction", "not_formed"):
        assert PROTOCOL3[key] == twin[key], key
    assert PROTOCOL3["primary"]["zero_by_construction"] == twin["primary"]["zero_by_construction"]
    assert PROTOCOL3["numerical_floor"]["kl"] == twin["numerical_floor"]["kl"]
    assert PROTOCOL3["numerical_floor"]["resolvable_factor"] == twin["numerical_floor"]["resolvable_factor"]
    p = NormControlledParams()
    assert (p.n_boot, p.seed, p.alpha) == (
        twin["statistics"]["n_boot"],
        twin["statistics"]["seed"],
        twin["statistics"]["alpha"],
    )
    assert p.query_range(twin["data"]["seq_len"]) == tuple(twin["data"]["scored_positions"])


@pytest.fixture(scope="module")
def tiny():
    from conftest import make_tiny

    model = make_tiny("gqa")
    return model, tiny_tokens(model, TEXTS, length=20)


def test_run_is_the_protocols_functions_on_the_windows_in_float64(tiny):
    """The run equals norm_controlled_document on a float64 copy of the model (window d = document d,
    queries 8 … 18) and norm_controlled_summary of its rows; the model is float32 again afterwards."""
    model, windows = tiny
    params = NormControlledParams(n_positions=2, n_boot=200)
    run = run_norm_controlled(model, windows, params, progress=False)
    assert next(model.parameters()).dtype == torch.float32
    reference = copy.deepcopy(model).to(torch.float64)
    with float64_exact(reference):
        parts = [
            norm_controlled_document(reference, windows[d : d + 1], d, n_positions=2, queries=(8, 18)) for d in range(3)
        ]
    terms = pd.concat([t for t, _ in parts], ignore_index=True)
    positions = pd.concat([p for _, p in parts], ignore_index=True)
    pd.testing.assert_frame_equal(run.tables["terms"], terms)
    twin = json.loads((V3 / "protocol.json").read_text())
    twin["statistics"]["n_boot"] = 200
    expected = norm_controlled_summary(terms, positions, dict(twin, n_layers=model.cfg.n_layers))
    expected["positions_per_document"] = 2
    assert json.dumps(run.summary, sort_keys=True, default=str) == json.dumps(expected, sort_keys=True, default=str)
    metrics = run.tables["metrics"].set_index("metric")
    plain = {m["metric"]: m["mean"] for m in expected["plain"]["metrics"]}
    assert metrics.plain_spearman.to_dict() == pytest.approx(plain)
    assert metrics.loc["value_weighted", "partial_spearman"] == 0.0 and len(run.tables["pairs"]) == 9
    assert run.parameters["queries"] == [8, 18] and run.parameters["effects_dtype"] == "float64"


def test_the_model_gets_its_dtype_back_after_an_error(tiny, monkeypatch):
    import geolens.pipelines.norm_controlled as pipeline

    model, windows = tiny

    def fail(*args, **kwargs):
        assert next(model.parameters()).dtype == torch.float64
        raise RuntimeError("stop")

    monkeypatch.setattr(pipeline, "norm_controlled_document", fail)
    with pytest.raises(RuntimeError, match="stop"):
        run_norm_controlled(model, windows, NormControlledParams(n_boot=10), progress=False)
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_bad_arguments_get_one_line_errors(tiny):
    model, windows = tiny
    with pytest.raises(ValueError, match="n_positions"):
        NormControlledParams(n_positions=0)
    with pytest.raises(ValueError, match="alpha"):
        NormControlledParams(alpha=1.5)
    with pytest.raises(ValueError, match="integer token ids"):
        run_norm_controlled(model, windows.float(), progress=False)


def _summary(verdicts: list[str], n_documents: int) -> dict:
    pairs = [
        dict(a=a, b=b, estimate=0.1, ci_low=0.05, ci_high=0.2, verdict=v)
        for (a, b), v in zip(NORM_CONTROLLED_PAIRS, verdicts)
    ]
    metrics = [dict(metric="contribution", mean=0.1, ci_low=0.05, ci_high=0.2)]
    return dict(
        n_documents=n_documents, n_positions=2 * n_documents, norm_controlled=dict(pairs=pairs, metrics=metrics)
    )


@pytest.mark.parametrize(
    "verdicts, order, alignment",
    [
        (["holds"] * 9, True, True),
        (["holds", "tie", "holds"] + ["tie"] * 6, False, True),
        (["holds", "holds", "reversed"] + ["tie"] * 6, False, False),
    ],
)
def test_claims_follow_the_holm_verdicts_on_enough_documents(verdicts, order, alignment):
    claims = norm_controlled_claims(_summary(verdicts, 100))
    assert [c.holds for c in claims] == [order, alignment, None]
    assert claims[0].decision == ("holds" if order else "does not hold")
    few = norm_controlled_claims(_summary(verdicts, 99))
    exploratory = norm_controlled_claims(_summary(verdicts, 100), exploratory=True)
    assert [c.decision for c in few] == [c.decision for c in exploratory] == ["indicative", "indicative", "descriptive"]
    assert claims[2].numbers["best"] == "contribution"


@pytest.mark.bridge_only  # the examples build a tiny TL 4.x bridge
def test_doctests():
    import doctest

    import geolens.pipelines.norm_controlled as module

    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 6 and result.failed == 0
