"""Attention vs contribution over a corpus, per (layer, head): what the report's first section measures.

For every layer l, head h, sequence and query i ≥ 1 (query 0 sees only itself), with α the
attention pattern and c the intra-head contribution weights of docs/method.md §2:

- ``sink_attention``: α_i0, the attention the query pays to the sink (position 0);
- ``sink_contribution``: c_i0 = α_i0 (‖ṽ_0‖/‖o_i‖) cos(o_i, ṽ_0), what the sink really adds;
- ``top1_agreement``: 1 if argmax_{j≤i} α_ij = argmax_{j≤i} c_ij (first index on ties), else 0;
- ``negative_share``: |{j ≤ i : c_ij < 0}| / (i + 1), the share of visible sources whose
  contribution is destructive (anti-aligned with the output).

Each is accumulated as streaming :class:`~geolens.streaming.Moments` over the samples
(sequence, query) for each (layer, head), so memory does not grow with the corpus and shards merge
exactly (:class:`~geolens.streaming.CorpusAnalysis` protocol). Cunningham & Muça Cirone 2026
(§3.2) argue that attention to the sink overstates its contribution; these numbers test that on
the model at hand.
In a sliding-window layer the visible sources are the last W keys, and a query that cannot see
the sink is left out of the two sink measures (:mod:`geolens.visibility`).
"""

from __future__ import annotations

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from geolens.adapter import get_attention_layer, required_hook_names, sliding_window
from geolens.contributions import contribution_weights_from_layer
from geolens.streaming import CorpusAnalysis, Moments
from geolens.visibility import visible_keys

MEASURES = ("sink_attention", "sink_contribution", "top1_agreement", "negative_share")


def contrast_samples(
    pattern: Float[Tensor, "batch head query key"],
    contribution: Float[Tensor, "batch head query key"],
    *,
    window: int | None = None,
) -> dict[str, Float[Tensor, "batch head query_minus_1"]]:
    """The four per-query measures of the module docstring for queries 1 … n−1, over the visible
    keys (within the sliding ``window`` of a local layer, :mod:`geolens.visibility`); the sink
    measures are NaN (left out) for a query that cannot see the sink."""
    n = pattern.shape[-1]
    if pattern.shape != contribution.shape or pattern.shape[-2] != n:
        raise ValueError(
            f"pattern {tuple(pattern.shape)} and contribution {tuple(contribution.shape)} must be equal and square"
        )
    if n < 2:
        raise ValueError("need at least two positions (the sink and one query)")
    visible = visible_keys(n, n, window, device=pattern.device)
    neg_inf = torch.tensor(float("-inf"), dtype=pattern.dtype, device=pattern.device)
    top_a = torch.where(visible, pattern, neg_inf).argmax(-1)
    top_c = torch.where(visible, contribution, neg_inf).argmax(-1)
    negatives = ((contribution < 0) & visible).sum(-1).to(pattern.dtype)
    n_visible = visible.sum(-1).to(pattern.dtype)
    unseen = ~visible[1:, 0]
    return {
        "sink_attention": pattern[:, :, 1:, 0].masked_fill(unseen, float("nan")),
        "sink_contribution": contribution[:, :, 1:, 0].masked_fill(unseen, float("nan")),
        "top1_agreement": (top_a == top_c)[:, :, 1:].to(pattern.dtype),
        "negative_share": (negatives / n_visible)[:, :, 1:],
    }


class ContributionContrast(CorpusAnalysis):
    """Streaming per-(layer, head) means of the four measures of the module docstring."""

    def __init__(self, n_layers: int, n_heads: int):
        self.n_layers, self.n_heads = int(n_layers), int(n_heads)
        for name in MEASURES:
            setattr(self, name, Moments((self.n_layers, self.n_heads)))

    @classmethod
    def for_model(cls, model) -> "ContributionContrast":
        return cls(model.cfg.n_layers, model.cfg.n_heads)

    def hook_names(self, model) -> list[str]:
        return required_hook_names(model)

    def update(self, model, cache, tokens) -> None:
        per_layer = {name: [] for name in MEASURES}
        for l in range(self.n_layers):
            layer = get_attention_layer(model, cache, l)
            samples = contrast_samples(
                layer.pattern, contribution_weights_from_layer(layer, "intra"), window=sliding_window(model, l)
            )
            for name, x in samples.items():  # [b, h, q-1] -> [b*(q-1), h]
                per_layer[name].append(x.permute(0, 2, 1).reshape(-1, x.shape[1]))
        for name, xs in per_layer.items():
            getattr(self, name).update(torch.stack(xs, dim=1), dim=0)  # [samples, layer, head]

    def merge(self, other: "ContributionContrast") -> "ContributionContrast":
        if (other.n_layers, other.n_heads) != (self.n_layers, self.n_heads):
            raise ValueError("cannot merge contrasts of models with different shapes")
        for name in MEASURES:
            getattr(self, name).merge(getattr(other, name))
        return self

    def per_head(self) -> pd.DataFrame:
        """One row per (layer, head): mean and standard error of each measure, and the count."""
        rows = {"layer": [], "head": []}
        for l in range(self.n_layers):
            for h in range(self.n_heads):
                rows["layer"].append(l)
                rows["head"].append(h)
        out = pd.DataFrame(rows)
        for name in MEASURES:
            m = getattr(self, name)
            out[name] = m.mean.flatten().numpy()
            out[f"{name}_sem"] = m.sem.flatten().numpy()
        out["n_queries"] = self.sink_attention.count.flatten().numpy().astype(int)
        return out

    def per_layer(self) -> pd.DataFrame:
        """Head means of each measure per layer (every head has the same number of samples)."""
        frame = self.per_head()
        return frame.groupby("layer")[list(MEASURES)].mean().reset_index()

    def overall(self) -> dict[str, float]:
        """Means over all layers, heads and samples."""
        if float(self.sink_attention.count.sum()) == 0:
            raise ValueError("no batch was added")
        return {name: float(getattr(self, name).mean.mean()) for name in MEASURES}

    def result(self) -> dict:
        return {"per_head": self.per_head(), "per_layer": self.per_layer(), "overall": self.overall()}
