"""Interventions on the sink value v_0 (docs/method.md §4, Cunningham & Muça Cirone 2026 §3.3).

The sink is position 0. Its value v_0 (``blocks.{l}.attn.hook_v[:, 0]``, which already includes
b_V) enters every head output as the term α_i0 ṽ_0 = α_i0 v_0 W_O. Three edits of v_0, for chosen
layers and heads, none of which touches the attention pattern of the edited layer:

- :func:`scale_sink_value_hooks`: v_0 ← λ v_0 (λ = 1 changes nothing, λ = 0 removes the sink's
  term α_i0 ṽ_0 from every head output; the attention mass α_i0 is *not* renormalised);
- :func:`mean_sink_value_hooks`: v_0 ← mean_{j>0} v_j of the same sequence and kv head;
- :func:`remove_sink_value_hooks`: v_0 ← 0 (the same as λ = 0).

Controls (:func:`sink_edit`, one spec per kind of :data:`SinkEditKind`, used by
:mod:`geolens.sinks.controls` to tell the sink's *norm* from its exact value):

- ``"rescale_mean_norm"``: v_0 ← v_0 · mean_{j≥1}‖v_j‖ / ‖v_0‖ (the norm of a typical token, the
  direction kept; per sequence and kv head, value space);
- ``"corpus_mean"``: v_0 ← the corpus mean of v_0 of that layer and kv head (computed beforehand);
- ``"rotate"``: v_0 ← ‖v_0‖ u with u a unit vector orthogonal to v_0: the seeded Gaussian
  direction g of (seed, layer, kv head) with its v_0 component removed (norm kept, direction turned
  by 90° in a random plane). With ``degrees=θ``: v_0 ← cos θ v_0 + sin θ ‖v_0‖ u, the rotation by θ
  in the plane spanned by v_0 and u (the same plane for every θ of one seed), which keeps ‖v_0‖ and
  moves v_0 by ‖Δv_0‖ = 2 sin(θ/2)‖v_0‖;
- ``"random_token"``: v_j ← λ v_j for one non-sink position j ≥ 1 (the same λ on an ordinary
  token: is it the *sink* that matters?).

:func:`sink_edit_query_heads` makes the same edits of v_0 for chosen *query* heads only, exactly
under grouped-query attention (see its docstring).

Each builder returns TransformerLens ``fwd_hooks`` ``[(hook_name, fn)]``; the context managers
:func:`scaled_sink_value`, :func:`mean_sink_value` and :func:`removed_sink_value` apply them
with :func:`geolens.interventions.base.applied` (hooks removed on any exit).

Grouped-query attention: ``hook_v`` has ``n_kv_heads`` heads and query head h reads kv head
``h // (n_heads // n_kv_heads)``. Editing v_0 of a kv head therefore edits it for *every* query
head of its group. Heads are chosen either with ``kv_heads=`` (kv-head indices; the affected
query heads are reported by :func:`affected_query_heads` and on the returned
:class:`SinkValueEdit`) or with ``heads=`` (query-head indices), which raises
:class:`PartialKVGroupError` if it names only part of a group, since no edit of ``hook_v`` can
change v_0 for some query heads of a group and not for others (:func:`sink_edit_query_heads`
edits the head outputs instead, and can).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterable, Iterator, Literal, Mapping, Sequence, get_args

import torch
from jaxtyping import Float
from torch import Tensor

from geolens.adapter import adapter_for, hook_name, n_kv_heads
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
    return adapter_for(model).group_size


def affected_query_heads(model, kv_heads: Iterable[int]) -> tuple[int, ...]:
    """Query heads that read the given kv heads: h with h // group in kv_heads."""
    return adapter_for(model).query_heads_of(kv_heads)


def kv_heads_of(model, heads: Iterable[int]) -> tuple[int, ...]:
    """kv heads of the query ``heads``; raises :class:`PartialKVGroupError` for partial groups."""
    adapter = adapter_for(model)
    n_heads = adapter.n_heads
    heads = sorted(set(int(h) for h in heads))
    bad = [h for h in heads if not 0 <= h < n_heads]
    if bad:
        raise IndexError(f"query heads {bad} out of range for a model with {n_heads} heads")
    kv = sorted({adapter.kv_head_of(h) for h in heads})
    for k in kv:
        group = set(adapter.query_heads_of([k]))
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
    def make(v, layer, kv):
        out = v.clone()
        out[:, 0] = make_v0(v).to(v.dtype)
        return out

    return _edit_values(model, layers, heads, kv_heads, make)


