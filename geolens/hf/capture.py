"""Hook points inside a plain ``transformers`` model, without TransformerLens.

geolens reads and edits a forward pass at TransformerLens' hook names
(``blocks.{l}.attn.hook_pattern``, ``hook_v``, ``hook_z``, ``hook_resid_pre``, ...). On a Hugging
Face model they are provided in two ways:

- **inside attention** (pattern, v, z): a function registered in ``transformers``'
  ``AttentionInterface`` under the name ``"geolens"``. While a run is active the model's
  ``config._attn_implementation`` is switched to it; it calls the family's own
  ``eager_attention_forward`` (the module that defines the attention class), so the pattern is
  the one the model computes (scaling, soft-capping, sliding-window mask, float32 softmax), and
  fires the hooks of the captured layers: v ``[batch, pos, kv_head, d_head]`` before the kv
  repeat (an edited v is what the eager function then reads), the pattern
  ``[batch, head, query, key]`` (z is recomputed from it when a pattern hook is active) and z
  ``[batch, query, head, d_head]`` (what the output projection then reads). Masks are built by
  ``transformers``' eager mask function, registered under the same name.
- **around modules** (residual stream, attention output, unembedding input): PyTorch forward
  hooks on the decoder layers, the attention modules, the family's post-attention norm and the
  output embedding, registered when a run starts and removed when it ends, even when an
  exception escapes.

A :class:`Run` is the state of one forward (or of a ``with model.hooks(...)`` block): the user's
hooks per name, the names to cache, where to stop. Runs nest; the innermost sees every hook of
the outer ones. Nothing stays registered between runs.
"""

from __future__ import annotations

import contextlib
import sys
import weakref
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
from torch import Tensor

IMPLEMENTATION = "geolens"


class StopForward(Exception):
    """Raised by the pre-hook of block ``stop_at_layer`` to end a forward early."""


@dataclass
class HookSite:
    """What a hook function receives as its second argument (TransformerLens passes a
    ``HookPoint``; geolens' hooks read ``hook.name`` only)."""

    name: str

    def layer(self) -> int | None:
        from geolens.adapter import hook_layer

        return hook_layer(self.name)


@dataclass(eq=False)
class Run:
    """The hooks, the cache and the stop layer of one active forward (or hooks block)."""

    hooks: dict[str, list[Callable]] = field(default_factory=dict)
    cache: dict | None = None
    names_filter: Callable[[str], bool] | None = None
    stop_at_layer: int | None = None
    # called with the layer index once that layer's attention has run and its hooks fired
    # (geolens.hf.streamed: each layer's quantities computed inside the forward)
    on_layer: Callable[[int], None] | None = None


