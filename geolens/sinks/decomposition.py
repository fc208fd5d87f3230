"""Token-type decomposition of log|c_ij| into its three factors (docs/method.md §4; Cunningham & Muça Cirone 2026, §3.2).

Intra-head contribution weights factor exactly (docs/method.md §2):

    X = log|c_ij| = A + R + C,   A = log α_ij,  R = log(‖ṽ_j‖/‖o_i‖),  C = log|cos(o_i, ṽ_j)|.

For each source type — the sink (j = 0) and the tail (1 ≤ j ≤ i), over queries i ≥ 1 — the
variance of X over the samples (sequence, query, source) splits additively:

    Var X = Cov(X, A) + Cov(X, R) + Cov(X, C),

so the **share** of factor F is Cov(X, F) / Var X; the three shares add up to 1 (a share can be
negative when a factor varies against the others). The second, finer identity is also reported,

    Var X = Var A + Var R + Var C + 2 Cov(A, R) + 2 Cov(A, C) + 2 Cov(R, C),

with each term divided by Var X (``frac_*`` columns). Means of A, R, C say which factor sets
the *level* of the contributions. The claim of Cunningham & Muça Cirone (2026): the sink's contributions are
governed by value geometry (R and C), the tail's by attention and alignment (A and C) jointly.

Samples with α = 0, ‖ṽ_j‖ = 0, cos = 0 or ‖o_i‖ = 0 have no logarithm and are skipped.
Sliding-window layers (:mod:`geolens.visibility`): only the pairs (i, j) of the visible set
count; a query i ≥ W has no sink sample and its tail is i − W < j ≤ i (the pairs outside the
window are dropped explicitly, not through α = 0).
Streaming: covariances come from Welford variances of sums by polarisation,
Cov(U, V) = (Var(U + V) − Var U − Var V) / 2, so the accumulators are plain
:class:`~geolens.streaming.Moments` (mergeable, resumable). Statistics per (layer, head) and
pooled over the heads of a layer.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import pandas as pd
import torch

from geolens.adapter import PATTERN, VALUE, hook_name, model_mode, sliding_window
from geolens.contributions import ZeroNormOutputWarning
from geolens.factors import InfluenceFactors, influence_factors
from geolens.runner import run_analysis
from geolens.sinks._accumulate import add_moments_at
from geolens.streaming import CorpusAnalysis, Moments

FACTORS = ("attention", "relnorm", "cosine")
# the variables accumulated, as sums of (X, A, R, C) = indices (0, 1, 2, 3)
_VARS = [(0,), (1,), (2,), (3,), (0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
SOURCE_TYPES = ("sink", "tail")


def log_factors(factors: InfluenceFactors, *, window: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(sink, tail) samples ``[batch, head, n, 4]`` of (X, A, R, C) from intra-head factors.

    Sink: j = 0 for queries i ≥ 1 (``n = query − 1``). Tail: the causal pairs 1 ≤ j ≤ i
    (``n = (query − 1) query / 2``). Undefined samples (a zero factor) are NaN, and so are the
    pairs outside a sliding ``window`` (i − j ≥ W).
    """
    if factors.mode != "intra":
        raise ValueError("the token-type decomposition uses intra-head factors (mode='intra')")
    alpha, rel, cos = factors.attention, factors.relative_norm, factors.alignment
    q = alpha.shape[2]
    qi, kj = torch.tril_indices(q - 1, q - 1, device=alpha.device) + 1  # 1 ≤ j ≤ i ≤ q-1
    out = []
    for qs, ks in ((slice(1, None), 0), (qi, kj)):
        a = alpha[:, :, qs, ks]
        f = torch.stack([a.log(), rel[:, :, qs, ks].log(), cos[:, :, qs, ks].abs().log()], dim=-1)
        f = torch.cat([f.sum(-1, keepdim=True), f], dim=-1)
        ok = torch.isfinite(f).all(-1, keepdim=True)
        if window is not None:
            qpos = torch.arange(1, q, device=alpha.device) if isinstance(qs, slice) else qi
            ok = ok & ((qpos - (0 if isinstance(qs, slice) else kj)) < window)[:, None]
        out.append(torch.where(ok, f, torch.full_like(f, float("nan"))))
    return out[0], out[1]