def _edit_values(model, layers, heads, kv_heads, make) -> SinkValueEdit:
    """Hooks replacing the selected kv heads' values by ``make(v_sel, layer, kv)`` in every layer.

    ``v_sel`` is ``hook_v[:, :, kv]`` ``[batch, pos, len(kv), d_head]``; ``make`` returns the
    edited tensor of that shape (the other kv heads are left as they are).
    """
    layers, kv = _resolve(model, layers, heads, kv_heads)
    index = torch.tensor(kv)

    def make_hook(layer):
        def hook(v: Float[Tensor, "batch pos kv_head d_head"], hook=None):
            if v.ndim != 4:
                raise ValueError(f"expected hook_v [batch, pos, kv_head, d_head], got {tuple(v.shape)}")
            out = v.clone()
            idx = index.to(v.device)
            out[:, :, idx] = make(v[:, :, idx], layer, kv).to(v.dtype)
            return out

        return hook

    return SinkValueEdit(
        layers, kv, affected_query_heads(model, kv), [(hook_name(l, VALUE), make_hook(l)) for l in layers]
    )


def scale_sink_value(model, lam: float, *, layers=None, heads=None, kv_heads=None) -> SinkValueEdit:
    """The edit v_0 ← λ v_0 with its affected heads (see :func:`scale_sink_value_hooks`).

    >>> from geolens.testing import tiny_bridge
    >>> model = tiny_bridge("gqa")  # 4 query heads sharing 2 kv heads
    >>> edit = scale_sink_value(model, 0.5, layers=[1], kv_heads=[0])  # apply with applied(model, edit.fwd_hooks)
    >>> edit.layers, edit.kv_heads, edit.query_heads, [name for name, _ in edit.fwd_hooks]
    ((1,), (0,), (0, 1), ['blocks.1.attn.hook_v'])
    """
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


SinkEditKind = Literal["scale", "remove", "mean_tail", "rescale_mean_norm", "corpus_mean", "rotate", "random_token"]
"""Every edit of a value that :func:`sink_edit` knows (see the module docstring)."""
SINK_EDIT_KINDS: tuple[str, ...] = get_args(SinkEditKind)
NORM_EDIT_KINDS: tuple[str, ...] = ("scale", "rescale_mean_norm")
"""Edits that change ‖v_0‖ and keep its direction."""
NORM_PRESERVING_KINDS: tuple[str, ...] = ("rotate", "corpus_mean")
"""Controls that keep ‖v_0‖ (rotate: exactly; corpus mean: the corpus' own sink value)."""


@dataclass(frozen=True)
class SinkEditSpec:
    """One edit: ``kind`` of :data:`SinkEditKind`, ``lam`` (scale, random_token), ``seed`` (rotate),
    ``degrees`` (rotate: the angle θ; ``None`` turns v_0 to the orthogonal direction, as 90°).

    >>> SinkEditSpec("rotate", seed=3, degrees=60).label
    'rotate 60° seed=3'
    """

    kind: str
    lam: float = 1.0
    seed: int = 0
    degrees: float | None = None

    def __post_init__(self):
        if self.kind not in SINK_EDIT_KINDS:
            raise ValueError(f"unknown sink edit kind {self.kind!r}; expected one of {', '.join(SINK_EDIT_KINDS)}")
        if not torch.isfinite(torch.tensor(float(self.lam))):
            raise ValueError(f"λ must be finite, got {self.lam}")
        if self.degrees is not None:
            if self.kind != "rotate":
                raise ValueError(f"degrees= is the angle of a rotation; {self.kind!r} takes none")
            if not math.isfinite(float(self.degrees)):
                raise ValueError(f"the rotation angle must be finite, got {self.degrees}")

    @property
    def label(self) -> str:
        if self.kind in ("scale", "random_token"):
            return f"{self.kind} λ={self.lam:g}"
        if self.kind == "rotate":
            return f"rotate seed={self.seed}" if self.degrees is None else f"rotate {self.degrees:g}° seed={self.seed}"
        return self.kind


