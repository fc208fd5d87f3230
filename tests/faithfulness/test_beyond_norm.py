"""Beyond the norm (geolens.faithfulness.beyond_norm, protocol 4 §1).

The regression against numpy's least squares and a constructed power law, Spearman against a
naive double loop over pairs of ranks, and the summary on constructed terms: a metric that carries
the residual holds, random ties, the norm's functions are "not testable", and the cached groups of
a first call give the same family on a subset as a fresh computation.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from geolens.faithfulness.beyond_norm import beyond_norm_summary, norm_residuals, render_lines
from geolens.faithfulness.ground_truth import spearman  # the one beyond_norm calls

TWIN = json.loads(
    (Path(__file__).resolve().parents[2] / "docs/faithfulness/v4/protocol.json").read_text(encoding="utf-8")
)


def test_norm_residuals_equal_numpy_least_squares():
    rng = np.random.default_rng(0)
    norm = rng.lognormal(size=50)
    kl = 0.3 * norm**2.1 * rng.lognormal(sigma=0.2, size=50)
    e, slope, r2 = norm_residuals(kl, norm)
    x, y = np.log(norm), np.log(kl)
    A = np.stack([np.ones_like(x), x], 1)
    coef, *_ = np.linalg.lstsq(A, y, rcond=None)
    assert slope == pytest.approx(coef[1], abs=1e-12)
    assert np.allclose(e, y - A @ coef, atol=1e-12)
    assert r2 == pytest.approx(1 - (e @ e) / ((y - y.mean()) @ (y - y.mean())), abs=1e-12)
    with pytest.raises(ValueError, match="at least 3"):
        norm_residuals(np.array([1.0, 0.0, 2.0]), np.array([1.0, 2.0, 3.0]))


def _naive_spearman(a, b):
    def ranks(x):
        return np.array([sum(1.0 for y in x if y < v) + (sum(1.0 for y in x if y == v) + 1) / 2 for v in x])

    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra * rb).sum() / np.sqrt((ra * ra).sum() * (rb * rb).sum()))


def test_spearman_equals_a_naive_rank_loop_with_ties():
    rng = np.random.default_rng(1)
    a, b = rng.integers(0, 5, 30).astype(float), rng.normal(size=30)
    assert spearman(a, b) == pytest.approx(_naive_spearman(a, b), abs=1e-12)
    assert np.isnan(spearman(np.arange(5.0), np.ones(5)))  # constant effects: undefined


def _terms(n_docs=20, seed=0):
    """Constructed terms: KL = norm² · exp(0.5 · signal); |c| carries the signal, raw attention the norm only."""
    rng = np.random.default_rng(seed)
    rows, positions = [], []
    for d in range(n_docs):
        for p in range(2):
            layer = (d + p) % 4
            positions.append(dict(document=d, position=p, layer=layer, floor=1e-12))
            for h in range(3):
                for j in range(15):
                    norm = rng.lognormal()
                    signal = rng.normal()
                    rows.append(
                        dict(
                            document=d,
                            position=p,
                            layer=layer,
                            query=20,
                            head=h,
                            source=j,
                            kl=norm**2 * np.exp(0.5 * signal) * 1e-3,
                            norm=norm,
                            raw_attention=norm * rng.lognormal(sigma=0.1),
                            output_normalized_intra=norm / (h + 1),
                            output_normalized_inter=norm / 7.0,
                            contribution=signal + rng.normal(0, 0.3),
                            grad_x_act=rng.normal(),
                            random=rng.random(),
                        )
                    )
    return pd.DataFrame(rows), pd.DataFrame(positions)


def test_a_metric_carrying_the_residual_holds_and_the_norm_functions_are_not_testable():
    terms, positions = _terms()
    out = beyond_norm_summary(terms, positions, TWIN)
    by = {t["b"]: t for t in out["tests"] if t["kind"] == "beyond_norm"}
    assert by["contribution"]["verdict"] == "holds" and by["contribution"]["estimate"] > 0.5
    assert by["grad_x_act"]["verdict"] == "tie"  # |noise| only
    assert out["primary"]["regression"]["slope_mean"] == pytest.approx(2.0, abs=0.15)
    assert {m["metric"] for m in out["primary"]["not_testable"]} == {"value_weighted", "output_normalized_inter"}
    assert "output_normalized_intra" in {m["metric"] for m in out["sensitivity"]["not_testable"]}
    assert out["claimed_order"]["verdict"] == "not testable"
    assert len(out["tests"]) == 7 and len(out["sensitivity_tests"]) == 6
    text = "\n".join(render_lines(out))
    assert "not testable" in text and "slope" in text


def test_cached_groups_give_the_family_of_a_fresh_computation_on_a_subset():
    terms, positions = _terms(seed=2)
    cache: dict = {}
    beyond_norm_summary(terms, positions, TWIN, groups=cache)
    keep = terms.document != 3
    cached = beyond_norm_summary(terms[keep], positions[positions.document != 3], TWIN, groups=cache)
    fresh = beyond_norm_summary(terms[keep], positions[positions.document != 3], TWIN)
    assert cached["tests"] == fresh["tests"] and cached["sensitivity_tests"] == fresh["sensitivity_tests"]
