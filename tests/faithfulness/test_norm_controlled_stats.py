"""The statistics of one position of protocol 3 (geolens.faithfulness.norm_controlled_stats): the
partial Spearman correlation against an explicit float64 loop of ranks and Pearson correlations,
ties included; zero for the norm itself and NaN when undefined."""

from __future__ import annotations

import numpy as np
import pytest

from geolens.faithfulness.norm_controlled import (
    partial_spearman,
)


def _loop_ranks(x: list[float]) -> list[float]:
    """Average ranks (1-based) by an explicit double loop."""
    out = []
    for a in x:
        below = sum(1 for b in x if b < a)
        equal = sum(1 for b in x if b == a)
        out.append(below + (equal + 1) / 2.0)
    return out


def _loop_pearson(a: list[float], b: list[float]) -> float:
    n = len(a)
    ma, mb = sum(a) / n, sum(b) / n
    num = sum((x - ma) * (y - mb) for x, y in zip(a, b))
    da = sum((x - ma) ** 2 for x in a) ** 0.5
    db = sum((y - mb) ** 2 for y in b) ** 0.5
    return num / (da * db)


def _loop_partial(s, e, n) -> float:
    rs, re_, rn = _loop_ranks(list(s)), _loop_ranks(list(e)), _loop_ranks(list(n))
    r_se, r_sn, r_en = _loop_pearson(rs, re_), _loop_pearson(rs, rn), _loop_pearson(re_, rn)
    return (r_se - r_sn * r_en) / ((1 - r_sn**2) * (1 - r_en**2)) ** 0.5


@pytest.mark.parametrize("seed", range(6))
def test_partial_spearman_equals_an_explicit_float64_loop(seed):
    rng = np.random.default_rng(seed)
    n = rng.lognormal(size=40)
    e = n**2 * rng.lognormal(0, 0.5, 40)
    s = rng.normal(size=40) + (np.round(n, 1) if seed % 2 else 0)  # ties on odd seeds
    s[:4] = s[0]  # more ties
    assert partial_spearman(s, e, n) == pytest.approx(_loop_partial(s, e, n), abs=1e-12)


def test_partial_spearman_is_zero_for_the_norm_and_nan_when_undefined():
    rng = np.random.default_rng(0)
    n, e = rng.lognormal(size=30), rng.lognormal(size=30)
    assert partial_spearman(n, e, n) == 0.0  # value-weighted is the norm
    assert partial_spearman(3 * n, e, n) == 0.0  # output-normalised inter: the norm over one ||o_i||
    assert partial_spearman(np.ones(30), e, n) == 0.0  # ranks nothing
    assert np.isnan(partial_spearman(e, n**2, n))  # effects rank as the norm: undefined
    assert np.isnan(partial_spearman(e, np.ones(30), n))
