"""Interventions on the sink value v_0 (docs/method.md §4, paper A §3.3).

The sink is position 0. Its value v_0 (``blocks.{l}.attn.hook_v[:, 0]``, which already includes
b_V) enters every head output as the term α_i0 ṽ_0 = α_i0 v_0 W_O. Three edits of v_0, for chosen
layers and heads, none of which touches the attention pattern of the edited layer:

- :func:`scale_sink_value_hooks`: v_0 ← λ v_0 (λ = 1 changes nothing, λ = 0 removes the sink's
  term α_i0 ṽ_0 from every head output; the attention mass α_i0 is *not* renormalised);
- :func:`mean_sink_value_hooks`: v_0 ← mean_{j>0} v_j of the same sequence and kv head;
- :func:`remove_sink_value_hooks`: v_0 ← 0 (the same as λ = 0).

Each builder returns TransformerLens ``fwd_hooks`` ``[(hook_name, fn)]``; the context managers
:func:`scaled_sink_value`, :func:`mean_sink_value` and :func:`removed_sink_value` apply them
with :func:`geolens.interventions.base.applied` (hooks removed on any exit).

Grouped-query attention: ``hook_v`` has ``n_kv_heads`` heads and query head h reads kv head
``h // (n_heads // n_kv_heads)``. Editing v_0 of a kv head therefore edits it for *every* query
head of its group. Heads are chosen either with ``kv_heads=`` (kv-head indices; the affected
query heads are reported by :func:`affected_query_heads` and on the returned
:class:`SinkValueEdit`) or with ``heads=`` (query-head indices), which raises
:class:`PartialKVGroupError` if it names only part of a group, since no edit of ``hook_v`` can
change v_0 for some query heads of a group and not for others.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from geolens.adapter import hook_name, n_kv_heads
from geolens.interventions.base import applied

VALUE = "attn.hook_v"


class PartialKVGroupError(ValueError):
    """``heads=`` selected some but not all query heads that share one kv head."""


@dataclass(frozen=True)
class SinkValueEdit:
    """Which (layer, kv head) pairs an edit touches and the query heads that see it."""

    layers: tuple[int, ...]
    kv_heads: tuple[int, ...]
    query_heads: tuple[int, ...]
    fwd_hooks: list


def group_size(model) -> int:
    """Query heads per kv head (1 without grouped-query attention)."""
    n_heads, n_kv = int(model.cfg.n_heads), n_kv_heads(model)
    if n_heads % n_kv:
        raise ValueError(f"n_heads={n_heads} is not a multiple of n_kv_heads={n_kv}")
    return n_heads // n_kv


def affected_query_heads(model, kv_heads: Iterable[int]) -> tuple[int, ...]:
    """Query heads that read the given kv heads: h with h // group in kv_heads."""
    g = group_size(model)
    kv = sorted(set(int(k) for k in kv_heads))
    return tuple(h for k in kv for h in range(k * g, (k + 1) * g))