class Sites:
    """The hook points of one model and the runs active on it (one per prepared model)."""

    def __init__(self, model, adapter, check: Callable[[object], object]):
        self._model = weakref.ref(model)
        self.adapter = adapter
        self._check = check  # the load-time check, run on the model (geolens.hf.check.check_attention)
        self.runs: list[Run] = []
        self._handles: list = []
        self._saved_impl = None
        self.names = frozenset(self._all_names())
        self.checked = False  # the load-time check has passed

    # --- names

    def _all_names(self) -> list[str]:
        a = self.adapter
        names = [a.unembed_input_hook, a.logits_hook]
        for l in range(a.n_layers):
            names += [a.resid_pre_hook(l), a.resid_post_hook(l), a.pattern_hook(l), a.value_hook(l), a.z_hook(l)]
            names += [a.attn_out_hook(l), a.block_attn_out_hook(l)]
        return names

    # --- dispatch

    def wants(self, name: str) -> bool:
        """Whether any active run hooks or caches ``name``."""
        for run in self.runs:
            if name in run.hooks or (run.cache is not None and (run.names_filter is None or run.names_filter(name))):
                return True
        return False

    def hooked(self, name: str) -> bool:
        return any(name in run.hooks for run in self.runs)

    def fire(self, name: str, x: Tensor) -> Tensor:
        """Apply every active hook on ``name`` in order (outer runs first), then cache the result."""
        for run in self.runs:
            for fn in run.hooks.get(name, ()):
                out = fn(x, HookSite(name))
                if out is not None:
                    x = out
        for run in self.runs:
            if run.cache is not None and (run.names_filter is None or run.names_filter(name)):
                run.cache[name] = x.detach()
        return x

    # --- activation

    @contextlib.contextmanager
    def active(self, run: Run) -> Iterator[Run]:
        """Register ``run`` for the ``with`` block: module hooks and the attention implementation
        are installed by the outermost run and removed (restored) when it ends, on any exit."""
        unknown = sorted(set(run.hooks) - self.names)
        if unknown:
            raise KeyError(f"no hook point named {unknown[:4]} on this model (see model.hook_dict)")
        if not self.runs and not self.checked:  # the first use: check before any run of the caller's
            self.check()
        outermost = not self.runs
        if outermost:
            self._install()
        self.runs.append(run)
        try:
            yield run
        finally:
            self.runs.remove(run)
            if outermost:
                self._uninstall()

    def check(self) -> None:
        """Run the load-time check once (again after a failure)."""
        self.checked = True
        try:
            self._check(self._model())
        except BaseException:
            self.checked = False
            raise

    def _install(self) -> None:
        model = self._model()
        register_implementation()
        a = self.adapter
        self._saved_impl = model.config._attn_implementation
        model.config._attn_implementation = IMPLEMENTATION
        try:
            for l in range(a.n_layers):
                layer, attn = a.layer_module(l), a.attention_module(l)
                self._handles.append(layer.register_forward_pre_hook(self._pre_block(l), with_kwargs=True))
                self._handles.append(layer.register_forward_hook(self._post_block(l)))
                self._handles.append(attn.register_forward_hook(self._post_attention(l)))
                norm = a.attention_output_norm(l)
                if norm is not None:
                    self._handles.append(norm.register_forward_hook(self._post_norm(l)))
                _ATTENTION_LAYERS[attn] = (self, l)
            self._handles.append(a.unembed_module().register_forward_pre_hook(self._pre_unembed))
        except BaseException:
            self._uninstall()
            raise

    def _uninstall(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        model = self._model()
        if model is not None and self._saved_impl is not None:
            model.config._attn_implementation = self._saved_impl
        self._saved_impl = None

    # --- module hooks

    def _pre_block(self, l: int):
        name = self.adapter.resid_pre_hook(l)

        def hook(module, args, kwargs):
            for run in self.runs:
                if run.stop_at_layer is not None and l >= run.stop_at_layer:
                    raise StopForward
            if not self.wants(name):
                return None
            if args:
                return (self.fire(name, args[0]), *args[1:]), kwargs
            kwargs = dict(kwargs)
            kwargs["hidden_states"] = self.fire(name, kwargs["hidden_states"])
            return args, kwargs

        return hook

    def _post_block(self, l: int):
        name = self.adapter.resid_post_hook(l)

        def hook(module, args, output):
            if not self.wants(name):
                return None
            if isinstance(output, tuple):
                return (self.fire(name, output[0]), *output[1:])
            return self.fire(name, output)

        return hook

    def _post_attention(self, l: int):
        names = [self.adapter.attn_out_hook(l)]
        if self.adapter.attention_output_norm(l) is None:  # what the block adds is the attention output itself
            names.append(self.adapter.block_attn_out_hook(l))

        def hook(module, args, output):
            first = output[0] if isinstance(output, tuple) else output
            out = first
            for name in names:
                if self.wants(name):
                    out = self.fire(name, out)
            if out is first:
                return None
            return (out, *output[1:]) if isinstance(output, tuple) else out

        return hook

    def _post_norm(self, l: int):
        name = self.adapter.block_attn_out_hook(l)

        def hook(module, args, output):
            return self.fire(name, output) if self.wants(name) else None

        return hook

    def _pre_unembed(self, module, args):
        name = self.adapter.unembed_input_hook
        if not self.wants(name):
            return None
        return (self.fire(name, args[0]), *args[1:])

    # --- attention

    def attention(self, l: int, eager: Callable, module, query, key, value, attention_mask, kwargs):
        """The family's eager attention for layer ``l`` with the pattern, v and z hooks fired."""
        a = self.adapter
        v_name, p_name, z_name = a.value_hook(l), a.pattern_hook(l), a.z_hook(l)
        if self.wants(v_name):
            value = self.fire(v_name, value.transpose(1, 2)).transpose(1, 2)
        z, pattern = eager(module, query, key, value, attention_mask, **kwargs)
        if pattern is None:
            raise RuntimeError(
                f"layer {l}: the eager attention of {type(module).__name__} returned no attention weights"
            )
        if self.wants(p_name):
            hooked = self.hooked(p_name)
            pattern = self.fire(p_name, pattern)
            if hooked:  # an edited pattern (in place or returned) must reach the output
                group = pattern.shape[1] // value.shape[1]
                values = value.repeat_interleave(group, dim=1) if group > 1 else value
                z = torch.matmul(pattern.to(values.dtype), values).transpose(1, 2).contiguous()
        if self.wants(z_name):
            z = self.fire(z_name, z)
        for run in list(self.runs):
            if run.on_layer is not None:
                run.on_layer(l)
        return z, pattern


# attention module -> (its Sites, layer) while a run is active
_ATTENTION_LAYERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_EAGER: dict[type, Callable] = {}


def family_eager(module) -> Callable:
    """The ``eager_attention_forward`` of the module that defines ``module``'s class."""
    cls = type(module)
    found = _EAGER.get(cls)
    if found is None:
        for klass in cls.__mro__:
            found = getattr(sys.modules.get(klass.__module__), "eager_attention_forward", None)
            if found is not None:
                break
        if found is None:
            raise RuntimeError(f"{cls.__name__}: its modeling module has no eager_attention_forward to wrap")
        _EAGER[cls] = found
    return found


def geolens_attention(module, query, key, value, attention_mask, **kwargs):
    """The attention function registered as ``"geolens"`` (module docstring)."""
    eager = family_eager(module)
    found = _ATTENTION_LAYERS.get(module)
    if found is None or not found[0].runs:
        return eager(module, query, key, value, attention_mask, **kwargs)
    sites, layer = found
    return sites.attention(layer, eager, module, query, key, value, attention_mask, kwargs)


_REGISTERED = False


def register_implementation() -> None:
    """Register :func:`geolens_attention` and the eager mask under ``"geolens"`` (once)."""
    global _REGISTERED
    if _REGISTERED:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, eager_mask

    AttentionInterface.register(IMPLEMENTATION, geolens_attention)
    if IMPLEMENTATION not in ALL_MASK_ATTENTION_FUNCTIONS:
        AttentionMaskInterface.register(IMPLEMENTATION, eager_mask)
    _REGISTERED = True
