"""Brute-force float64 references for docs/method.md §5 (explicit loops; every candidate radius enumerated).

One (head, query) at a time: ``ys`` is a list of d-vectors (already projected when the space is
the projected one), ``ranks`` a list of scores, ``visible`` a list of bools.
"""

from __future__ import annotations

import torch


def top_n(ranks, visible, n):
    """Indices of the n largest visible ranks, ties by increasing index (sorted by key)."""
    cand = [i for i in range(len(ranks)) if visible[i]]
    cand.sort(key=lambda i: (-float(ranks[i]), i))
    return set(cand[:n])


def distance(x, y, kind):
    """d(x, y) of docs/method.md §5 for one pair, in float64."""
    x, y = torch.as_tensor(x, dtype=torch.float64), torch.as_tensor(y, dtype=torch.float64)
    if kind == "euclidean":
        return float(torch.sqrt(torch.sum((x - y) ** 2)))
    return float(1 - torch.dot(x, y) / (torch.sqrt(torch.dot(x, x)) * torch.sqrt(torch.dot(y, y)) + 1e-12))


def scores_from_distances(D, S, visible):
    """P, R, F, GInv, margin, bounds with every radius enumerated; None if N ≥ |T|."""
    T = [i for i in range(len(D)) if visible[i]]
    O = [j for j in T if j not in S]
    N = len(S)
    if N < 1 or not O:
        return None
    candidates = sorted({D[k] for k in T})
    # ρ_max: the smallest radius whose closed ball around s_N contains all of S
    rho_max = min(r for r in candidates if all(D[i] <= r for i in S))
    # ρ_min: the largest radius whose open ball contains no outside source
    rho_min = max(r for r in candidates if not any(D[j] < r for j in O))
    in_outer = sum(1 for j in O if D[j] <= rho_max)
    in_inner = sum(1 for i in S if D[i] < rho_min)
    P = N / (N + in_outer)
    R = in_inner / N
    F = 0.0 if P + R == 0 else 2 * P * R / (P + R)
    ginv = sum(1 for i in S for j in O if D[j] <= D[i])
    return dict(
        precision=P,
        recall=R,
        f=F,
        rho_min=rho_min,
        rho_max=rho_max,
        ginv=float(ginv),
        margin=rho_min - rho_max,
        precision_bound=N / (N + ginv),
        recall_bound=max(0.0, 1 - ginv / N),
    )


def scores(ys, ranks, visible, n, kind, sink="keep"):
    visible = list(visible)
    ranks = list(ranks)
    if sink == "exclude":
        visible[0] = False
    if sink == "force":
        ranks[0] = float("inf")
    S = top_n(ranks, visible, n)
    s = sum((torch.as_tensor(ys[i], dtype=torch.float64) for i in S), torch.zeros(len(ys[0]), dtype=torch.float64))
    D = [distance(ys[k], s, kind) for k in range(len(ys))]
    return scores_from_distances(D, S, visible), D, S
