"""Sink geometry per (layer, head) over a corpus (docs/method.md §4; Cunningham & Muça Cirone 2026, §3.2; Mudarisov et al. 2026).

For a sequence, layer l and query head h (GQA kv heads expanded, so the value-space numbers of
the query heads of one group coincide), with v_j the value (``hook_v``, b_V included) and
ṽ_j = v_j W_O^h the projected value:

- sink rate α_i0 for queries i ≥ 1 (query 0 can only attend to itself): mean, std and a
  histogram over all queries of the corpus;
- Gu et al. 2024 thresholded sink metric: per sequence, the head's mean attention on the first
  token a^h = (1/T) Σ_{i=0}^{T-1} α_i0 (their α_h^l(1), query 0 included as in their formula);
  the head is a sink head in that sequence if a^h > ε (ε = 0.3). ``gu_sink_share`` per head is the
  share of sequences where it is one; per layer and for the model, the share of heads, averaged
  over sequences (their "sink rate" metric);
- norm ratio ‖v_0‖ / mean_{j>0} ‖v_j‖ (value space) and ‖ṽ_0‖ / mean_{j>0} ‖ṽ_j‖ (projected
  space), one value per sequence, averaged over sequences;
- cos(v_0, v_j) and cos(ṽ_0, ṽ_j) for j > 0, averaged over (sequence, j), with the share of
  negative cosines;
- cos(v_0, m) and cos(ṽ_0, m W_O) with m = mean_{j>0} v_j, the mean non-sink value of the
  sequence (the direction of the "semantic cone" of Cunningham & Muça Cirone 2026), averaged over
  sequences.

Sliding-window (local) layers (:mod:`geolens.visibility`): a query i ≥ W cannot see the sink.
Such out-of-window queries are left out of the sink rate, its histogram and the Gu et al. mean
(never counted as "attention 0 to the sink"); their number is reported per head
(``n_out_of_window``). The sink/tail value statistics (norm ratio, cosines, mean direction) use
the tokens that share a window with the sink, 1 ≤ j ≤ W − 1. Full-attention layers are
unchanged. ``window`` is read per layer by :func:`geolens.adapter.sliding_window`.

Projected norms and cosines use the Gram matrix G^h = W_O^h W_O^{hT} (docs/method.md §2): ‖ṽ_j‖² = v_j G v_jᵀ,
⟨ṽ_0, ṽ_j⟩ = v_0 G v_jᵀ, so ṽ is never materialised. Statistics are computed in float64. A zero
norm makes its ratio/cosine NaN, which the accumulators skip (counted per entry).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from geolens.adapter import PATTERN, VALUE, get_attention_layer, hook_name, kv_head_of, model_mode, sliding_window
from geolens.geometry import gram, gram_cosine, gram_norm
from geolens.runner import run_analysis
from geolens.sinks._accumulate import histogram_add_at, moments_add_at
from geolens.streaming import CorpusAnalysis, Histogram, Moments, Sum
from geolens.visibility import sink_visible, sink_window_keys

GU_EPSILON = 0.3

HEAD_STATS = (
    "sink_rate",
    "gu_score",
    "gu_sink",
    "value_norm_ratio",
    "proj_norm_ratio",
    "value_cos_tail",
    "proj_cos_tail",
    "value_cos_negative",
    "proj_cos_negative",
    "value_cos_mean_dir",
    "proj_cos_mean_dir",
)


def _finite_or_nan(x: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isfinite(x), x, torch.full_like(x, float("nan")))


def layer_sink_statistics(layer, eps: float = GU_EPSILON, *, window: int | None = None) -> dict[str, torch.Tensor]:
    """Per-sample sink statistics of one :class:`~geolens.adapter.AttentionLayer`.

    Returns tensors whose last axis is ``head``: ``sink_rate`` ``[batch, query-1, head]`` (NaN for
    queries outside the sink's sliding ``window``), ``value_cos_tail``/``proj_cos_tail`` (and the
    ``*_negative`` indicators) ``[batch, key-1, head]`` (NaN for keys j ≥ W), and the
    per-sequence quantities ``[batch, head]``.
    """
    alpha = layer.pattern  # [b, h, q, k]
    v = layer.v  # [b, k, h, d]
    n_q, n_k = alpha.shape[-2:]
    if n_k < 2:
        raise ValueError("sink statistics need sequences of at least 2 tokens")
    if n_q != n_k:
        raise ValueError(
            f"sink statistics need a square pattern (every query of the window), got {n_q} queries and {n_k} keys"
        )
    seen = sink_visible(n_q, n_k, window, device=alpha.device)  # [q]
    tail = sink_window_keys(n_k, window, device=alpha.device)[1:]  # [k-1]: keys sharing a window with the sink
    G = gram(layer.W_O)
    v0, vt = v[:, 0], v[:, 1:]  # [b,h,d], [b,k-1,h,d]
    vn0, vnt = v0.norm(dim=-1), vt.norm(dim=-1)
    pn0, pnt = gram_norm(v0, G), gram_norm(vt, G)  # [b,h], [b,k-1,h]
    nan = float("nan")
    # cosines of zero-norm vectors are NaN (skipped by Moments)
    value_cos = gram_cosine(v0[:, None], vt).masked_fill(~tail[:, None], nan)
    proj_cos = gram_cosine(v0[:, None], vt, G).masked_fill(~tail[:, None], nan)
    w = tail.to(vt.dtype)
    n_tail = w.sum()
    m = (vt * w[None, :, None, None]).sum(dim=1) / n_tail  # [b,h,d]: mean over 1 ≤ j ≤ W−1
    sink_col = alpha[:, :, :, 0]  # [b,h,q]
    gu_score = (sink_col * seen.to(alpha.dtype)).sum(-1) / seen.sum()  # [b,h], query 0 included (Gu et al.)

    def nan_indicator(c):
        return torch.where(torch.isnan(c), c, (c < 0).to(c.dtype))

    return {
        "sink_rate": sink_col[:, :, 1:].masked_fill(~seen[1:], nan).transpose(1, 2),
        "gu_score": gu_score,
        "gu_sink": (gu_score > eps).to(alpha.dtype),
        "value_norm_ratio": _finite_or_nan(vn0 / ((vnt * w[None, :, None]).sum(1) / n_tail)),
        "proj_norm_ratio": _finite_or_nan(pn0 / ((pnt * w[None, :, None]).sum(1) / n_tail)),
        "value_cos_tail": value_cos,
        "proj_cos_tail": proj_cos,
        "value_cos_negative": nan_indicator(value_cos),
        "proj_cos_negative": nan_indicator(proj_cos),
        "value_cos_mean_dir": gram_cosine(v0, m),
        "proj_cos_mean_dir": gram_cosine(v0, m, G),
    }


@dataclass
class SinkGeometryResult:
    """Tidy tables of :func:`sink_geometry`.

    - ``heads``: one row per (layer, head) with ``kv_head``, the mean of every statistic of the
      module docstring (``sink_rate`` with ``sink_rate_std``; ``gu_sink_share`` = share of
      sequences where the head's mean first-token attention exceeds ε; ``gu_score`` = that mean
      attention averaged over sequences) and ``n_sequences``;
    - ``layers``: per layer, the mean over heads (``gu_sink_share`` is then the Gu et al. share of
      sink heads of the layer, averaged over sequences);
    - ``sink_rate_hist``: counts of α_i0 per (layer, head, bin);
    - ``gu_sink_rate``: the model-level Gu et al. metric (share of all heads, mean over sequences).
    """

    heads: pd.DataFrame
    layers: pd.DataFrame
    sink_rate_hist: pd.DataFrame
    gu_sink_rate: float
    eps: float
    model_mode: str


class SinkGeometry(CorpusAnalysis):
    """Streaming accumulation of the statistics of :func:`layer_sink_statistics` (``[layer, head]``).

    >>> import geolens
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")  # 2 layers × 4 heads
    >>> sinks = SinkGeometry(model.cfg.n_layers, model.cfg.n_heads)
    >>> _ = geolens.run_corpus(model, tiny_tokens(model, length=16), [sinks], progress=False)
    >>> len(sinks.result().heads)  # a SinkGeometryResult, as sink_geometry returns: one row per (layer, head)
    8
    """

    def __init__(
        self, n_layers: int, n_heads: int, *, eps: float = GU_EPSILON, n_bins: int = 20, layers=None, mode: str = ""
    ):
        self.n_layers, self.n_heads, self.eps = int(n_layers), int(n_heads), float(eps)
        self.layers = list(range(n_layers)) if layers is None else [int(l) for l in layers]
        for name in HEAD_STATS:
            setattr(self, f"m_{name}", Moments((n_layers, n_heads)))
        self.hist = Histogram(torch.linspace(0, 1, n_bins + 1), (n_layers, n_heads))
        self.mode = mode
        self.n_kv_heads = n_heads
        self.out_of_window = Sum((n_layers, n_heads))  # queries ≥ 1 that cannot see the sink
        self.windows: dict = {}

    def hook_names(self, model) -> list[str]:
        return [hook_name(l, n) for l in self.layers for n in (PATTERN, VALUE)]

    def update(self, model, cache, tokens) -> None:
        self.mode = model_mode(model)
        for l in self.layers:
            view = get_attention_layer(model, cache, l, dtype=torch.float64)
            self.n_kv_heads = view.n_kv_heads
            window = sliding_window(model, l)
            self.windows[str(l)] = window
            stats = layer_sink_statistics(view, self.eps, window=window)
            n_q = view.pattern.shape[2]
            self.out_of_window.total[l] += float((~sink_visible(n_q, n_q, window)[1:]).sum()) * view.pattern.shape[0]
            for name in HEAD_STATS:
                x = stats[name]
                moments_add_at(getattr(self, f"m_{name}"), l, x.reshape(-1, self.n_heads), dim=0)
            histogram_add_at(self.hist, l, stats["sink_rate"].reshape(-1, self.n_heads), dim=0)

    def merge(self, other: "SinkGeometry") -> "SinkGeometry":
        for name in HEAD_STATS:
            getattr(self, f"m_{name}").merge(getattr(other, f"m_{name}"))
        self.hist.merge(other.hist)
        self.out_of_window.merge(other.out_of_window)
        self.windows = {**other.windows, **self.windows}
        return self

    def result(self) -> SinkGeometryResult:
        rows = []
        for l in self.layers:
            for h in range(self.n_heads):
                row = {"layer": l, "head": h, "kv_head": kv_head_of(h, self.n_heads, self.n_kv_heads)}
                for name in HEAD_STATS:
                    m = getattr(self, f"m_{name}")
                    key = "gu_sink_share" if name == "gu_sink" else name
                    row[key] = float(m.mean[l, h]) if m.count[l, h] > 0 else float("nan")
                row["sink_rate_std"] = float(self.m_sink_rate.std[l, h])
                row["n_queries"] = int(self.m_sink_rate.count[l, h])
                row["n_out_of_window"] = int(self.out_of_window.total[l, h])
                row["window"] = self.windows.get(str(l))
                row["n_sequences"] = int(self.m_gu_sink.count[l, h])
                rows.append(row)
        heads = pd.DataFrame(rows)
        stat_cols = [
            c
            for c in heads.columns
            if c not in ("layer", "head", "kv_head", "n_queries", "n_sequences", "n_out_of_window", "window")
        ]
        layers = heads.groupby("layer")[stat_cols].mean().reset_index()
        edges = self.hist.edges.numpy()
        hist_rows = [
            {"layer": l, "head": h, "bin_lo": edges[b], "bin_hi": edges[b + 1], "count": int(self.hist.counts[l, h, b])}
            for l in self.layers
            for h in range(self.n_heads)
            for b in range(len(edges) - 1)
        ]
        gu = float(np.nanmean(heads["gu_sink_share"])) if len(heads) else float("nan")
        return SinkGeometryResult(heads, layers, pd.DataFrame(hist_rows), gu, self.eps, self.mode)


def sink_geometry(
    model,
    tokens: torch.Tensor,
    *,
    batch_size: int = 8,
    eps: float = GU_EPSILON,
    layers=None,
    n_bins: int = 20,
    progress: bool = False,
) -> SinkGeometryResult:
    """Sink rate, Gu et al. sink share, sink/non-sink norm ratios and sink cosines per head.

    ``tokens`` ``[n, seq]`` must start with the sink (BOS) and be unpadded
    (:func:`geolens.data.corpus_windows` makes such windows). See the module docstring.

    >>> import geolens
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")  # 2 layers, 4 query heads sharing 2 kv heads
    >>> from geolens.sinks import sink_geometry
    >>> g = sink_geometry(model, tiny_tokens(model, length=16), batch_size=2)
    >>> len(g.heads), list(g.heads.columns[:4])  # one row per (layer, head)
    (8, ['layer', 'head', 'kv_head', 'sink_rate'])
    """
    return run_analysis(
        model,
        tokens,
        SinkGeometry,
        model.cfg.n_layers,
        model.cfg.n_heads,
        eps=eps,
        n_bins=n_bins,
        layers=layers,
        batch_size=batch_size,
        progress=progress,
        desc="sink geometry",
    )
