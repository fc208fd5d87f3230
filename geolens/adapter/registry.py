"""Which family a model belongs to, and the model-level functions that ask it.

:func:`adapter_for` tries the families of :data:`FAMILIES` in order and builds (once per model,
held weakly) the first one whose ``matches(model)`` is true; :func:`register_family` adds a family
from anywhere, in one line. The free functions below (:func:`model_mode`, :func:`n_kv_heads`,
:func:`attn_out_hook`, :func:`sliding_window`, ...) delegate to ``adapter_for(model)``.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Iterable

from jaxtyping import Float
from torch import Tensor

from geolens.adapter.base import ModelAdapter, TLModel
from geolens.adapter.bridge import BridgeAdapter
from geolens.adapter.gemma import GemmaBridgeAdapter, GemmaHookedAdapter
from geolens.adapter.hooked import HookedAdapter
from geolens.adapter.olmo2 import Olmo2BridgeAdapter

FAMILIES: list[type[ModelAdapter]] = [
    Olmo2BridgeAdapter,
    GemmaBridgeAdapter,
    BridgeAdapter,
    GemmaHookedAdapter,
    HookedAdapter,
]
"""Tried in order by :func:`adapter_for`; a specialised family comes before its parent. Add to it
with :func:`register_family` (the HF-native backend registers its families when it is imported)."""

_ADAPTERS: "weakref.WeakKeyDictionary[Any, ModelAdapter]" = weakref.WeakKeyDictionary()


def register_family(*families: type[ModelAdapter], before: type[ModelAdapter] | None = None) -> None:
    """Make :func:`adapter_for` try ``families`` (subclasses of :class:`ModelAdapter`, each with a
    ``matches(model)`` classmethod), in the order given, ahead of ``before``.

    ``before`` defaults to the first registered family that one of them subclasses, so that a
    specialised family is tried before its parent, or, when they subclass none, to the first
    registered family. Models whose adapter was already built keep it. A family registered twice
    is refused: :func:`unregister_family` it first.

    >>> from geolens.adapter import BridgeAdapter
    >>> class MyBridge(BridgeAdapter):
    ...     family = "bridge-mine"
    ...     @classmethod
    ...     def matches(cls, model):
    ...         return BridgeAdapter.matches(model) and model.cfg.n_layers == 2
    >>> register_family(MyBridge)
    >>> FAMILIES.index(MyBridge) == FAMILIES.index(BridgeAdapter) - 1
    True
    >>> unregister_family(MyBridge)
    """
    for family in families:
        if not (isinstance(family, type) and issubclass(family, ModelAdapter)):
            raise TypeError(f"a model family is a subclass of geolens.adapter.ModelAdapter, got {family!r}")
        if family in FAMILIES:
            raise ValueError(f"{family.__name__} is already registered; unregister_family({family.__name__}) first")
    if len(set(families)) != len(families):
        raise ValueError("the same family is given twice")
    if before is None:
        parents = [i for i, known in enumerate(FAMILIES) if any(issubclass(f, known) for f in families)]
        at = min(parents, default=0)
    elif before in FAMILIES:
        at = FAMILIES.index(before)
    else:
        raise ValueError(f"before={getattr(before, '__name__', before)!r} is not a registered family")
    FAMILIES[at:at] = families


def unregister_family(family: type[ModelAdapter]) -> None:
    """Remove a family registered with :func:`register_family` (models keep the adapter they have)."""
    if family not in FAMILIES:
        raise ValueError(f"{getattr(family, '__name__', family)!r} is not a registered family")
    FAMILIES.remove(family)


def adapter_for(model: TLModel) -> ModelAdapter:
    """The :class:`ModelAdapter` of ``model``'s family, built once per model and cached (weakly).

    It never changes ``model``: no attribute, no hook (a ``transformers`` model stays as it was:
    ``tests/families/test_families.py``; only :func:`geolens.hf.prepare` attaches entry points to one).

    >>> import geolens
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")  # 2 layers, 4 query heads sharing 2 kv heads
    >>> from geolens.adapter import adapter_for
    >>> adapter = adapter_for(model)
    >>> type(adapter).__name__, adapter.n_kv_heads, adapter is adapter_for(model)
    ('BridgeAdapter', 2, True)
    """
    try:
        return _ADAPTERS[model]
    except (KeyError, TypeError):  # TypeError: a stand-in that cannot be weakly referenced
        pass
    adapter = next(cls for cls in FAMILIES if cls.matches(model))(model)
    try:
        _ADAPTERS[model] = adapter
    except TypeError:
        pass
    return adapter


# ---------------------------------------------------------------------------------------------
# Free functions (public API): delegates to adapter_for(model)


def is_bridge(model: TLModel) -> bool:
    """True for a TransformerLens 4.x ``TransformerBridge``."""
    return adapter_for(model).is_bridge


def model_mode(model: TLModel) -> str:
    """Which TransformerLens numerics produced a cache: recorded with every result.

    ``"bridge"`` (TL 4.x, raw HF weights), ``"bridge-compat"`` (after
    ``enable_compatibility_mode()``: norms folded, W_O centred for LayerNorm models, b_V folded
    into b_O, which changes ṽ) or ``"hooked"`` (TL 2.x/3.x ``HookedTransformer``, which processes
    weights the same way by default).

    >>> from geolens.testing import tiny_bridge
    >>> model_mode(tiny_bridge("gqa"))
    'bridge'
    """
    return adapter_for(model).model_mode


def n_kv_heads(model: TLModel) -> int:
    """Number of kv heads (n_heads without grouped-query attention).

    >>> from geolens.testing import tiny_bridge
    >>> model = tiny_bridge("gqa")  # 4 query heads sharing 2 kv heads
    >>> model.cfg.n_heads, n_kv_heads(model)
    (4, 2)
    """
    return adapter_for(model).n_kv_heads


def attn_out_hook(model: TLModel, layer: int) -> str:
    """Name of the hook holding the pre-norm attention output Σ_h z^h W_O^h + b_O.

    >>> from geolens.testing import tiny_bridge
    >>> attn_out_hook(tiny_bridge("gqa"), 1)
    'blocks.1.attn.hook_out'
    """
    return adapter_for(model).attn_out_hook(layer)


def has_post_attention_norm(model: TLModel) -> bool:
    """Whether ``blocks.L.hook_attn_out`` comes after a norm (Gemma 2/3)."""
    return adapter_for(model).post_attention_norm


def required_hook_names(
    model: TLModel, layers: Iterable[int] | None = None, *, with_attn_out: bool = False
) -> list[str]:
    """The cache entries geolens reads: pattern, v and z per layer (plus the attention output)."""
    return adapter_for(model).required_hook_names(layers, with_attn_out=with_attn_out)


def names_filter(
    model: TLModel, layers: Iterable[int] | None = None, *, with_attn_out: bool = False
) -> Callable[[str], bool]:
    """A ``names_filter`` for ``run_with_cache`` that keeps only what geolens reads.

    Example::

        logits, cache = model.run_with_cache(tokens, names_filter=geolens.names_filter(model))

    >>> import geolens
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")  # 2 layers, 4 query heads sharing 2 kv heads
    >>> _, cache = model.run_with_cache(tiny_tokens(model), names_filter=geolens.names_filter(model, layers=[1]))
    >>> sorted(cache.keys())
    ['blocks.1.attn.hook_pattern', 'blocks.1.attn.hook_v', 'blocks.1.attn.hook_z']
    """
    wanted = frozenset(required_hook_names(model, layers, with_attn_out=with_attn_out))
    return lambda name: name in wanted


def output_weights(model: TLModel, layer: int) -> tuple[Float[Tensor, "head d_head d_model"], Float[Tensor, "d_model"]]:
    """(W_O, b_O) of one layer in TL layout; b_O is zeros when the model has none."""
    return adapter_for(model).output_weights(layer)


def value_weights(
    model: TLModel, layer: int
) -> tuple[Float[Tensor, "head d_model d_head"], Float[Tensor, "head d_head"]]:
    """(W_V, b_V) of one layer in TL layout with kv heads expanded to query heads (see
    :meth:`ModelAdapter.value_weights`)."""
    return adapter_for(model).value_weights(layer)


def sliding_window(model: TLModel, layer: int) -> int | None:
    """The layer's sliding attention window, or None for full causal attention.

    TL's cfg reports ``window_size=None`` for Gemma 3 although its local layers use a 512-token
    window (docs/tl-notes.md), so the HF config's ``layer_types`` is read when the model is a bridge.
    """
    return adapter_for(model).sliding_window(layer)


def logits_hook(model: TLModel) -> str:
    """The cache entry from which :func:`logits_from_cache` gets the logits.

    TransformerBridge: ``unembed.hook_out`` (the logits themselves). HookedTransformer has no
    hook after the unembedding, so its final normalised residual ``ln_final.hook_normalized``
    is cached and unembedded.
    """
    return adapter_for(model).logits_hook


def logits_from_cache(model: TLModel, cache) -> Float[Tensor, "batch pos d_vocab"]:
    """Logits of the cached forward pass (see :func:`logits_hook`)."""
    return adapter_for(model).logits_from_cache(cache)


def unembed_input_hook(model: TLModel) -> str:
    """A hook whose activation ``[batch, pos, d_model]`` is followed only by position-wise maps
    up to the logits (so slicing positions there slices the logits, and saves the unembedding of
    the others): ``unembed.hook_in`` on a TransformerBridge, ``ln_final.hook_normalized`` on a
    HookedTransformer (whose ``unembed`` has no input hook; only the norm weight follows)."""
    return adapter_for(model).unembed_input_hook
