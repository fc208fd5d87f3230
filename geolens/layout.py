"""Where geolens finds its tensors in a forward pass: hook names, and the grouped-query rule (which
kv head each query head reads), shared by every model family (:mod:`geolens.adapter`).

Block hooks are spelled as ``transformer_lens.utils.get_act_name`` spells them
(``blocks.{layer}.attn.hook_pattern``); query head h reads kv head ``h // (n_heads // n_kv_heads)``
(``repeat_interleave``, as TransformerLens and Hugging Face pair them). This module imports nothing
from geolens, so that any module can use it (:func:`geolens.validation.check_cache_layers` reads
layer indices with :func:`hook_layer`).

>>> hook_name(3, PATTERN), hook_layer("blocks.3.attn.hook_pattern"), hook_layer("unembed.hook_out")
('blocks.3.attn.hook_pattern', 3, None)
>>> kv_group_size(9, 3), [kv_head_of(h, 4, 2) for h in range(4)]
(3, [0, 0, 1, 1])
"""

from __future__ import annotations

import re

from jaxtyping import Float
from torch import Tensor

PATTERN = "attn.hook_pattern"
VALUE = "attn.hook_v"
Z = "attn.hook_z"

_BLOCK_HOOK = re.compile(r"^blocks\.(\d+)\.")


def hook_name(layer: int, name: str) -> str:
    """``blocks.{layer}.{name}``, as ``transformer_lens.utils.get_act_name`` spells block hooks."""
    return f"blocks.{layer}.{name}"


def hook_layer(name: str) -> int | None:
    """The layer of a block hook name (the inverse of :func:`hook_name`), None for other hooks."""
    match = _BLOCK_HOOK.match(str(name))
    return None if match is None else int(match.group(1))


def kv_group_size(n_heads: int, n_kv_heads: int, *, what: str = "the model") -> int:
    """Query heads per kv head; query head h reads kv head ``h // kv_group_size(n_heads, n_kv_heads)``.

    This is TransformerLens' (and HF's) ``repeat_interleave`` pairing; ``repeat`` would pair heads
    wrongly (docs/tl-notes.md). ``what`` names the tensor in the error when n_kv_heads does not
    divide n_heads.
    """
    n_heads, n_kv_heads = int(n_heads), int(n_kv_heads)
    if n_kv_heads < 1 or n_heads % n_kv_heads:
        raise ValueError(f"{what} has {n_kv_heads} heads, which does not divide n_heads={n_heads}")
    return n_heads // n_kv_heads


def kv_head_of(head: int, n_heads: int, n_kv_heads: int) -> int:
    """The kv head that query ``head`` reads (:func:`kv_group_size`)."""
    return int(head) // kv_group_size(n_heads, n_kv_heads)


def expand_kv_heads(
    v: Float[Tensor, "batch key kv_head d_head"], n_heads: int, *, dim: int = 2, what: str = "hook_v"
) -> Float[Tensor, "batch key head d_head"]:
    """Align grouped-query heads (axis ``dim``) with query heads: head h reads kv head h // group.

    Returns ``v`` itself when it already has ``n_heads`` heads.
    """
    kv = v.shape[dim]
    if kv == n_heads:
        return v
    return v.repeat_interleave(kv_group_size(n_heads, kv, what=what), dim=dim)
