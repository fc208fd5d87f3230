"""The window regime of the selection study (geolens.selection.regime, docs/method.md §6): per-window
similarity statistics against loops, the exponential-decay fit, and the streamed, merged
RegimeAnalysis."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import reference
import torch

import geolens
from geolens.runner import run_corpus
from geolens.selection.regime import RegimeAnalysis, fit_exponential_decay, window_regime
from selection.conftest import corpus


@pytest.mark.parametrize("space", ["value", "projected"])
def test_window_regime_matches_loops(tiny, space):
    model, _, cache = tiny
    layer = geolens.get_attention_layer(model, cache, 1, dtype=torch.float64)
    got = window_regime(layer, space)
    _, v, _ = reference.raw_tensors(model, cache, 1)
    u = reference.projected_values(model, cache, 1) if space == "projected" else v.permute(0, 2, 1, 3)
    b, h, K, _ = u.shape
    cos = lambda a, c: float(torch.dot(a, c) / (a.norm() * c.norm()))
    for bi in range(b):
        for hi in range(h):
            norms = [float(u[bi, hi, j].norm()) for j in range(1, K)]
            mean = sum(norms) / len(norms)
            spread = (sum((n - mean) ** 2 for n in norms) / len(norms)) ** 0.5 / mean
            unit_mean = sum(u[bi, hi, j] / u[bi, hi, j].norm() for j in range(1, K)) / (K - 1)
            assert float(got["norm_spread"][bi, hi]) == pytest.approx(spread, rel=1e-8)
            assert float(got["coherence"][bi, hi]) == pytest.approx(float(unit_mean.norm()), rel=1e-8)
            assert float(got["sink_norm_ratio"][bi, hi]) == pytest.approx(float(u[bi, hi, 0].norm()) / mean, rel=1e-8)
            assert float(got["sink_alignment"][bi, hi]) == pytest.approx(
                sum(cos(u[bi, hi, 0], u[bi, hi, j]) for j in range(1, K)) / (K - 1), abs=1e-8
            )
            for lag in (1, 3, K - 2):
                pairs = [cos(u[bi, hi, i], u[bi, hi, i - lag]) for i in range(1 + lag, K)]
                assert float(got["lag_sim"][bi, hi, lag - 1]) == pytest.approx(sum(pairs) / len(pairs), abs=1e-8)


def test_exponential_decay_fit_recovers_parameters():
    delta = np.arange(1, 41)
    lam = np.geomspace(0.25, 160, 120)[60]
    sim = np.stack([0.1 + 0.6 * np.exp(-delta / lam), 0.3 * np.ones(40) + 0.0 * delta])
    fit = fit_exponential_decay(sim)
    assert (
        fit["length"][0] == pytest.approx(lam)
        and fit["amplitude"][0] == pytest.approx(0.6)
        and fit["offset"][0] == pytest.approx(0.1)
    )
    assert fit["rmse"][0] < 1e-10 and fit["r2"][0] == pytest.approx(1.0)
    assert np.isnan(fit["r2"][1]) and fit["rmse"][1] < 1e-10  # a flat curve has no variance to explain


def test_regime_analysis_streams_and_merges(tiny_gqa):
    model, _, _ = tiny_gqa
    tokens = corpus(model)
    full = RegimeAnalysis.for_model(model, 12)
    a, b = RegimeAnalysis.for_model(model, 12), RegimeAnalysis.for_model(model, 12)
    run_corpus(model, tokens, [full], batch_size=4, progress=False)
    run_corpus(model, tokens[:1], [a], progress=False)
    run_corpus(model, tokens[1:], [b], progress=False)
    a.merge(b)
    ra, rf = a.result(), full.result()
    pd.testing.assert_frame_equal(ra["heads"], rf["heads"], atol=1e-10)
    assert rf["n_windows"] == 4 and rf["lag_sim"].shape == (2, 4, 10) and rf["profile"].shape == (2, 4, 12)
    np.testing.assert_allclose(rf["profile"].sum(-1), 1.0, atol=1e-5)  # the final query's attention sums to 1
    c = RegimeAnalysis.for_model(model, 12).load_state_dict(a.state_dict())
    pd.testing.assert_frame_equal(c.result()["heads"], ra["heads"])
    with pytest.raises(ValueError, match="windows of 12"):
        RegimeAnalysis.for_model(model, 12).update(model, None, torch.zeros(1, 5, dtype=torch.long))
