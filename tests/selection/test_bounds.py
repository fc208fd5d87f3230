"""Inversion bounds (geolens.selection.bounds, docs/method.md §5): GInv_N, the margin and the lower
bounds on P_N and R_N against double loops over (selected, outside) pairs, and bound_violations
counting planted violations."""

from __future__ import annotations

import pytest
import torch

from geolens.selection.bounds import bound_violations, inversion_bounds, inversion_count
from geolens.selection.scores import Separation


def test_inversion_count_matches_double_loop_with_ties():
    D = torch.tensor([[0.0, 1.0, 1.0, 2.0, 0.5, 1.0], [3.0, 3.0, 3.0, 3.0, 3.0, 3.0]])
    sel = torch.tensor([[True, True, False, False, False, True], [True, False, True, False, False, False]])
    vis = torch.tensor([True, True, True, True, True, False])
    got = inversion_count(D, sel, vis)
    for r in range(2):
        S = [i for i in range(6) if sel[r, i]]
        O = [j for j in range(6) if vis[j] and not sel[r, j]]
        assert float(got[r]) == sum(1 for i in S for j in O if D[r, j] <= D[r, i])


def _naive_bounds(D, sel, vis):
    """(GInv, γ, N/(N + GInv), max(0, 1 − GInv/N)) of one row, with Python loops."""
    S = [i for i in range(len(D)) if sel[i]]
    O = [j for j in range(len(D)) if vis[j] and not sel[j]]
    ginv = sum(1 for i in S for j in O if D[j] <= D[i])
    margin = min(D[j] for j in O) - max(D[i] for i in S)
    n = len(S)
    return ginv, margin, n / (n + ginv), max(0.0, 1 - ginv / n)


def test_inversion_bounds_match_loops_on_random_rows():
    g = torch.Generator().manual_seed(0)
    D = torch.rand(50, 9, generator=g, dtype=torch.float64).round(decimals=1)  # ties on purpose
    vis = torch.rand(50, 9, generator=g) < 0.85
    vis[:, :3] = True
    sel = torch.zeros(50, 9, dtype=torch.bool)
    for r in range(50):
        n = int(torch.randint(1, 3, (), generator=g))
        sel[r, torch.randperm(3, generator=g)[:n]] = True  # N ≥ 1 selected, at least one visible outside
    ginv, margin, p_bound, r_bound = inversion_bounds(D, sel, vis)
    for r in range(50):
        want = _naive_bounds(D[r].tolist(), sel[r].tolist(), vis[r].tolist())
        got = (float(ginv[r]), float(margin[r]), float(p_bound[r]), float(r_bound[r]))
        assert got == pytest.approx(want, abs=1e-12), r
    assert bool(((margin > 0) == (ginv == 0)).all())  # γ_N > 0 ⇔ GInv_N = 0


def _separation(**overrides):
    one = torch.ones(4, dtype=torch.float64)
    fields = dict(
        precision=one.clone(),
        recall=one.clone(),
        f=one.clone(),
        rho_min=one * 2,
        rho_max=one,
        ginv=torch.zeros(4, dtype=torch.float64),
        margin=one.clone(),
        precision_bound=one.clone(),
        recall_bound=one.clone(),
    )
    fields.update(overrides)
    return Separation(**fields)


def test_bound_violations_counts_each_broken_property_and_skips_nan():
    assert bound_violations(_separation()) == {"n_cases": 4, "precision_bound": 0, "recall_bound": 0, "equivalence": 0}
    low_p = torch.tensor([0.5, 1.0, 1.0, 1.0], dtype=torch.float64)  # P_N below its bound in case 0
    assert bound_violations(_separation(precision=low_p))["precision_bound"] == 1
    low_r = torch.tensor([1.0, 0.2, 0.2, 1.0], dtype=torch.float64)
    assert bound_violations(_separation(recall=low_r))["recall_bound"] == 2
    # γ > 0 with GInv = 1 (and F = 1): the equivalence is broken in case 3
    ginv = torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    bounds = dict(
        precision_bound=torch.full((4,), 0.5, dtype=torch.float64), recall_bound=torch.zeros(4, dtype=torch.float64)
    )
    assert bound_violations(_separation(ginv=ginv, **bounds))["equivalence"] == 1
    nan_f = torch.tensor([float("nan"), 1.0, 1.0, 1.0], dtype=torch.float64)  # N ≥ |T_t|: skipped
    assert bound_violations(_separation(f=nan_f, precision=low_p))["precision_bound"] == 0
    assert bound_violations(_separation(f=nan_f))["n_cases"] == 3
