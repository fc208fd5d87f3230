"""Head output norm as a function of the sink rate (docs/method.md §4; Cunningham & Muça Cirone 2026, §3.3).

For every (layer, head) and query i ≥ 1, the sink rate α_i0 and the head output norm
‖o_i^h‖ = ‖z_i^h W_O^h‖ = sqrt(z_i G^h z_iᵀ) (b_O excluded, docs/method.md §1). Queries are binned by α_i0
(fixed edges on [0, 1], 20 bins by default); per bin the mean ‖o_i^h‖, its standard error and a
95% normal confidence interval (mean ± 1.96 sem). Per head and pooled over the heads of a layer.

Convexity test: a weighted least-squares quadratic ‖o‖ ≈ a s² + b s + c over the bin centres s
of the bins with at least ``min_count`` queries (weights = counts, i.e. the fit of all queries
replaced by their bin means). ``curvature`` = a (convex if a > 0); ``argmin`` = −b / 2a for a
convex fit (NaN otherwise); ``argmin_inside`` = 0 < argmin < 1 for a convex fit; also
``argmin_in_range`` (inside the observed range of bin centres), and the empirical minimum bin.
The claim of Cunningham & Muça Cirone (2026): convex, with the minimum at an intermediate sink rate
(< 1), not at α_i0 = 1.

Sliding-window layers (:mod:`geolens.visibility`): a query i ≥ W cannot see the sink, so it has no
sink rate; it is left out of the bins (not put in the α_i0 = 0 bin) and counted in
``NormCurveResult.n_out_of_window`` (per layer).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from geolens.adapter import PATTERN, VALUE, get_attention_layer, hook_name, model_mode, sliding_window
from geolens.geometry import head_output_norms
from geolens.runner import run_analysis
from geolens.sinks._accumulate import histogram_add_at
from geolens.streaming import CorpusAnalysis, Histogram, Sum
from geolens.visibility import sink_visible


def sink_rate_and_output_norm(layer, *, window: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(α_i0, ‖o_i^h‖) for queries i ≥ 1, each ``[batch·(query−1), head]``; α_i0 is NaN for the
    queries outside the sink's sliding ``window`` (so the histograms skip them)."""
    norm = head_output_norms(layer, slice(1, None))  # [b, q-1, h]
    rate = layer.pattern[:, :, 1:, 0].transpose(1, 2)
    n_q, n_k = layer.pattern.shape[-2:]
    unseen = ~sink_visible(n_q, n_k, window, device=rate.device)[-(n_q - 1) :][:, None] if n_q > 1 else None
    if unseen is not None and bool(unseen.any()):
        rate = rate.masked_fill(unseen, float("nan"))
    h = rate.shape[-1]
    return rate.reshape(-1, h), norm.reshape(-1, h)


def quadratic_fit(centres: np.ndarray, means: np.ndarray, counts: np.ndarray, min_count: int = 20) -> dict[str, float]:
    """Weighted quadratic fit of bin means (see module docstring); NaNs when < 3 usable bins."""
    keep = (counts >= min_count) & np.isfinite(means)
    out = {
        "n_bins_fit": int(keep.sum()),
        "curvature": np.nan,
        "slope": np.nan,
        "intercept": np.nan,
        "argmin": np.nan,
        "convex": False,
        "argmin_inside": False,
        "argmin_in_range": False,
        "empirical_argmin": np.nan,
        "rate_lo": np.nan,
        "rate_hi": np.nan,
    }
    if keep.sum() == 0:
        return out
    x, y, w = centres[keep], means[keep], counts[keep].astype(float)
    out["empirical_argmin"] = float(x[np.argmin(y)])
    out["rate_lo"], out["rate_hi"] = float(x.min()), float(x.max())
    if keep.sum() < 3:
        return out
    # minimise Σ w (y − a x² − b x − c)²  (np.polyfit weights multiply the residuals)
    a, b, c = np.polyfit(x, y, 2, w=np.sqrt(w))
    out.update(curvature=float(a), slope=float(b), intercept=float(c), convex=bool(a > 0))
    if a > 0:
        s = -b / (2 * a)
        out.update(argmin=float(s), argmin_inside=bool(0 < s < 1), argmin_in_range=bool(x.min() <= s <= x.max()))
    return out


