"""Inversion bounds on geometric precision and recall (docs/method.md §5; Mudarisov et al. 2026).

For a selected set S (|S| = N) and outside set O = T_t ∖ S with distances D to s_N:

- margin γ_N = ρ_min − ρ_max = min_{j∈O} D_j − max_{i∈S} D_i;
- inversion count GInv_N = Σ_{i∈S} Σ_{j∈O} 1{D_j ≤ D_i} (outside sources at least as close as a
  selected one);
- lower bounds P_N ≥ N / (N + GInv_N) and R_N ≥ max{0, 1 − GInv_N / N};
- γ_N > 0 ⇔ GInv_N = 0 ⇔ P_N = R_N = F_N = 1.

Why the bounds hold: every j ∉ S counted in P_N's outer ball has D_j ≤ ρ_max = D_i for some
i ∈ S, i.e. at least one inversion; every i ∈ S outside R_N's inner ball has D_i ≥ ρ_min = D_j
for some j ∉ S, again at least one inversion (distinct pairs in both cases).

GInv is computed without a ``[key, key]`` comparison: the selected distances are sorted and
each outside distance is located with ``searchsorted`` (O(K log K) per query).
"""

from __future__ import annotations

import torch
from jaxtyping import Bool, Float
from torch import Tensor


def inversion_count(
    D: Float[Tensor, "... key"], selected: Bool[Tensor, "... key"], visible: Bool[Tensor, "... key"]
) -> Float[Tensor, "..."]:
    """GInv_N = Σ_{i∈S} Σ_{j∉S, j visible} 1{D_j ≤ D_i}."""
    outside = visible & ~selected
    n_sel = selected.sum(-1, keepdim=True)
    K = D.shape[-1]
    # selected distances ascending, preceded by K − N entries of −inf
    sel_sorted = torch.where(selected, D, torch.full_like(D, float("-inf"))).sort(dim=-1).values
    # entries < D_j (side='left'): the K − N padding plus the selected with D_i < D_j
    below = torch.searchsorted(sel_sorted.contiguous(), D.contiguous(), side="left") - (K - n_sel)
    at_least = (n_sel - below).clamp_min(0)  # selected with D_i ≥ D_j
    return torch.where(outside, at_least, torch.zeros_like(at_least)).sum(-1).to(D.dtype)


def inversion_bounds(
    D: Float[Tensor, "... key"], selected: Bool[Tensor, "... key"], visible: Bool[Tensor, "... key"]
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(GInv_N, margin γ_N, lower bound on P_N, lower bound on R_N), each ``[...]``."""
    outside = visible & ~selected
    inf = torch.tensor(float("inf"), dtype=D.dtype, device=D.device)
    rho_max = torch.where(selected, D, -inf).amax(-1)
    rho_min = torch.where(outside, D, inf).amin(-1)
    ginv = inversion_count(D, selected, visible)
    n = selected.sum(-1).to(D.dtype)
    p_bound = n / (n + ginv)
    r_bound = (1 - ginv / n.clamp_min(1)).clamp_min(0)
    return ginv, rho_min - rho_max, p_bound, r_bound


def bound_violations(sep, *, tol: float = 1e-9) -> dict[str, int]:
    """Counts of cases breaking the docs/method.md §5 properties in a :class:`Separation` (should all be 0).

    - ``precision_bound``: P_N < N/(N + GInv_N); ``recall_bound``: R_N < max{0, 1 − GInv_N/N};
    - ``equivalence``: not (γ_N > 0 ⇔ GInv_N = 0 ⇔ F_N = 1).
    NaN entries (N ≥ |T_t|, or bounds not computed) are skipped.
    """
    valid = ~torch.isnan(sep.f) & ~torch.isnan(sep.ginv)
    p_bad = valid & (sep.precision < sep.precision_bound - tol)
    r_bad = valid & (sep.recall < sep.recall_bound - tol)
    a = sep.margin > 0
    b = sep.ginv == 0
    c = sep.f >= 1 - tol
    eq_bad = valid & ~((a == b) & (b == c))
    return {
        "n_cases": int(valid.sum()),
        "precision_bound": int(p_bad.sum()),
        "recall_bound": int(r_bad.sum()),
        "equivalence": int(eq_bad.sum()),
    }