def kv_heads_of(model, heads: Iterable[int]) -> tuple[int, ...]:
    """kv heads of the query ``heads``; raises :class:`PartialKVGroupError` for partial groups."""
    g = group_size(model)
    n_heads = int(model.cfg.n_heads)
    heads = sorted(set(int(h) for h in heads))
    bad = [h for h in heads if not 0 <= h < n_heads]
    if bad:
        raise IndexError(f"query heads {bad} out of range for a model with {n_heads} heads")
    kv = sorted({h // g for h in heads})
    for k in kv:
        group = set(range(k * g, (k + 1) * g))
        if not group <= set(heads):
            raise PartialKVGroupError(
                f"query heads {sorted(group & set(heads))} share kv head {k} with {sorted(group - set(heads))}: "
                f"editing v_0 of kv head {k} changes all query heads {sorted(group)} "
                "(grouped-query attention). Select whole groups, or pass kv_heads= instead."
            )
    return tuple(kv)


def _resolve(model, layers, heads, kv_heads) -> tuple[tuple[int, ...], tuple[int, ...]]:
    n_layers = int(model.cfg.n_layers)
    if layers is None:
        layers = range(n_layers)
    elif isinstance(layers, int):
        layers = [layers]
    bad = [l for l in layers if not -n_layers <= int(l) < n_layers]
    if bad:
        raise IndexError(f"layers {bad} out of range for a model with {n_layers} layers")
    layers = tuple(sorted({int(l) % n_layers for l in layers}))
    if heads is not None and kv_heads is not None:
        raise ValueError("pass either heads= (query heads, whole kv groups) or kv_heads=, not both")
    n_kv = n_kv_heads(model)
    if heads is not None:
        kv = kv_heads_of(model, [heads] if isinstance(heads, int) else heads)
    elif kv_heads is not None:
        kv = tuple(sorted({int(k) for k in ([kv_heads] if isinstance(kv_heads, int) else kv_heads)}))
        bad = [k for k in kv if not 0 <= k < n_kv]
        if bad:
            raise IndexError(f"kv heads {bad} out of range for a model with {n_kv} kv heads")
    else:
        kv = tuple(range(n_kv))
    if not layers or not kv:
        raise ValueError("the edit selects no layer or no head")
    return layers, kv


def _edit(model, layers, heads, kv_heads, make_v0) -> SinkValueEdit:
    layers, kv = _resolve(model, layers, heads, kv_heads)
    index = torch.tensor(kv)

    def hook(v: Float[Tensor, "batch pos kv_head d_head"], hook=None):
        if v.ndim != 4:
            raise ValueError(f"expected hook_v [batch, pos, kv_head, d_head], got {tuple(v.shape)}")
        out = v.clone()
        idx = index.to(v.device)
        out[:, 0, idx] = make_v0(v[:, :, idx]).to(v.dtype)
        return out

    return SinkValueEdit(layers, kv, affected_query_heads(model, kv), [(hook_name(l, VALUE), hook) for l in layers])


def scale_sink_value(model, lam: float, *, layers=None, heads=None, kv_heads=None) -> SinkValueEdit:
    """The edit v_0 ← λ v_0 with its affected heads (see :func:`scale_sink_value_hooks`)."""
    lam = float(lam)
    if not torch.isfinite(torch.tensor(lam)):
        raise ValueError(f"λ must be finite, got {lam}")
    return _edit(model, layers, heads, kv_heads, lambda v: lam * v[:, 0])


def scale_sink_value_hooks(model, lam: float, *, layers=None, heads=None, kv_heads=None) -> list:
    """``fwd_hooks`` multiplying the sink value v_0 by ``lam`` in ``layers`` (default all).

    ``heads``: query heads (must be whole kv groups, else :class:`PartialKVGroupError`);
    ``kv_heads``: kv heads (all query heads of each group are affected); default all heads.
    """
    return scale_sink_value(model, lam, layers=layers, heads=heads, kv_heads=kv_heads).fwd_hooks


def mean_sink_value(model, *, layers=None, heads=None, kv_heads=None) -> SinkValueEdit:
    """The edit v_0 ← mean_{j>0} v_j (per sequence and kv head)."""

    def mean_tail(v):
        if v.shape[1] < 2:
            raise ValueError("the mean non-sink value needs at least two positions")
        return v[:, 1:].mean(dim=1)

    return _edit(model, layers, heads, kv_heads, mean_tail)


def mean_sink_value_hooks(model, *, layers=None, heads=None, kv_heads=None) -> list:
    """``fwd_hooks`` replacing v_0 by the mean non-sink value mean_{j>0} v_j of its sequence."""
    return mean_sink_value(model, layers=layers, heads=heads, kv_heads=kv_heads).fwd_hooks


def remove_sink_value(model, *, layers=None, heads=None, kv_heads=None) -> SinkValueEdit:
    """The edit v_0 ← 0: the term α_i0 ṽ_0 leaves every affected head output."""
    return _edit(model, layers, heads, kv_heads, lambda v: torch.zeros_like(v[:, 0]))


def remove_sink_value_hooks(model, *, layers=None, heads=None, kv_heads=None) -> list:
    """``fwd_hooks`` setting v_0 to 0 (the same as λ = 0)."""
    return remove_sink_value(model, layers=layers, heads=heads, kv_heads=kv_heads).fwd_hooks


@contextmanager
def scaled_sink_value(model, lam: float, *, layers=None, heads=None, kv_heads=None) -> Iterator[SinkValueEdit]:
    """``with scaled_sink_value(model, 0.5, layers=[3]) as edit:`` runs with v_0 ← λ v_0."""
    edit = scale_sink_value(model, lam, layers=layers, heads=heads, kv_heads=kv_heads)
    with applied(model, edit.fwd_hooks):
        yield edit


@contextmanager
def mean_sink_value_applied(model, *, layers=None, heads=None, kv_heads=None) -> Iterator[SinkValueEdit]:
    """Context manager for :func:`mean_sink_value`."""
    edit = mean_sink_value(model, layers=layers, heads=heads, kv_heads=kv_heads)
    with applied(model, edit.fwd_hooks):
        yield edit


@contextmanager
def removed_sink_value(model, *, layers=None, heads=None, kv_heads=None) -> Iterator[SinkValueEdit]:
    """Context manager for :func:`remove_sink_value`."""
    edit = remove_sink_value(model, layers=layers, heads=heads, kv_heads=kv_heads)
    with applied(model, edit.fwd_hooks):
        yield edit


__all__: Sequence[str] = [
    "PartialKVGroupError",
    "SinkValueEdit",
    "affected_query_heads",
    "group_size",
    "kv_heads_of",
    "mean_sink_value",
    "mean_sink_value_applied",
    "mean_sink_value_hooks",
    "remove_sink_value",
    "remove_sink_value_hooks",
    "removed_sink_value",
    "scale_sink_value",
    "scale_sink_value_hooks",
    "scaled_sink_value",
]
