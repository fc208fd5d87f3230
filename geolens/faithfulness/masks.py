"""Each metric's scores on one sequence and the removal masks they give under a :class:`~geolens.faithfulness.protocol.MaskingConfig`."""

from __future__ import annotations

from typing import Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor

from geolens.adapter import get_attention_layer, names_filter
from geolens.faithfulness.protocol import DIRECTIONS, MaskingConfig
from geolens.interventions.masking import removal_masks, removal_ranks
from geolens.metrics import LayerInputs, SequenceInputs, check_metric_names, get_metric, metric_names


def metric_scores(
    model,
    tokens: Int[Tensor, "1 pos"],
    protocol: MaskingConfig,
    metrics: Sequence[str] | None = None,
    *,
    seed: int = 0,
    value_zeroing_chunk: int | None = None,
    cache=None,
) -> dict[str, Float[Tensor, "layer 1 head query key"]]:
    """Each metric's scores on the protocol's layers for one sequence (``metrics``: names in
    :mod:`geolens.metrics`; None = every registered metric).

    The head axis is n_heads, or 1 for a score shared by every head: Value Zeroing always, and
    every metric under ``source`` ranking (scores summed over heads; ``contribution_abs`` is then
    |Σ_h c_ij^h|, the magnitude of the source's total contribution). ``cache`` (a
    ``run_with_cache`` of ``tokens`` holding pattern and v of those layers) saves a forward.
    """
    metrics = metric_names() if metrics is None else metrics
    check_metric_names(metrics)
    layers = protocol.resolved_layers(model)
    summed = protocol.ranking == "source"
    specs = {m: get_metric(m) for m in metrics}
    out: dict[str, Tensor] = {}
    wanted = [m for m in metrics if specs[m].per_layer]
    if wanted:
        if cache is None:
            with torch.no_grad():
                _, cache = model.run_with_cache(tokens, names_filter=names_filter(model, layers))
        per_layer = {m: [] for m in wanted}
        for l in layers:
            inputs = LayerInputs.from_layer(get_attention_layer(model, cache, l), protocol.mode)
            for m in wanted:
                per_layer[m].append(specs[m].layer_scores(inputs, summed))
        del cache
        for m in wanted:
            out[m] = torch.stack(per_layer[m])
    inputs = SequenceInputs(model, tokens, layers, 1 if summed else model.cfg.n_heads, seed, value_zeroing_chunk)
    for m in metrics:
        if not specs[m].per_layer:
            out[m] = specs[m].scores(inputs)
    return {m: out[m] for m in metrics}


def ranked_removals(scores: Tensor, protocol: MaskingConfig) -> dict[str, tuple[Tensor, Tensor, Tensor]]:
    """:func:`removal_ranks` of one metric's scores for each direction, under the protocol."""
    return {
        d: removal_ranks(
            scores,
            scope=protocol.ranking,
            largest=d == "comprehensiveness",
            allow_sink=protocol.allow_sink,
            allow_current=protocol.allow_current,
        )
        for d in DIRECTIONS
    }


def curve_masks(scores: Float[Tensor, "layer 1 head query key"], protocol: MaskingConfig) -> torch.Tensor:
    """Masks ``[layer, 2·n_k, head, query, key]``: comprehensiveness for each k, then sufficiency.

    The head axis is the scores' (n_heads or 1) except under ``source`` ranking (always 1).
    """
    options = dict(scope=protocol.ranking, allow_sink=protocol.allow_sink, allow_current=protocol.allow_current)
    return torch.cat(
        [
            m
            for d in DIRECTIONS
            for m in removal_masks(scores, protocol.fractions, largest=d == "comprehensiveness", **options)
        ],
        dim=1,
    )


def sink_only_mask(n_layers: int, n_pos: int) -> torch.Tensor:
    """``[layer, 1, 1, query, key]``: the sink's term α_i0 ṽ_0 removed for every query i ≥ 1, every head."""
    m = torch.zeros(n_layers, 1, 1, n_pos, n_pos, dtype=torch.bool)
    m[..., 1:, 0] = True
    return m