def rotation_direction(seed: int, layer: int, n_kv: int, d_head: int) -> Tensor:
    """The seeded Gaussian directions g ``[n_kv, d_head]`` (float64) of :func:`sink_edit`'s rotate."""
    g = torch.Generator(device="cpu").manual_seed(int(seed) * 1_000_003 + int(layer))
    return torch.randn(n_kv, d_head, generator=g, dtype=torch.float64)


def _v0_edit(
    spec: SinkEditSpec, v: Tensor, layer: int, kv: tuple[int, ...], n_kv: int, corpus_means, position
) -> Tensor:
    """The edited ``v`` ``[batch, pos, len(kv), d_head]`` for one spec (computed in float64)."""
    x = v.to(torch.float64)
    out = x.clone()
    v0 = x[:, 0]  # [b, k, d]
    kind = spec.kind
    if kind == "scale":
        out[:, 0] = spec.lam * v0
    elif kind == "remove":
        out[:, 0] = 0
    elif kind == "mean_tail":
        if x.shape[1] < 2:
            raise ValueError("the mean non-sink value needs at least two positions")
        out[:, 0] = x[:, 1:].mean(1)
    elif kind == "rescale_mean_norm":
        if x.shape[1] < 2:
            raise ValueError("the mean non-sink value norm needs at least two positions")
        norm0 = v0.norm(dim=-1, keepdim=True)
        if bool((norm0 == 0).any()):
            raise ValueError(f"layer {layer}: v_0 is zero, it has no direction to rescale")
        out[:, 0] = v0 / norm0 * x[:, 1:].norm(dim=-1).mean(1)[..., None]
    elif kind == "corpus_mean":
        if corpus_means is None or layer not in corpus_means:
            raise ValueError(
                f"corpus_mean needs the corpus mean of v_0 for layer {layer} (corpus_means={{layer: [n_kv, d_head]}})"
            )
        mean = torch.as_tensor(corpus_means[layer], dtype=torch.float64, device=x.device)
        if mean.shape != (n_kv, x.shape[-1]):
            raise ValueError(
                f"corpus mean of layer {layer} has shape {tuple(mean.shape)}, expected {(n_kv, x.shape[-1])}"
            )
        out[:, 0] = mean[list(kv)]
    elif kind == "rotate":
        g = rotation_direction(spec.seed, layer, n_kv, x.shape[-1])[list(kv)].to(x.device)  # [k, d]
        norm0 = v0.norm(dim=-1, keepdim=True)
        unit = v0 / norm0.clamp_min(torch.finfo(torch.float64).tiny)
        u = g - (g * unit).sum(-1, keepdim=True) * unit
        u = u / u.norm(dim=-1, keepdim=True)
        if spec.degrees is None:
            out[:, 0] = norm0 * u
        else:
            theta = math.radians(float(spec.degrees))
            out[:, 0] = math.cos(theta) * v0 + math.sin(theta) * norm0 * u
    elif kind == "random_token":
        if position is None:
            raise ValueError("random_token needs position= (a non-sink position j ≥ 1, or one per row)")
        pos = torch.as_tensor(position, device=x.device).reshape(-1).long().expand(x.shape[0])
        if bool(((pos < 1) | (pos >= x.shape[1])).any()):
            raise IndexError(f"random_token positions {pos.tolist()} must lie in [1, {x.shape[1] - 1}]")
        rows = torch.arange(x.shape[0], device=x.device)
        out[rows, pos] = spec.lam * x[rows, pos]
    return out


