"""Applying ``fwd_hooks`` safely: hooks are always removed, even when an exception escapes."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Sequence

HookFn = Callable  # (activation, hook) -> activation | None
FwdHooks = Sequence[tuple[str, HookFn]]


def active_hook_count(model) -> int:
    """Number of forward hooks currently registered on any submodule of ``model``.

    Counts PyTorch forward hooks on every module (TransformerLens ``HookPoint``s included), so a
    test can assert that nothing leaked into the next forward pass.

    >>> from geolens.interventions.ablation import head_ablation_hooks
    >>> from geolens.testing import tiny_bridge
    >>> model = tiny_bridge("gqa")
    >>> with applied(model, head_ablation_hooks(model, [(1, 0)])):
    ...     inside = active_hook_count(model)
    >>> inside, active_hook_count(model)  # one hook in the block, none after it
    (1, 0)
    """
    return sum(len(m._forward_hooks) for m in model.modules())


@contextmanager
def applied(model, fwd_hooks: FwdHooks) -> Iterator[None]:
    """Register ``fwd_hooks`` on ``model`` for the ``with`` block; remove them on any exit.

    Uses TransformerLens' own ``model.hooks(fwd_hooks=...)`` context manager (HookedTransformer
    and TransformerBridge both have it), after checking that every hook name exists, so a typo
    is a clear ``KeyError`` instead of a silent no-op.

    >>> from geolens.interventions.sink_values import scale_sink_value
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")
    >>> tokens = tiny_tokens(model)
    >>> with applied(model, scale_sink_value(model, 0.0).fwd_hooks):  # v_0 ← 0 in every layer
    ...     edited = model(tokens)
    >>> bool((edited != model(tokens)).any()), active_hook_count(model)
    (True, 0)
    """
    if not fwd_hooks:
        yield
        return
    hook_dict = getattr(model, "hook_dict", None)
    if hook_dict is not None:
        unknown = sorted({name for name, _ in fwd_hooks if name not in hook_dict})
        if unknown:
            raise KeyError(f"no hook point named {unknown[:4]} on this model (see model.hook_dict)")
    with model.hooks(fwd_hooks=list(fwd_hooks)):
        yield
