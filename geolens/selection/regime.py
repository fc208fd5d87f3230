"""The sink-aware regime fitted on a corpus (docs/method.md §5; the assumptions of Mudarisov et al. 2026).

The analysis of Mudarisov et al. (2026) assumes (i) stable non-sink value norms with a compressed sink,
(ii) an exponential decay of cross-token similarity with distance and (iii) a piecewise attention profile
(plateau, oscillation, recency). :class:`RegimeAnalysis` measures, per (layer, head) and window,
with u_j the value vector (``space="value"``) or ṽ_j = v_j W_O (``"projected"``):

- ``norm_spread``: coefficient of variation std_{j>0} ‖u_j‖ / mean_{j>0} ‖u_j‖ (small = stable);
- ``coherence``: ‖mean_{j>0} u_j / ‖u_j‖‖ (1 = all non-sink values share one direction);
- ``sink_norm_ratio``: ‖u_0‖ / mean_{j>0} ‖u_j‖ (< 1 = compressed sink);
- ``sink_alignment``: mean_{j>0} cos(u_0, u_j) (signed);
- ``similarity by lag``: sim(δ) = mean over non-sink pairs with i − j = δ of cos(u_i, u_j);
- ``attention profile``: mean α_{t, t−δ} of the final query t at each distance δ (δ = 0 is the
  current token, δ = t the sink).

Each quantity is averaged over windows. :func:`fit_exponential_decay` then fits
sim(δ) ≈ c + a·exp(−δ/λ) per head (λ on a log grid, a and c by least squares for each λ) and
reports λ, a, c, the RMSE and R² of the fit.

Sliding-window layers (:mod:`geolens.visibility`, window W): the sink statistics use the tokens
that share a window with the sink (1 ≤ j ≤ W − 1); the attention profile of the final query is
NaN beyond its window (δ ≥ W: not "attention 0"); the lag similarities are kept for every lag (a
property of the value sequence) but the decay is fitted on the lags a query can see, δ ≤ W − 1.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from geolens.adapter import PATTERN, VALUE, get_attention_layer, hook_name, model_mode, sliding_window
from geolens.streaming import CorpusAnalysis, Moments, Sum
from geolens.validation import check_choice
from geolens.visibility import sink_window_keys

EPS = 1e-12


def _unit_values(layer, space: str) -> tuple[Tensor, Tensor]:
    """(u [b, h, k, dim], ‖u‖ [b, h, k]) in the chosen space (ṽ materialised for 'projected')."""
    u = layer.v.permute(0, 2, 1, 3)  # [b, h, k, d]
    if check_choice(space, ("value", "projected"), name="space") == "projected":
        u = torch.einsum("bhkd,hdm->bhkm", u, layer.W_O)
    return u, u.norm(dim=-1)


def window_regime(layer, space: str = "value", *, window: int | None = None) -> dict[str, Tensor]:
    """Per-window regime quantities ``[batch, head]`` and ``lag_sim`` ``[batch, head, lag]``.

    ``lag_sim[..., δ−1]`` is the mean cos(u_i, u_j) over non-sink pairs with i − j = δ
    (δ = 1 … K−2). With a sliding ``window`` W the sink quantities use 1 ≤ j ≤ W − 1.
    """
    u, n = _unit_values(layer, space)
    K = u.shape[2]
    if K < 3:
        raise ValueError("the regime fit needs windows of at least 3 tokens")
    rest, n_rest = u[:, :, 1:], n[:, :, 1:]
    mean_norm = n_rest.mean(-1)
    unit = rest / (n_rest[..., None] + EPS)
    u0 = u[:, :, 0]
    cos0 = (unit * u0[:, :, None]).sum(-1) / (n[:, :, :1] + EPS)
    with_sink = sink_window_keys(K, window, device=u.device)[1:]  # [K-1]
    sink_mean_norm = n_rest[..., with_sink].mean(-1)
    C = unit @ unit.transpose(-1, -2)  # [b, h, K-1, K-1]
    i, j = torch.tril_indices(K - 1, K - 1, offset=-1, device=u.device)
    lag = i - j  # 1 … K-2
    sums = torch.zeros(C.shape[:2] + (K - 2,), dtype=C.dtype, device=C.device)
    sums.index_add_(-1, lag - 1, C[..., i, j])
    counts = torch.bincount(lag - 1, minlength=K - 2).to(C.dtype)
    return {
        "norm_spread": n_rest.std(-1, unbiased=False) / (mean_norm + EPS),
        "coherence": unit.mean(-2).norm(dim=-1),
        "sink_norm_ratio": n[:, :, 0] / (sink_mean_norm + EPS),
        "sink_alignment": cos0[..., with_sink].mean(-1),
        "lag_sim": sums / counts,
    }


def attention_profile(
    pattern: Float[Tensor, "batch head query key"], *, window: int | None = None
) -> Float[Tensor, "batch head distance"]:
    """α_{t, t−δ} of the final query t for δ = 0 … t (δ = t is the sink); NaN for δ ≥ W, the
    keys outside a sliding ``window``."""
    prof = pattern[:, :, -1].flip(-1)
    if window is not None and window < prof.shape[-1]:
        prof = prof.clone()
        prof[..., window:] = float("nan")
    return prof


SCALARS = ("norm_spread", "coherence", "sink_norm_ratio", "sink_alignment")


class RegimeAnalysis(CorpusAnalysis):
    """Window-averaged regime quantities per (layer, head); see the module docstring."""

    def __init__(self, n_layers: int, n_heads: int, seq_len: int, *, space: str = "value"):
        check_choice(space, ("value", "projected"), name="space")
        self.n_layers, self.n_heads, self.seq_len, self.space = n_layers, n_heads, seq_len, space
        self.scalars = {k: Moments((n_layers, n_heads)) for k in SCALARS}
        self.lag_sim = Moments((n_layers, n_heads, seq_len - 2))
        self.profile = Moments((n_layers, n_heads, seq_len))
        self.n_windows = Sum(())
        self.model_mode = ""
        self.windows: dict = {}  # layer (str) → sliding window or None

    @classmethod
    def for_model(cls, model, seq_len: int, **kwargs) -> "RegimeAnalysis":
        return cls(model.cfg.n_layers, model.cfg.n_heads, seq_len, **kwargs)

    def hook_names(self, model) -> list[str]:
        return [hook_name(l, n) for l in range(self.n_layers) for n in (PATTERN, VALUE)]

    def state_dict(self):
        out = {k: v for k, v in vars(self).items() if k != "scalars"}
        out = {k: ({"__acc__": v.state_dict()} if hasattr(v, "merge") else v) for k, v in out.items()}
        out["scalars"] = {k: v.state_dict() for k, v in self.scalars.items()}
        return out

    def load_state_dict(self, state):
        for k, v in state.items():
            if k == "scalars":
                for kk, vv in v.items():
                    self.scalars[kk].load_state_dict(vv)
            elif isinstance(v, dict) and "__acc__" in v:
                getattr(self, k).load_state_dict(v["__acc__"])
            else:
                setattr(self, k, v)
        return self

    def update(self, model, cache, tokens) -> None:
        self.model_mode = model_mode(model)
        if tokens.shape[1] != self.seq_len:
            raise ValueError(f"RegimeAnalysis was built for windows of {self.seq_len} tokens, got {tokens.shape[1]}")
        per = {k: [] for k in SCALARS + ("lag_sim", "profile")}
        for l in range(self.n_layers):
            layer = get_attention_layer(model, cache, l)
            window = sliding_window(model, l)
            self.windows[str(l)] = window
            w = window_regime(layer, self.space, window=window)
            for k in SCALARS + ("lag_sim",):
                per[k].append(w[k])
            per["profile"].append(attention_profile(layer.pattern, window=window))
        for k in SCALARS:
            self.scalars[k].update(torch.stack(per[k], 1), dim=0)  # [b, L, H]
        self.lag_sim.update(torch.stack(per["lag_sim"], 1), dim=0)
        self.profile.update(torch.stack(per["profile"], 1), dim=0)
        self.n_windows.update(float(tokens.shape[0]))

    def merge(self, other: "RegimeAnalysis") -> "RegimeAnalysis":
        for k in SCALARS:
            self.scalars[k].merge(other.scalars[k])
        self.lag_sim.merge(other.lag_sim)
        self.profile.merge(other.profile)
        self.n_windows.merge(other.n_windows)
        self.model_mode = self.model_mode or other.model_mode
        self.windows = {**other.windows, **self.windows}
        return self

    def result(self) -> dict:
        """``heads`` (one row per head: the four scalars and the decay fit), ``lag_sim``
        ``[layer, head, lag]``, ``profile`` ``[layer, head, distance]`` and ``summary``
        (medians over heads)."""
        lag = self.lag_sim.mean.numpy()
        fit = fit_exponential_decay(lag)
        for l in range(self.n_layers):  # local layers: fit on the lags a query sees, δ ≤ W − 1
            w = self.windows.get(str(l))
            if w is not None and 3 <= w - 1 < lag.shape[-1]:
                part = fit_exponential_decay(lag[l, :, : w - 1])
                for k in fit:
                    fit[k][l] = part[k]
        rows = []
        for l in range(self.n_layers):
            for h in range(self.n_heads):
                row = dict(layer=l, head=h)
                for k in SCALARS:
                    row[k] = float(self.scalars[k].mean[l, h])
                for k, v in fit.items():
                    row[f"decay_{k}"] = float(v[l, h])
                rows.append(row)
        heads = pd.DataFrame(rows)
        summary = heads.drop(columns=["layer", "head"]).median().to_dict()
        return {
            "heads": heads,
            "lag_sim": lag,
            "profile": torch.where(self.profile.count > 0, self.profile.mean, torch.nan).numpy(),
            "summary": summary,
            "n_windows": int(self.n_windows.total),
            "space": self.space,
            "model_mode": self.model_mode,
        }


def fit_exponential_decay(sim: np.ndarray, lengths: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Fit sim(δ) ≈ c + a·exp(−δ/λ), δ = 1 … D, on the last axis of ``sim`` ``[..., D]``.

    For each λ of a log grid the best (a, c) is the linear least-squares solution; the λ with the
    smallest squared error wins. Returns arrays ``[...]``: ``length`` λ, ``amplitude`` a,
    ``offset`` c, ``rmse`` and ``r2`` (1 − SSE/SST).
    """
    y = np.asarray(sim, dtype=np.float64)
    D = y.shape[-1]
    if D < 3:
        raise ValueError("the decay fit needs at least 3 lags")
    delta = np.arange(1, D + 1, dtype=np.float64)
    lengths = np.geomspace(0.25, 4.0 * D, 120) if lengths is None else np.asarray(lengths, dtype=np.float64)
    flat = y.reshape(-1, D)
    best_sse = np.full(flat.shape[0], np.inf)
    best = np.zeros((flat.shape[0], 3))
    for lam in lengths:
        X = np.stack([np.exp(-delta / lam), np.ones(D)], axis=1)  # [D, 2]
        coef, *_ = np.linalg.lstsq(X, flat.T, rcond=None)  # [2, n]
        sse = ((X @ coef - flat.T) ** 2).sum(0)
        better = sse < best_sse
        best_sse = np.where(better, sse, best_sse)
        best[better] = np.stack([np.full(better.sum(), lam), coef[0, better], coef[1, better]], axis=1)
    sst = ((flat - flat.mean(1, keepdims=True)) ** 2).sum(1)
    shape = y.shape[:-1]
    return {
        "length": best[:, 0].reshape(shape),
        "amplitude": best[:, 1].reshape(shape),
        "offset": best[:, 2].reshape(shape),
        "rmse": np.sqrt(best_sse / D).reshape(shape),
        "r2": np.where(sst > 0, 1 - best_sse / np.where(sst > 0, sst, 1), np.nan).reshape(shape),
    }
