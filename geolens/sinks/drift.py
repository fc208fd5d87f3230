"""Semantic drift under sink-value scaling (docs/method.md §4; Cunningham & Muça Cirone 2026, §3.3).

For each λ of a grid in [0, 2], the model runs with v_0 ← λ v_0 in the chosen layers and kv
heads (:mod:`geolens.interventions.sink_values`; all layers and heads by default, all at once).
In that edited forward pass, per (layer, query head) and query i ≥ 1:

- the head output norm ‖o_i^h‖ (o_i^h = Σ_j α_ij ṽ_j, with the edited v_0);
- the cosine between o_i^h and the semantic-cone direction of that query,
  s_i^h = (1/i) Σ_{j=1}^{i} ṽ_j^h, the mean of the non-sink projected values it can see
  (causal, so the direction depends only on visible tokens); computed in d_head space with the
  Gram matrix: cos = z_i G m_iᵀ / (‖z_i‖_G ‖m_i‖_G), m_i = (1/i) Σ_{j=1}^{i} v_j;
- the mean non-sink projected value norm ‖ṽ_j^h‖, j ≥ 1 (for the low-norm rule);
- the language-modelling loss (mean next-token NLL over all predicted positions) and
  PPL = exp(NLL); ΔPPL(λ) = PPL(λ) − PPL(1).

Sliding-window layers (:mod:`geolens.visibility`): a query i ≥ W cannot see the sink, so the edit
of v_0 cannot reach it; such queries are left out of ‖o_i‖ and cos(o_i, s_i) (for the queries
kept, i < W, the visible non-sink tokens are exactly 1 … i, so s_i is unchanged), and the mean
non-sink value norm uses the tokens that share a window with the sink, 1 ≤ j ≤ W − 1.

Low-norm heads (documented rule): at λ = 1, a head's relative output norm is
r_h = mean_i ‖o_i^h‖ / mean_{j≥1} ‖ṽ_j^h‖ (how much of a typical value's norm survives the
mixing). Heads in the edited layers with r_h at or below the ``low_norm_quantile`` (0.25 by
default) of r over those heads are "low-norm". The claim of Cunningham & Muça Cirone (2026): as λ → 0 the
low-norm heads' outputs turn toward the semantic cone (cos rises) and perplexity rises. Measured on
SmolLM2-135M (docs/results.md, interventions): the cosine rises in every layer set tried, the
perplexity only when all layers are edited at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from geolens.adapter import (
    PATTERN,
    VALUE,
    get_attention_layer,
    hook_name,
    logits_from_cache,
    logits_hook,
    model_mode,
    sliding_window,
)
from geolens.geometry import gram, gram_cosine, gram_norm
from geolens.interventions.base import applied
from geolens.interventions.sink_values import scale_sink_value
from geolens.runner import run_corpus
from geolens.sinks._accumulate import moments_add_at
from geolens.streaming import CorpusAnalysis, Moments, Sum
from geolens.visibility import sink_visible, sink_window_keys

DEFAULT_LAMBDAS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0)


def head_drift_statistics(layer, *, window: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(‖o_i^h‖, cos(o_i^h, s_i^h)) ``[batch·(query−1), head]`` and ‖ṽ_j‖ ``[batch·(key−1), head]``;
    NaN (skipped) for queries i ≥ W and keys j ≥ W of a sliding ``window`` (module docstring)."""
    z_norm, cos, v_norm = head_cone_statistics(layer, window=window)
    h = z_norm.shape[-1]
    return z_norm.reshape(-1, h), cos.reshape(-1, h), v_norm.reshape(-1, h)