def sink_edit(
    model,
    spec: SinkEditSpec | Sequence[SinkEditSpec],
    *,
    layers=None,
    heads=None,
    kv_heads=None,
    corpus_means: Mapping[int, Tensor] | None = None,
    position=None,
) -> SinkValueEdit:
    """The edit ``spec`` of the values in ``layers`` and heads (see the module docstring for kinds).

    ``spec`` may be a list: then row r of the batch gets ``spec[r]`` (the batch must have
    ``len(spec)`` rows), so that many edits of one sequence run in one forward pass
    (with :func:`geolens.interventions.masking.branch_hook`). ``corpus_means``: ``{layer:
    [n_kv_heads, d_head]}`` for ``corpus_mean``; ``position``: the non-sink position of
    ``random_token`` (an int or one per row).
    """
    specs = [spec] if isinstance(spec, SinkEditSpec) else list(spec)
    if not specs or not all(isinstance(s, SinkEditSpec) for s in specs):
        raise TypeError("spec must be a SinkEditSpec or a non-empty list of them")
    n_kv = n_kv_heads(model)
    single = isinstance(spec, SinkEditSpec)

    def make(v, layer, kv):
        if single:
            return _v0_edit(specs[0], v, layer, kv, n_kv, corpus_means, position)
        if v.shape[0] != len(specs):
            raise ValueError(f"{len(specs)} per-row edits for a batch of {v.shape[0]} rows")
        pos = None if position is None else torch.as_tensor(position).reshape(-1).expand(len(specs))
        rows = [
            _v0_edit(s, v[r : r + 1], layer, kv, n_kv, corpus_means, None if pos is None else pos[r])
            for r, s in enumerate(specs)
        ]
        return torch.cat(rows)

    # validate once on a dummy value so that a bad spec fails here, not inside a forward pass
    for s in specs:
        if s.kind == "corpus_mean" and corpus_means is None:
            raise ValueError("corpus_mean needs corpus_means={layer: [n_kv_heads, d_head]}")
        if s.kind == "random_token" and position is None:
            raise ValueError("random_token needs position= (a non-sink position j ≥ 1, or one per row)")
    return _edit_values(model, layers, heads, kv_heads, make)


def _query_head_selection(model, layers: tuple[int, ...], heads) -> dict[int, tuple[int, ...]]:
    """``{layer: query heads}`` from ``heads``: None (all), one list for every layer, or a mapping."""
    n_heads = adapter_for(model).n_heads
    if heads is None:
        chosen = {l: tuple(range(n_heads)) for l in layers}
    elif isinstance(heads, Mapping):
        extra = sorted(int(l) for l in heads if int(l) not in layers)
        if extra:
            raise ValueError(f"heads= names layers {extra} that the edit does not touch (layers {list(layers)})")
        chosen = {l: tuple(sorted({int(h) for h in heads.get(l, ())})) for l in layers}
    else:
        one = tuple(sorted({int(h) for h in ([heads] if isinstance(heads, int) else heads)}))
        chosen = {l: one for l in layers}
    bad = sorted({h for hs in chosen.values() for h in hs if not 0 <= h < n_heads})
    if bad:
        raise IndexError(f"query heads {bad} out of range for a model with {n_heads} heads")
    return chosen