class NormCurve(CorpusAnalysis):
    """Histograms of α_i0 with ‖o_i^h‖ as payload, per (layer, head) and per layer.

    >>> import geolens
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")  # 2 layers × 4 heads
    >>> curve = NormCurve(model.cfg.n_layers, model.cfg.n_heads)
    >>> _ = geolens.run_corpus(model, tiny_tokens(model, length=16), [curve], progress=False)
    >>> res = curve.result(min_count=1)  # a NormCurveResult, as output_norm_curve returns
    >>> sorted(set(res.curves.scope)), len(res.fits)  # one fit per head and one per layer
    (['head', 'layer'], 10)
    """

    def __init__(self, n_layers: int, n_heads: int, *, n_bins: int = 20, layers=None):
        self.n_layers, self.n_heads = int(n_layers), int(n_heads)
        self.layers = list(range(n_layers)) if layers is None else [int(l) for l in layers]
        edges = torch.linspace(0, 1, n_bins + 1)
        self.per_head = Histogram(edges, (n_layers, n_heads))
        self.per_layer = Histogram(edges, (n_layers,))
        self.out_of_window = Sum((n_layers,))  # queries ≥ 1 per layer that cannot see the sink
        self.mode = ""

    def hook_names(self, model) -> list[str]:
        return [hook_name(l, n) for l in self.layers for n in (PATTERN, VALUE)]

    def update(self, model, cache, tokens) -> None:
        self.mode = model_mode(model)
        for l in self.layers:
            rate, norm = sink_rate_and_output_norm(
                get_attention_layer(model, cache, l, dtype=torch.float64), window=sliding_window(model, l)
            )
            self.out_of_window.total[l] += float(torch.isnan(rate[:, 0]).sum())
            histogram_add_at(self.per_head, l, rate, norm, dim=0)
            histogram_add_at(self.per_layer, l, rate.reshape(-1), norm.reshape(-1), dim=0)

    def merge(self, other: "NormCurve") -> "NormCurve":
        self.per_head.merge(other.per_head)
        self.per_layer.merge(other.per_layer)
        self.out_of_window.merge(other.out_of_window)
        return self

    def result(self, min_count: int = 20) -> "NormCurveResult":
        edges = self.per_head.edges.numpy()
        centres = (edges[:-1] + edges[1:]) / 2
        curve_rows, fit_rows = [], []
        for scope, hist in (("head", self.per_head), ("layer", self.per_layer)):
            counts, means, sems = hist.counts.numpy(), hist.payload_mean.numpy(), hist.payload_sem.numpy()
            for l in self.layers:
                for h in range(self.n_heads) if scope == "head" else [-1]:
                    idx = (l, h) if scope == "head" else (l,)
                    c, m, s = counts[idx], means[idx], sems[idx]
                    for b in range(len(centres)):
                        curve_rows.append(
                            {
                                "scope": scope,
                                "layer": l,
                                "head": h,
                                "bin_lo": edges[b],
                                "bin_hi": edges[b + 1],
                                "sink_rate": centres[b],
                                "count": int(c[b]),
                                "mean_norm": m[b],
                                "sem": s[b],
                                "ci_lo": m[b] - 1.96 * s[b],
                                "ci_hi": m[b] + 1.96 * s[b],
                            }
                        )
                    fit_rows.append({"scope": scope, "layer": l, "head": h, **quadratic_fit(centres, m, c, min_count)})
        n_out = {l: int(self.out_of_window.total[l]) for l in self.layers}
        return NormCurveResult(pd.DataFrame(curve_rows), pd.DataFrame(fit_rows), min_count, self.mode, n_out)


@dataclass
class NormCurveResult:
    """``curves``: one row per (scope, layer, head, bin) — scope ``"head"`` or ``"layer"``
    (pooled, ``head = -1``) — with count, mean ‖o‖, sem and 95% CI; ``fits``: one row per curve
    with the quadratic fit (module docstring)."""

    curves: pd.DataFrame
    fits: pd.DataFrame
    min_count: int
    model_mode: str
    n_out_of_window: dict = field(default_factory=dict)  # layer → queries left out (sliding window)

    def summary(self) -> dict[str, float]:
        """Share of fitted curves (per scope) that are convex and have their argmin inside (0, 1)."""
        out = {}
        for scope in ("head", "layer"):
            f = self.fits[(self.fits.scope == scope) & (self.fits.n_bins_fit >= 3)]
            out[f"{scope}_n_fitted"] = int(len(f))
            out[f"{scope}_share_convex"] = float(f.convex.mean()) if len(f) else float("nan")
            out[f"{scope}_share_convex_argmin_inside"] = (
                float((f.convex & f.argmin_inside).mean()) if len(f) else float("nan")
            )
            out[f"{scope}_share_convex_argmin_in_range"] = (
                float((f.convex & f.argmin_in_range).mean()) if len(f) else float("nan")
            )
            out[f"{scope}_share_empirical_min_below_max_rate"] = (
                float((f.empirical_argmin < f.rate_hi).mean()) if len(f) else float("nan")
            )
        return out


def output_norm_curve(
    model,
    tokens: torch.Tensor,
    *,
    batch_size: int = 8,
    n_bins: int = 20,
    layers=None,
    min_count: int = 20,
    progress: bool = False,
) -> NormCurveResult:
    """Mean head output norm per sink-rate bin and its quadratic convexity fit (module docstring).

    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")  # 2 layers × 4 heads
    >>> curve = output_norm_curve(model, tiny_tokens(model, length=16), min_count=1)
    >>> curve.summary()["head_n_fitted"], curve.summary()["layer_n_fitted"]
    (8, 2)
    """
    return run_analysis(
        model,
        tokens,
        NormCurve,
        model.cfg.n_layers,
        model.cfg.n_heads,
        n_bins=n_bins,
        layers=layers,
        batch_size=batch_size,
        progress=progress,
        desc="norm curve",
        result_kwargs={"min_count": min_count},
    )
