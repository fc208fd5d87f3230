"""The sink-rate / output-norm curve (docs/method.md §4, geolens.sinks.norm_curve) against naive
binning, and its quadratic fit."""

from __future__ import annotations

import math

import numpy as np
import pytest
import reference

from geolens.sinks import (
    output_norm_curve,
    quadratic_fit,
)
from geolens.sinks.norm_curve import NormCurve


def test_norm_curve_matches_naive_binning(corpus):
    model, tokens, cache = corpus
    res = output_norm_curve(model, tokens, batch_size=2, n_bins=5, min_count=1)
    B, T = tokens.shape
    edges = np.linspace(0, 1, 6)
    for layer in range(model.cfg.n_layers):
        pattern, _, _ = reference.raw_tensors(model, cache, layer)
        vt = reference.projected_values(model, cache, layer)
        pooled = {k: [] for k in range(5)}
        for h in range(model.cfg.n_heads):
            per_bin = {k: [] for k in range(5)}
            for b in range(B):
                for i in range(1, T):
                    o = sum(pattern[b, h, i, j] * vt[b, h, j] for j in range(i + 1))
                    rate = float(pattern[b, h, i, 0])
                    k = min(int(np.searchsorted(edges, rate, side="right")) - 1, 4)
                    per_bin[k].append(float(o.norm()))
                    pooled[k].append(float(o.norm()))
            curve = res.curves[(res.curves.scope == "head") & (res.curves.layer == layer) & (res.curves["head"] == h)]
            for k in range(5):
                r = curve.iloc[k]
                assert r["count"] == len(per_bin[k])
                if per_bin[k]:
                    assert r.mean_norm == pytest.approx(np.mean(per_bin[k]), rel=1e-7)
                if len(per_bin[k]) > 1:
                    sem = np.std(per_bin[k], ddof=1) / np.sqrt(len(per_bin[k]))
                    assert r["sem"] == pytest.approx(sem, rel=1e-4, abs=1e-12)
                    assert r.ci_hi - r.ci_lo == pytest.approx(2 * 1.96 * sem, rel=1e-4, abs=1e-12)
        lcurve = res.curves[(res.curves.scope == "layer") & (res.curves.layer == layer)]
        assert lcurve["count"].tolist() == [len(pooled[k]) for k in range(5)]


def test_quadratic_fit_recovers_a_parabola_and_its_minimum():
    x = np.linspace(0.025, 0.975, 20)
    y = 3.0 * (x - 0.4) ** 2 + 1.0
    fit = quadratic_fit(x, y, np.full(20, 50))
    assert fit["curvature"] == pytest.approx(3.0) and fit["argmin"] == pytest.approx(0.4)
    assert fit["convex"] and fit["argmin_inside"] and fit["argmin_in_range"]
    assert fit["empirical_argmin"] == pytest.approx(x[np.argmin(y)])
    concave = quadratic_fit(x, -y, np.full(20, 50))
    assert not concave["convex"] and math.isnan(concave["argmin"]) and not concave["argmin_inside"]
    outside = quadratic_fit(x, (x - 1.5) ** 2, np.full(20, 50))
    assert outside["convex"] and outside["argmin"] == pytest.approx(1.5) and not outside["argmin_inside"]
    # bins below min_count are left out of the fit; fewer than 3 bins: no fit
    few = quadratic_fit(x, y, np.r_[np.full(2, 50), np.zeros(18)])
    assert few["n_bins_fit"] == 2 and math.isnan(few["curvature"])
    # the weights matter: a heavy bin pulls the fit
    w = np.full(20, 1)
    w[0] = 10_000
    y2 = y.copy()
    y2[0] += 1.0

    def value_at_x0(fit):
        return np.polyval([fit["curvature"], fit["slope"], fit["intercept"]], x[0])

    heavy = value_at_x0(quadratic_fit(x, y2, w, min_count=1))
    flat = value_at_x0(quadratic_fit(x, y2, np.full(20, 1), min_count=1))
    assert abs(heavy - y2[0]) < 0.01 < abs(flat - y2[0])


def test_norm_curve_summary_shares_are_consistent(corpus):
    model, tokens, _ = corpus
    res = output_norm_curve(model, tokens, n_bins=5, min_count=1)
    s = res.summary()
    fitted = res.fits[(res.fits.scope == "head") & (res.fits.n_bins_fit >= 3)]
    assert s["head_n_fitted"] == len(fitted)
    assert 0 <= s["head_share_convex_argmin_inside"] <= s["head_share_convex"] <= 1
    assert isinstance(NormCurve(2, 4).state_dict(), dict)