def scatter_statistics(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per head: count ``[head]``, mean ``[head, 4]`` and scatter matrix ``[head, 4, 4]`` of
    samples ``x`` ``[batch, head, n, 4]`` of (X, A, R, C); rows with a NaN are skipped."""
    ok = ~torch.isnan(x).any(-1)
    w = ok.to(x.dtype)
    x = torch.where(ok[..., None], x, torch.zeros_like(x))
    n = w.sum((0, 2))
    mean = x.sum((0, 2)) / n.clamp_min(1)[:, None]
    c = (x - mean[None, :, None]) * w[..., None]
    return n, mean, torch.einsum("bhnf,bhng->hfg", c, c)


def pool_heads(n, mean, S) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pool per-head (count, mean, scatter) into one: S = Σ_h S_h + Σ_h n_h (μ_h − μ)(μ_h − μ)ᵀ."""
    total = n.sum()
    mu = (n[:, None] * mean).sum(0) / total.clamp_min(1)
    d = mean - mu
    return total, mu, S.sum(0) + torch.einsum("h,hf,hg->fg", n, d, d)


def variables_moments(n, mean, S) -> Moments:
    """:class:`Moments` of the 10 variables of ``_VARS`` from (count, mean, scatter matrix).

    The sum U + V of samples has mean μ_U + μ_V and M2 = S_UU + S_VV + 2 S_UV.
    """
    m = Moments(tuple(n.shape) + (len(_VARS),))
    m.count = n[..., None].expand(*n.shape, len(_VARS)).clone()
    m.mean = torch.stack([sum(mean[..., i] for i in idx) for idx in _VARS], dim=-1)
    m.m2 = torch.stack([sum(S[..., i, j] for i in idx for j in idx) for idx in _VARS], dim=-1)
    return m


def decomposition_table(moments: Moments) -> dict[str, torch.Tensor]:
    """Shares, fractions and means from accumulated ``[..., 10]`` moments (see module docstring)."""
    var = moments.var
    mean = moments.mean
    V = {idx: var[..., n] for n, idx in enumerate(_VARS)}

    def cov(i, j):
        return (V[tuple(sorted((i, j)))] - V[(i,)] - V[(j,)]) / 2

    total = V[(0,)]
    out = {"n": moments.count[..., 0], "var_log_c": total, "mean_log_c": mean[..., 0]}
    for f, name in enumerate(FACTORS, start=1):
        out[f"share_{name}"] = cov(0, f) / total
        out[f"frac_var_{name}"] = V[(f,)] / total
        out[f"mean_log_{name}"] = mean[..., f]
    for (i, a), (j, b) in [
        ((1, "attention"), (2, "relnorm")),
        ((1, "attention"), (3, "cosine")),
        ((2, "relnorm"), (3, "cosine")),
    ]:
        out[f"frac_2cov_{a}_{b}"] = 2 * cov(i, j) / total
    return out


class TokenTypeDecomposition(CorpusAnalysis):
    """Moments of (X, A, R, C) sums per (layer, head, source type) and per (layer, source type)."""

    def __init__(self, n_layers: int, n_heads: int, *, layers=None, max_sequences: int | None = None):
        """``max_sequences``: use only the first N sequences streamed (later batches are skipped,
        a batch crossing the limit is cut), to bound the cost on long corpora."""
        self.n_layers, self.n_heads = int(n_layers), int(n_heads)
        self.max_sequences = max_sequences
        self.n_sequences = 0
        self.layers = list(range(n_layers)) if layers is None else [int(l) for l in layers]
        self.per_head = Moments((n_layers, 2, n_heads, len(_VARS)))
        self.per_layer = Moments((n_layers, 2, len(_VARS)))
        self.mode = ""

    def hook_names(self, model) -> list[str]:
        return [hook_name(l, n) for l in self.layers for n in (PATTERN, VALUE)]

    def update(self, model, cache, tokens) -> None:
        self.mode = model_mode(model)
        keep = (
            tokens.shape[0]
            if self.max_sequences is None
            else min(tokens.shape[0], self.max_sequences - self.n_sequences)
        )
        if keep <= 0:
            return
        if keep < tokens.shape[0]:
            cache = {name: cache[name][:keep] for name in self.hook_names(model)}
        self.n_sequences += keep
        for l in self.layers:
            with warnings.catch_warnings():  # zero-norm rows are skipped (log 0), no need to warn
                warnings.simplefilter("ignore", ZeroNormOutputWarning)
                factors = influence_factors(model, cache, l, "intra", dtype=torch.float64)
            for t, samples in enumerate(log_factors(factors, window=sliding_window(model, l))):  # [batch, head, n, 4]
                stats = scatter_statistics(samples)
                add_moments_at(self.per_head, (l, t), variables_moments(*stats))
                add_moments_at(self.per_layer, (l, t), variables_moments(*pool_heads(*stats)))

    def merge(self, other: "TokenTypeDecomposition") -> "TokenTypeDecomposition":
        self.per_head.merge(other.per_head)
        self.per_layer.merge(other.per_layer)
        self.n_sequences += other.n_sequences
        return self

    def result(self) -> "DecompositionResult":
        head_t, layer_t = decomposition_table(self.per_head), decomposition_table(self.per_layer)
        rows_h, rows_l = [], []
        for l in self.layers:
            for t, source in enumerate(SOURCE_TYPES):
                rows_l.append({"layer": l, "source": source, **{k: float(v[l, t]) for k, v in layer_t.items()}})
                for h in range(self.n_heads):
                    rows_h.append(
                        {"layer": l, "head": h, "source": source, **{k: float(v[l, t, h]) for k, v in head_t.items()}}
                    )
        heads, layers = pd.DataFrame(rows_h), pd.DataFrame(rows_l)
        for df in (heads, layers):
            df["n"] = df["n"].astype(int)
        share_cols = [f"share_{f}" for f in FACTORS]
        summary = heads.groupby("source")[share_cols + [f"mean_log_{f}" for f in FACTORS]].mean().reset_index()
        return DecompositionResult(heads, layers, summary, self.mode, self.n_sequences)


@dataclass
class DecompositionResult:
    """Tables of :func:`token_type_decomposition`.

    ``heads`` (layer, head, source), ``layers`` (layer, source; samples pooled over heads) and
    ``summary`` (per source type, the mean over all heads of the per-head shares and means).
    Columns: ``n``, ``var_log_c``, ``mean_log_c``, ``share_{attention,relnorm,cosine}`` (sum to
    1), ``frac_var_*`` and ``frac_2cov_*`` (sum to 1), ``mean_log_*``.
    """

    heads: pd.DataFrame
    layers: pd.DataFrame
    summary: pd.DataFrame
    model_mode: str
    n_sequences: int = 0


def token_type_decomposition(
    model, tokens: torch.Tensor, *, batch_size: int = 8, layers=None, progress: bool = False
) -> DecompositionResult:
    """Variance decomposition of log|c_ij| for sink vs tail sources (see the module docstring).

    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")
    >>> s = token_type_decomposition(model, tiny_tokens(model, length=16)).summary
    >>> s.source.tolist(), (s.share_attention + s.share_relnorm + s.share_cosine).round(6).tolist()
    (['sink', 'tail'], [1.0, 1.0])
    """
    return run_analysis(
        model,
        tokens,
        TokenTypeDecomposition,
        model.cfg.n_layers,
        model.cfg.n_heads,
        layers=layers,
        batch_size=batch_size,
        progress=progress,
        desc="decomposition",
    )
