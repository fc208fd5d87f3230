"""Keep only the top-N sources of every (layer, head, query): the deletion behind N* (docs/method.md §6).

For each hooked layer, head h and query i, the sources j ≤ i are ranked by attention α_ij
(``by="attention"``) or by contribution norm α_ij ‖v_j‖ (``by="norm"``, value space as in paper
B; ties by increasing index); the terms α_ij v_j of all but the top N are removed by setting
α_ij = 0 in ``hook_pattern`` **without renormalising** (docs/method.md §3's masking convention), so the
head output becomes Σ_{j∈top-N} α_ij v_j. Queries with at most N visible sources are unchanged.

``by="norm"`` needs v of the same layer: a ``hook_v`` hook stores it (it fires before
``hook_pattern`` in TransformerLens attention) and the pattern hook reads it; grouped-query
value heads are expanded to query heads (head h reads kv head h // group).
"""

from __future__ import annotations

from typing import Iterable

import torch

from geolens.adapter import PATTERN, VALUE, expand_kv_heads, hook_name


def keep_top_n_mask(score: torch.Tensor, n: int) -> torch.Tensor:
    """[batch, head, query, key] bool: the n largest causal scores per row (ties: lower index)."""
    n_q, n_k = score.shape[-2:]
    causal = torch.arange(n_k, device=score.device)[None, :] <= (
        torch.arange(n_q, device=score.device)[:, None] + n_k - n_q
    )
    masked = score.masked_fill(~causal, float("-inf"))
    order = torch.sort(masked, dim=-1, descending=True, stable=True).indices
    rank = torch.empty_like(order)
    rank.scatter_(-1, order, torch.arange(n_k, device=score.device).expand_as(order))
    return (rank < n) & causal


def keep_top_n_hooks(model, n: int, *, by: str = "attention", layers: Iterable[int] | None = None) -> list:
    """``fwd_hooks`` that keep only the top-``n`` sources per (layer, head, query)."""
    if by not in ("attention", "norm"):
        raise ValueError(f"by must be 'attention' or 'norm', got {by!r}")
    if int(n) < 1:
        raise ValueError(f"n must be ≥ 1, got {n}")
    layers = list(range(model.cfg.n_layers)) if layers is None else [int(l) for l in layers]
    n_heads = model.cfg.n_heads
    hooks = []
    for l in layers:
        store: dict = {}

        def save_v(v, hook, store=store):
            store["v_norm"] = expand_kv_heads(v, n_heads).norm(dim=-1).transpose(1, 2)  # [b, h, k]
            return v

        def keep(pattern, hook, store=store, layer=l):
            if by == "attention":
                score = pattern
            else:
                if "v_norm" not in store:
                    raise RuntimeError(f"layer {layer}: hook_v did not fire before hook_pattern; cannot rank by norm")
                score = pattern * store.pop("v_norm")[:, :, None, :].to(pattern.dtype)
            return pattern * keep_top_n_mask(score, int(n)).to(pattern.dtype)

        if by == "norm":
            hooks.append((hook_name(l, VALUE), save_v))
        hooks.append((hook_name(l, PATTERN), keep))
    return hooks