def sink_edit_query_heads(
    model,
    spec: SinkEditSpec | Sequence[SinkEditSpec],
    *,
    layers=None,
    heads: Mapping[int, Iterable[int]] | Iterable[int] | None = None,
    corpus_means: Mapping[int, Tensor] | None = None,
) -> SinkValueEdit:
    """The edit ``spec`` of v_0 as seen by chosen query heads only, through the head outputs.

    Query head h of layer l reads v_0 of its kv head k(h) (grouped-query attention: k(h) =
    h // group). Replacing that v_0 by v_0' for head h alone changes only its output:
    z_i^h = Σ_j α_ij^h v_j^{k(h)} becomes z_i^h + α_i0^h (v_0' − v_0) for every query i, while the
    attention pattern, which does not depend on values, stays as it is. The hooks do exactly
    that: they read v_0 at ``hook_v`` and α_i0 at ``hook_pattern`` of the same forward, compute
    v_0' with the same edit as :func:`sink_edit` (the same v_0', so for all heads the two agree),
    and add α_i0^h (v_0' − v_0) at ``hook_z`` in float64 for the selected heads; the other heads'
    z is returned unchanged, bit for bit. So a query-head subset of a kv group can be edited, which
    ``hook_v`` cannot do (:class:`PartialKVGroupError`).

    ``heads``: the query heads to edit: ``None`` (all), one list for every layer, or ``{layer:
    heads}`` (a layer left out or given no head is not edited). ``spec``: one edit, or one per row
    of the batch (as :func:`sink_edit`). Every kind that edits v_0 is allowed; ``random_token``
    (which edits a non-sink value) is not.

    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")  # 4 query heads on 2 kv heads
    >>> edit = sink_edit_query_heads(model, SinkEditSpec("scale", 0.0), layers=[1], heads={1: [0]})
    >>> edit.query_heads, edit.kv_heads, [name for name, _ in edit.fwd_hooks]
    ((0,), (0,), ['blocks.1.attn.hook_v', 'blocks.1.attn.hook_pattern', 'blocks.1.attn.hook_z'])
    """
    specs = [spec] if isinstance(spec, SinkEditSpec) else list(spec)
    if not specs or not all(isinstance(s, SinkEditSpec) for s in specs):
        raise TypeError("spec must be a SinkEditSpec or a non-empty list of them")
    if any(s.kind == "random_token" for s in specs):
        raise ValueError("sink_edit_query_heads edits v_0 only; random_token edits a non-sink value (use sink_edit)")
    if any(s.kind == "corpus_mean" for s in specs) and corpus_means is None:
        raise ValueError("corpus_mean needs corpus_means={layer: [n_kv_heads, d_head]}")
    single = isinstance(spec, SinkEditSpec)
    layers, _ = _resolve(model, layers, None, None)
    chosen = _query_head_selection(model, layers, heads)
    adapter = adapter_for(model)
    n_kv = adapter.n_kv_heads
    all_kv = tuple(range(n_kv))
    seen: dict[tuple[str, int], Tensor] = {}

    def keep(what: str, layer: int):
        def hook(x: Tensor, hook=None):
            seen[(what, layer)] = x
            return None

        return hook

    def edit_z(layer: int, index: Tensor):
        def hook(z: Float[Tensor, "batch pos head d_head"], hook=None):
            v, pattern = seen.pop(("v", layer), None), seen.pop(("pattern", layer), None)
            if v is None or pattern is None:
                raise RuntimeError(f"layer {layer}: hook_z ran before hook_v and hook_pattern of the same forward")
            if not single and z.shape[0] != len(specs):
                raise ValueError(f"{len(specs)} per-row edits for a batch of {z.shape[0]} rows")
            rows = [
                _v0_edit(specs[0] if single else specs[r], v[r : r + 1], layer, all_kv, n_kv, corpus_means, None)[:, 0]
                for r in range(z.shape[0])
            ]
            delta = adapter.expand_kv(torch.cat(rows) - v[:, 0].to(torch.float64), dim=1)  # [b, head, d]
            idx = index.to(z.device)
            alpha0 = pattern[:, idx, :, 0].to(torch.float64).transpose(1, 2)  # [b, query, sel]
            out = z.clone()
            out[:, :, idx] = (z[:, :, idx].to(torch.float64) + alpha0[..., None] * delta[:, None, idx]).to(z.dtype)
            return out

        return hook

    hooks = []
    for l in layers:
        if not chosen[l]:
            continue
        hooks += [
            (adapter.value_hook(l), keep("v", l)),
            (adapter.pattern_hook(l), keep("pattern", l)),
            (adapter.z_hook(l), edit_z(l, torch.tensor(chosen[l]))),
        ]
    query = tuple(sorted({h for hs in chosen.values() for h in hs}))
    kv = tuple(sorted({adapter.kv_head_of(h) for h in query}))
    return SinkValueEdit(tuple(l for l in layers if chosen[l]), kv, query, hooks)


@contextmanager
def sink_edit_applied(model, spec, **kwargs) -> Iterator[SinkValueEdit]:
    """Context manager for :func:`sink_edit` (hooks removed on any exit)."""
    edit = sink_edit(model, spec, **kwargs)
    with applied(model, edit.fwd_hooks):
        yield edit


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
    "NORM_EDIT_KINDS",
    "NORM_PRESERVING_KINDS",
    "PartialKVGroupError",
    "SINK_EDIT_KINDS",
    "SinkEditKind",
    "SinkEditSpec",
    "SinkValueEdit",
    "rotation_direction",
    "sink_edit",
    "sink_edit_applied",
    "sink_edit_query_heads",
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
