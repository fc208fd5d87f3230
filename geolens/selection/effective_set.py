"""Effective set size N* (docs/method.md §6; the follow-up of Mudarisov et al. 2026 by the same authors).

Keep only the top-N sources of every (layer, head, query) in all layers at once
(:func:`geolens.interventions.keep_top_n.keep_top_n_hooks`, ranking by attention or by
contribution norm α‖v‖) and measure the corpus language-modelling NLL (mean over every predicted
token). N* at a tolerance τ is the smallest N of the grid whose relative NLL increase
(NLL_N − NLL) / NLL is at most τ (τ = 1%, 5%, 10%); NaN when no N of the grid qualifies.
The NLL need not be monotone in N, so ``n_star_stable`` (the smallest N from which every larger
N of the grid stays within τ) is reported too.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from geolens.data import batches
from geolens.interventions.base import applied
from geolens.interventions.keep_top_n import keep_top_n_hooks
from geolens.streaming import Sum

DEFAULT_SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96)
DEFAULT_TOLERANCES = (0.01, 0.05, 0.10)


def token_nll_sum(logits: torch.Tensor, tokens: torch.Tensor) -> tuple[float, int]:
    """(Σ −log p(x_{t+1} | x_≤t), number of predicted tokens) over a batch."""
    logp = torch.log_softmax(logits[:, :-1].double(), dim=-1)
    nll = -logp.gather(-1, tokens[:, 1:, None]).squeeze(-1)
    return float(nll.sum()), int(nll.numel())


def keep_top_n_nll(
    model,
    tokens: torch.Tensor,
    sizes: Sequence[int] = DEFAULT_SIZES,
    *,
    rankings: Sequence[str] = ("attention", "norm"),
    batch_size: int = 8,
    progress: bool = True,
) -> pd.DataFrame:
    """Mean NLL with no deletion (``N`` = 0 row, ``ranking`` "none") and with keep-top-N."""
    sums = {("none", 0): Sum((2,))}
    for by in rankings:
        for n in sizes:
            sums[(by, int(n))] = Sum((2,))
    n_batches = (tokens.shape[0] + batch_size - 1) // batch_size
    device = next(model.parameters()).device
    bar = tqdm(total=n_batches * len(sums), desc="keep-top-N NLL", disable=not progress)
    for batch in batches(tokens, batch_size):
        batch = batch.to(device)
        for (by, n), acc in sums.items():
            hooks = [] if by == "none" else keep_top_n_hooks(model, n, by=by)
            with torch.no_grad(), applied(model, hooks):
                logits = model(batch, return_type="logits")
            s, c = token_nll_sum(logits, batch)
            acc.update(torch.tensor([s, c], dtype=torch.float64))
            bar.update(1)
    bar.close()
    rows = [
        dict(ranking=by, N=n, nll=float(acc.total[0] / acc.total[1]), n_tokens=int(acc.total[1]))
        for (by, n), acc in sums.items()
    ]
    table = pd.DataFrame(rows)
    base = float(table.loc[table.ranking == "none", "nll"].iloc[0])
    table["relative_increase"] = (table["nll"] - base) / base
    return table


def n_star(table: pd.DataFrame, tolerances: Sequence[float] = DEFAULT_TOLERANCES) -> pd.DataFrame:
    """N* per ranking and tolerance from a :func:`keep_top_n_nll` table."""
    rows = []
    for by, grp in table[table.ranking != "none"].groupby("ranking", sort=False):
        grp = grp.sort_values("N")
        Ns, inc = grp["N"].to_numpy(), grp["relative_increase"].to_numpy()
        for tol in tolerances:
            ok = inc <= tol
            first = Ns[ok][0] if ok.any() else np.nan
            stable = np.nan
            for k in range(len(Ns)):
                if ok[k:].all():
                    stable = Ns[k]
                    break
            rows.append(dict(ranking=by, tolerance=tol, n_star=first, n_star_stable=stable))
    return pd.DataFrame(rows)


def effective_set_size(
    model,
    tokens: torch.Tensor,
    sizes: Sequence[int] = DEFAULT_SIZES,
    *,
    tolerances: Sequence[float] = DEFAULT_TOLERANCES,
    rankings: Sequence[str] = ("attention", "norm"),
    batch_size: int = 8,
    progress: bool = True,
) -> dict[str, pd.DataFrame]:
    """``{"nll": per-N table, "n_star": N* per ranking and tolerance}``."""
    if tokens.ndim != 2 or tokens.shape[1] < 2:
        raise ValueError(f"tokens must be [n, seq] with seq ≥ 2, got {tuple(tokens.shape)}")
    table = keep_top_n_nll(model, tokens, sizes, rankings=rankings, batch_size=batch_size, progress=progress)
    return {"nll": table, "n_star": n_star(table, tolerances)}
