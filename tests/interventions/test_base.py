"""Applying forward hooks safely (geolens.interventions.base): a hook edits the forward only inside
the block, is removed on a normal exit and when an exception escapes, an unknown hook name is a
KeyError before anything is registered, no hooks is a plain block, and active_hook_count counts
the forward hooks of every module."""

from __future__ import annotations

import pytest
import torch

from geolens.adapter import hook_name
from geolens.interventions.base import active_hook_count, applied


def test_a_hook_applies_inside_the_block_only_and_is_removed_on_every_exit(tiny_gqa):
    model, tokens, _ = tiny_gqa
    name, seen = hook_name(1, "attn.hook_pattern"), []
    before = active_hook_count(model)
    with torch.no_grad():
        clean = model(tokens)
        with applied(model, [(name, lambda p, hook: seen.append(hook.name) or p * 0)]):
            assert active_hook_count(model) == before + 1
            edited = model(tokens)
        assert active_hook_count(model) == before and seen == [name]
        assert not torch.allclose(edited, clean) and torch.equal(model(tokens), clean)

        def boom(p, hook):
            raise RuntimeError("boom")

        with pytest.raises(RuntimeError, match="boom"), applied(model, [(name, boom)]):
            model(tokens)
    assert active_hook_count(model) == before


def test_unknown_names_and_no_hooks(tiny_gqa):
    model, tokens, _ = tiny_gqa
    before = active_hook_count(model)
    with pytest.raises(KeyError, match=r"no hook point named \['blocks.9.attn.hook_z'\]"):
        with applied(model, [(hook_name(0, "attn.hook_z"), lambda z, hook: z), ("blocks.9.attn.hook_z", None)]):
            pass
    assert active_hook_count(model) == before  # nothing was registered
    with applied(model, []):
        assert active_hook_count(model) == before


def test_active_hook_count_counts_every_modules_forward_hooks():
    outer = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.ReLU()))
    assert active_hook_count(outer) == 0
    handles = [outer[0].register_forward_hook(lambda *a: None), outer[1][0].register_forward_hook(lambda *a: None)]
    handles.append(outer.register_forward_hook(lambda *a: None))
    assert active_hook_count(outer) == 3
    for h in handles:
        h.remove()
    assert active_hook_count(outer) == 0