def head_cone_statistics(layer, *, window: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """‖o_i^h‖ and cos(o_i^h, s_i^h) ``[batch, query−1, head]``, ‖ṽ_j‖ ``[batch, key−1, head]`` (queries, sources ≥ 1);
    NaN for queries i ≥ W and keys j ≥ W of a sliding ``window``."""
    G = gram(layer.W_O)
    z = layer.z[:, 1:]  # [b, q-1, h, d], queries 1..q-1
    vt = layer.v[:, 1:]  # [b, k-1, h, d], sources 1..k-1
    counts = torch.arange(1, vt.shape[1] + 1, dtype=vt.dtype, device=vt.device)
    m = vt.cumsum(dim=1) / counts[None, :, None, None]  # m_i = mean_{1≤j≤i} v_j
    z_norm = gram_norm(z, G)
    cos = gram_cosine(z, m, G)  # NaN for a zero-norm output or mean
    v_norm = gram_norm(vt, G)
    if window is not None:
        n_q, n_k = layer.pattern.shape[-2:]
        unseen = ~sink_visible(n_q, n_k, window, device=z.device)[1:]
        z_norm = z_norm.masked_fill(unseen[:, None], float("nan"))
        cos = cos.masked_fill(unseen[:, None], float("nan"))
        v_norm = v_norm.masked_fill(~sink_window_keys(n_k, window, device=z.device)[1:, None], float("nan"))
    return z_norm, cos, v_norm


def next_token_nll(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """−log p(t_{i+1} | t_≤i) for every predicted position, float64, ``[batch, seq−1]``."""
    logp = torch.log_softmax(logits[:, :-1].to(torch.float64), dim=-1)
    return -logp.gather(-1, tokens[:, 1:, None].to(logp.device)).squeeze(-1)


class KeptLogits(CorpusAnalysis):
    """The logits of every forward pass, kept (for :func:`semantic_drift`'s ``keep_logits``)."""

    def __init__(self):
        self.parts: list[torch.Tensor] = []

    def hook_names(self, model) -> list[str]:
        return [logits_hook(model)]

    def update(self, model, cache, tokens) -> None:
        self.parts.append(logits_from_cache(model, cache).detach().clone())

    def merge(self, other: "KeptLogits") -> "KeptLogits":
        self.parts += other.parts
        return self

    def result(self) -> torch.Tensor:
        return torch.cat(self.parts)


class RowNLL(CorpusAnalysis):
    """Each row's mean next-token NLL (nats), in the order the rows run (:func:`semantic_drift`'s
    ``row_nll``: the per-sequence loss that an interval over sequences needs)."""

    def __init__(self):
        self.parts: list[torch.Tensor] = []

    def hook_names(self, model) -> list[str]:
        return [logits_hook(model)]

    def update(self, model, cache, tokens) -> None:
        self.parts.append(next_token_nll(logits_from_cache(model, cache), tokens).mean(-1).detach().cpu())

    def merge(self, other: "RowNLL") -> "RowNLL":
        self.parts += other.parts
        return self

    def result(self) -> np.ndarray:
        return torch.cat(self.parts).numpy()


class DriftStatistics(CorpusAnalysis):
    """Per (layer, head): moments of ‖o_i^h‖, cos(o_i^h, s_i^h), ‖ṽ_j‖; the summed NLL."""

    def __init__(self, n_layers: int, n_heads: int, *, layers=None):
        self.n_layers, self.n_heads = int(n_layers), int(n_heads)
        self.layers = list(range(n_layers)) if layers is None else [int(l) for l in layers]
        self.out_norm = Moments((n_layers, n_heads))
        self.cos_cone = Moments((n_layers, n_heads))
        self.value_norm = Moments((n_layers, n_heads))
        self.nll = Sum(())
        self.n_tokens = Sum(())
        self.mode = ""

    def hook_names(self, model) -> list[str]:
        return [hook_name(l, n) for l in self.layers for n in (PATTERN, VALUE)] + [logits_hook(model)]

    def update(self, model, cache, tokens) -> None:
        self.mode = model_mode(model)
        for l in self.layers:
            norm, cos, vnorm = head_drift_statistics(
                get_attention_layer(model, cache, l, dtype=torch.float64), window=sliding_window(model, l)
            )
            moments_add_at(self.out_norm, l, norm, dim=0)
            moments_add_at(self.cos_cone, l, cos, dim=0)
            moments_add_at(self.value_norm, l, vnorm, dim=0)
        nll = next_token_nll(logits_from_cache(model, cache), tokens)
        self.nll.update(nll.sum())
        self.n_tokens.update(torch.tensor(float(nll.numel())))

    def merge(self, other: "DriftStatistics") -> "DriftStatistics":
        for name in ("out_norm", "cos_cone", "value_norm", "nll", "n_tokens"):
            getattr(self, name).merge(getattr(other, name))
        return self

    @property
    def mean_nll(self) -> float:
        return float(self.nll.total / self.n_tokens.total)

    def result(self) -> pd.DataFrame:
        rows = [
            {
                "layer": l,
                "head": h,
                "out_norm": float(self.out_norm.mean[l, h]),
                "out_norm_sem": float(self.out_norm.sem[l, h]),
                "cos_cone": float(self.cos_cone.mean[l, h]),
                "cos_cone_sem": float(self.cos_cone.sem[l, h]),
                "value_norm": float(self.value_norm.mean[l, h]),
            }
            for l in self.layers
            for h in range(self.n_heads)
        ]
        df = pd.DataFrame(rows)
        df["relative_out_norm"] = df["out_norm"] / df["value_norm"]
        return df


@dataclass
class DriftResult:
    """Tables of :func:`semantic_drift`.

    - ``heads``: per (λ, layer, head): ``out_norm``, ``cos_cone`` (with sems), ``value_norm``,
      ``relative_out_norm``, ``low_norm`` (the rule of the module docstring, decided at λ = 1);
    - ``summary``: per λ: ``nll``, ``ppl``, ``delta_ppl`` (vs λ = 1), and the mean ``out_norm``
      and ``cos_cone`` over low-norm heads and over the other edited heads;
    - ``edited``: the edited layers, kv heads and the query heads that see the edit.
    """

    heads: pd.DataFrame
    summary: pd.DataFrame
    lambdas: tuple[float, ...]
    low_norm_quantile: float
    edited: dict
    n_sequences: int
    model_mode: str
    logits: dict | None = None
    row_nll: dict | None = None
    """``{λ: [n] mean next-token NLL of each sequence}`` (nats; the groups' rows one after the other).
    ``logits``: ``{λ: [batch, pos, vocab] logits}`` (or ``{λ: [tensor per group]}`` for groups of
    different lengths) when asked with ``keep_logits=True``, else None."""


def low_norm_heads(baseline: pd.DataFrame, quantile: float = 0.25) -> pd.Series:
    """Boolean per row of a λ = 1 head table: relative_out_norm ≤ its ``quantile`` over the rows."""
    if not 0 < quantile < 1:
        raise ValueError(f"low_norm_quantile must be in (0, 1), got {quantile}")
    threshold = np.nanquantile(baseline["relative_out_norm"].to_numpy(), quantile)
    return baseline["relative_out_norm"] <= threshold


def semantic_drift(
    model,
    tokens: torch.Tensor | Sequence[torch.Tensor],
    *,
    lambdas: Sequence[float] = DEFAULT_LAMBDAS,
    layers=None,
    heads=None,
    kv_heads=None,
    low_norm_quantile: float = 0.25,
    batch_size: int = 8,
    progress: bool = False,
    keep_logits: bool = False,
) -> DriftResult:
    """Run the λ grid (λ = 1 is always added as the baseline) and tabulate the drift (module docstring).

    ``tokens``: ``[n, seq]`` windows (BOS first), or a list of such tensors of different
    lengths (each runs as it is; the statistics pool over all). ``layers``/``heads``/``kv_heads``
    choose the edit as in :func:`geolens.interventions.sink_values.scale_sink_value` (``heads``
    must cover whole kv groups); statistics are reported for the query heads of the edited layers
    that see the edit. ``keep_logits``: keep every λ's logits (``DriftResult.logits``). The
    one-call form with the loss change and a plot: :func:`geolens.intervene.scale_sink_values`.

    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")
    >>> drift = semantic_drift(model, tiny_tokens(model, length=12), lambdas=(0.0,), layers=[1])
    >>> drift.lambdas, drift.edited["layers"], list(drift.summary.columns[:4])
    ((0.0, 1.0), [1], ['lambda', 'nll', 'ppl', 'delta_ppl'])
    """
    groups = [tokens] if isinstance(tokens, torch.Tensor) else list(tokens)
    if not groups or any(not isinstance(g, torch.Tensor) or g.ndim != 2 for g in groups):
        raise ValueError("tokens must be an [n, seq] tensor or a non-empty list of them")
    lambdas = tuple(sorted({float(x) for x in lambdas} | {1.0}))
    if any(not np.isfinite(x) for x in lambdas):
        raise ValueError("λ values must be finite")
    tables, summary, logits, row_nll = {}, [], {}, {}
    edit = None
    for lam in lambdas:
        edit = scale_sink_value(model, lam, layers=layers, heads=heads, kv_heads=kv_heads)
        stats = DriftStatistics(model.cfg.n_layers, model.cfg.n_heads, layers=edit.layers)
        with applied(model, edit.fwd_hooks):
            for group in groups:
                kept = [KeptLogits()] if keep_logits else []
                rows = RowNLL()
                run_corpus(
                    model,
                    group,
                    [stats, rows, *kept],
                    batch_size=batch_size,
                    progress=progress,
                    desc=f"drift λ={lam:g}",
                )
                row_nll.setdefault(lam, []).append(rows.result())
                if keep_logits:
                    logits.setdefault(lam, []).append(kept[0].result())
        df = stats.result()
        df = df[df["head"].isin(edit.query_heads)].reset_index(drop=True)
        df.insert(0, "lambda", lam)
        tables[lam] = df
        summary.append({"lambda": lam, "nll": stats.mean_nll, "ppl": float(np.exp(stats.mean_nll))})
    low = low_norm_heads(tables[1.0], low_norm_quantile).to_numpy()
    for lam, df in tables.items():
        df["low_norm"] = low
    summary = pd.DataFrame(summary)
    summary["delta_ppl"] = summary["ppl"] - float(summary.loc[summary["lambda"] == 1.0, "ppl"].iloc[0])
    for group, mask in (("low_norm", True), ("other", False)):
        for col in ("out_norm", "cos_cone", "relative_out_norm"):
            summary[f"{col}_{group}"] = [
                float(tables[lam].loc[tables[lam]["low_norm"] == mask, col].mean()) for lam in summary["lambda"]
            ]
    heads_df = pd.concat([tables[lam] for lam in lambdas], ignore_index=True)
    edited = {"layers": list(edit.layers), "kv_heads": list(edit.kv_heads), "query_heads": list(edit.query_heads)}
    if keep_logits and len(groups) == 1:
        logits = {lam: parts[0] for lam, parts in logits.items()}
    n_sequences = sum(int(g.shape[0]) for g in groups)
    return DriftResult(
        heads_df,
        summary,
        lambdas,
        low_norm_quantile,
        edited,
        n_sequences,
        model_mode(model),
        logits if keep_logits else None,
        {lam: np.concatenate(parts) for lam, parts in row_nll.items()},
    )
