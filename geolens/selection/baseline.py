"""Random N-subset baseline and the paired top-N vs random comparison (docs/method.md §5 protocol).

- :func:`random_rankings`: ``n_draws`` random rankings of the visible sources (i.i.d. uniform
  scores from a seeded ``torch.Generator``). The random set of size N is the top N of one
  ranking, so the sets are **nested across N** (the authors' "16 random rankings, nested across
  N").
- :func:`paired_comparison`: per N, the top-N score against the mean over random draws of the
  same (document, layer, head, query): mean difference, win / tie / loss shares (a win is
  top-N > random mean), with document-bootstrap confidence intervals.
- :func:`document_means_ci`: percentile bootstrap over documents
  (2000 resamples by default, :func:`geolens.stats.mean_ci`), the unit of resampling is the
  document (window), as in the authors' protocol.

Averaging order (authors' protocol): repeats within a head → heads and layers within a
document → documents. :func:`document_means` does the first two steps.
"""

from __future__ import annotations

import numpy as np
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from geolens.stats import mean_ci


def random_rankings(
    visible: Bool[Tensor, "... key"], n_draws: int = 16, *, generator: torch.Generator | None = None
) -> Float[Tensor, "draw ... key"]:
    """Uniform random scores ``[n_draws, ..., key]`` (invisible sources get −inf)."""
    if n_draws < 1:
        raise ValueError(f"n_draws must be ≥ 1, got {n_draws}")
    shape = (n_draws,) + tuple(visible.shape)
    scores = torch.rand(shape, generator=generator, dtype=torch.float64).to(visible.device)
    return scores.masked_fill(~visible, float("-inf"))


def document_means(values: Float[Tensor, "*rest"], doc_dim: int) -> Float[Tensor, "doc"]:
    """NaN-ignoring mean over every axis except ``doc_dim`` (heads, layers, queries, repeats).

    Averaging repeats first and then heads gives the same number as one flat mean when every
    head has the same number of valid repeats, which is the case here (draws never produce NaN).
    """
    x = values.movedim(doc_dim, 0).reshape(values.shape[doc_dim], -1).to(torch.float64)
    valid = ~torch.isnan(x)
    return torch.where(valid, x, torch.zeros_like(x)).sum(1) / valid.sum(1).clamp_min(1)


def document_means_ci(
    per_doc: np.ndarray, *, n_boot: int = 2000, ci: float = 0.95, seed: int = 0, groups=None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, low, high) over documents (axis 0) with a percentile bootstrap; NaN rows ignored.

    :func:`geolens.stats.mean_ci` with ``omit_nan=True``: each resample's mean is over its
    non-NaN rows. ``groups``: a source-document label per row (e.g. per window), resampled as
    clusters (:func:`geolens.stats.cluster_bootstrap_indices`). A 1-D input gives ``[1]`` arrays.
    """
    x = np.asarray(per_doc, dtype=np.float64)
    if x.ndim == 1:
        x = x[:, None]
    if x.shape[0] < 1:
        raise ValueError("document_means_ci needs at least one document")
    mean, lo, hi = mean_ci(x, n_boot=n_boot, level=ci, seed=seed, groups=groups, omit_nan=True)
    return mean, lo, hi


def win_tie_loss(top: Tensor, rand_mean: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Boolean masks (win, tie, loss) of top-N against the random mean; NaN → all False."""
    valid = ~(torch.isnan(top) | torch.isnan(rand_mean))
    return valid & (top > rand_mean), valid & (top == rand_mean), valid & (top < rand_mean)


def paired_comparison(
    top_per_doc: np.ndarray,
    random_per_doc: np.ndarray,
    win_per_doc: np.ndarray,
    sizes,
    *,
    n_boot: int = 2000,
    seed: int = 0,
):
    """A tidy table (pandas) per N: top-N and random means with CIs, difference and win share.

    Inputs are document-level values ``[doc, N]`` (already averaged over repeats, heads, layers,
    queries): top-N score, random score and share of (layer, head, query) cases won by top-N.
    """
    import pandas as pd

    top = np.asarray(top_per_doc, dtype=np.float64)
    rnd = np.asarray(random_per_doc, dtype=np.float64)
    win = np.asarray(win_per_doc, dtype=np.float64)
    if not (top.shape == rnd.shape == win.shape) or top.shape[1] != len(sizes):
        raise ValueError(
            f"per-document arrays must all be [doc, {len(sizes)}], got {top.shape}, {rnd.shape}, {win.shape}"
        )
    rows = []
    for k, n in enumerate(sizes):
        # the same seed: the same document resamples for top-N, random, their difference and the wins
        t, tl, th = document_means_ci(top[:, k], n_boot=n_boot, seed=seed)
        r, rl, rh = document_means_ci(rnd[:, k], n_boot=n_boot, seed=seed)
        d, dl, dh = document_means_ci(top[:, k] - rnd[:, k], n_boot=n_boot, seed=seed)
        w, wl, wh = document_means_ci(win[:, k], n_boot=n_boot, seed=seed)
        rows.append(
            dict(
                N=int(n),
                n_docs=int((~np.isnan(top[:, k])).sum()),
                top=t[0],
                top_lo=tl[0],
                top_hi=th[0],
                random=r[0],
                random_lo=rl[0],
                random_hi=rh[0],
                diff=d[0],
                diff_lo=dl[0],
                diff_hi=dh[0],
                win_share=w[0],
                win_lo=wl[0],
                win_hi=wh[0],
            )
        )
    return pd.DataFrame(rows)
