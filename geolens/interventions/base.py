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
    """
    return sum(len(m._forward_hooks) for m in model.modules())


@contextmanager
def applied(model, fwd_hooks: FwdHooks) -> Iterator[None]:
    """Register ``fwd_hooks`` on ``model`` for the ``with`` block; remove them on any exit.

    Uses TransformerLens' own ``model.hooks(fwd_hooks=...)`` context manager (HookedTransformer
    and TransformerBridge both have it), after checking that every hook name exists, so a typo
    is a clear ``KeyError`` instead of a silent no-op.
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
