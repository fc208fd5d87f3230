"""The three factors of influence and the attention baselines of one layer, read from a model's
cache (docs/method.md §1–2; Cunningham & Muça Cirone 2026, §2.1–2.2).

- :func:`influence_factors`: attention α_ij, relative norm ‖ṽ_j‖/‖o_i‖ and alignment cos(o_i, ṽ_j),
  whose product is the contribution weight c_ij (:class:`InfluenceFactors`);
- :func:`attention_metrics`: raw attention, value-weighted attention α‖ṽ‖ (Kobayashi et al. 2020),
  output-normalised α‖ṽ‖/‖o‖ and c_ij side by side (:class:`AttentionMetrics`).

Both read a layer as :func:`geolens.contribution_weights` does (:class:`~geolens.contributions.ReadOptions`)
and compute with :func:`~geolens.contributions.layer_metrics`, the one home of the efficient form.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from jaxtyping import Float
from torch import Tensor

from geolens.adapter import model_mode
from geolens.contributions import Mode, ReadOptions


@dataclass
class InfluenceFactors:
    """The three factors of Cunningham & Muça Cirone (2026, §2.1) per (batch, head, query, key); c = α·rel·cos.

    ``mode`` says which output o_i they refer to: the head's (intra) or the layer's (inter).
    ``model_mode`` records the TransformerLens mode that produced the cache (docs/tl-notes.md: the
    compatibility mode changes ṽ for LayerNorm models).
    """

    attention: Float[Tensor, "batch head query key"]
    relative_norm: Float[Tensor, "batch head query key"]  # ‖ṽ_j‖ / ‖o_i‖
    alignment: Float[Tensor, "batch head query key"]  # cos(o_i, ṽ_j)
    layer: int
    mode: Mode
    model_mode: str

    @property
    def contribution(self) -> Float[Tensor, "batch head query key"]:
        return self.attention * self.relative_norm * self.alignment


@dataclass
class AttentionMetrics:
    """Raw attention, the two value-weighted baselines and contribution weights, same shape.

    - ``raw_attention``: α_ij
    - ``value_weighted``: α_ij ‖ṽ_j‖ (Kobayashi et al. 2020)
    - ``output_normalized``: α_ij ‖ṽ_j‖ / ‖o_i‖
    - ``contribution``: c_ij = α_ij ‖ṽ_j‖/‖o_i‖ · cos(o_i, ṽ_j)

    Each tensor field is named after the metric of :mod:`geolens.metrics` it holds (its label,
    colour and description are there); ``METRIC_NAMES`` lists them in field order.
    """

    raw_attention: Float[Tensor, "batch head query key"]
    value_weighted: Float[Tensor, "batch head query key"]
    output_normalized: Float[Tensor, "batch head query key"]
    contribution: Float[Tensor, "batch head query key"]
    layer: int
    mode: Mode
    model_mode: str

    METRIC_NAMES = ()  # the tensor fields, set below the class

    def as_dict(self) -> dict[str, Tensor]:
        return {name: getattr(self, name) for name in self.METRIC_NAMES}


AttentionMetrics.METRIC_NAMES = tuple(f.name for f in fields(AttentionMetrics) if str(f.type).startswith("Float["))


def influence_factors(
    model,
    cache,
    layer: int,
    mode: Mode = "intra",
    *,
    dtype: torch.dtype = torch.float32,
    eps: float = 0.0,
    query_chunk_size: int | None = None,
    memory_budget_bytes: int | None = None,
    attention_mask: Tensor | None = None,
) -> InfluenceFactors:
    """Attention, relative norm ‖ṽ_j‖/‖o_i‖ and alignment cos(o_i, ṽ_j) (docs/method.md §1).

    Arguments as in :func:`contribution_weights`; padded positions (``attention_mask``) are 0.

    >>> import geolens
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")  # 2 layers, 4 query heads sharing 2 kv heads
    >>> _, cache = model.run_with_cache(tiny_tokens(model), names_filter=geolens.names_filter(model))
    >>> f = geolens.influence_factors(model, cache, layer=0)
    >>> c = geolens.contribution_weights(model, cache, layer=0)
    >>> bool(((f.attention * f.relative_norm * f.alignment) - c).abs().max() < 1e-5)  # c = α · ‖ṽ‖/‖o‖ · cos
    True
    """
    options = ReadOptions(dtype, eps, query_chunk_size, memory_budget_bytes, attention_mask)
    l, m = options.metrics(model, cache, layer, mode)
    return InfluenceFactors(m.attention, m.relative_norm, m.alignment, l, mode, model_mode(model))


def attention_metrics(
    model,
    cache,
    layer: int,
    mode: Mode = "intra",
    *,
    dtype: torch.dtype = torch.float32,
    eps: float = 0.0,
    query_chunk_size: int | None = None,
    memory_budget_bytes: int | None = None,
    attention_mask: Tensor | None = None,
) -> AttentionMetrics:
    """Raw attention, value-weighted, output-normalised value-weighted and contribution weights.

    All four are ``[batch, head, query, key]`` (docs/method.md §2 baselines). ``mode`` picks which output
    norm ‖o_i‖ the output-normalised baseline and the contribution weights use: the head's
    (``"intra"``) or the layer's (``"inter"``). Other arguments as in :func:`contribution_weights`
    (``attention_mask``: padded positions are 0 in all four).

    >>> import geolens
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")  # 2 layers, 4 query heads sharing 2 kv heads
    >>> _, cache = model.run_with_cache(tiny_tokens(model), names_filter=geolens.names_filter(model))
    >>> m = geolens.attention_metrics(model, cache, layer=1, mode="inter")
    >>> tuple(m.contribution.shape), round(float(m.contribution[0, :, 7].sum()), 4)  # Σ_h Σ_j c_ij = 1
    ((2, 4, 20, 20), 1.0)
    """
    options = ReadOptions(dtype, eps, query_chunk_size, memory_budget_bytes, attention_mask)
    l, m = options.metrics(model, cache, layer, mode)
    return AttentionMetrics(
        raw_attention=m.attention,
        value_weighted=m.attention * m.value_norm,
        output_normalized=m.attention * m.relative_norm,
        contribution=m.contribution,
        layer=l,
        mode=mode,
        model_mode=model_mode(model),
    )
