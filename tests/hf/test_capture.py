"""The HF-native forward's hook sites (geolens.hf.capture): stop_at_layer runs the first blocks only,
hooks and the attention implementation are restored even on errors, and a z hook edits the forward
by exactly that head's term."""

from __future__ import annotations

import pytest
import torch

from geolens.adapter import adapter_for
from geolens.hf import prepare
from geolens.hf.tiny import tiny_family
from geolens.interventions.base import active_hook_count
from hf.conftest import hf_tokens


def test_stop_at_layer_runs_the_first_blocks_only(family_cache):
    family, model, tokens, _ = family_cache
    logits, cache = model.run_with_cache(tokens, stop_at_layer=1)
    assert logits is None
    assert sorted({name.split(".")[1] for name in cache if name.startswith("blocks.")}) == ["0"]


def test_hooks_and_the_attention_implementation_are_restored_even_on_errors():
    model = prepare(tiny_family("qwen2"))
    before, impl = active_hook_count(model), model.config._attn_implementation

    def boom(x, hook):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        model.run_with_hooks(hf_tokens(), fwd_hooks=[("blocks.1.attn.hook_z", boom)])
    assert active_hook_count(model) == before and model.config._attn_implementation == impl
    with pytest.raises(KeyError, match="no hook point named"):
        with model.hooks(fwd_hooks=[("blocks.9.attn.hook_z", boom)]):
            pass
    assert active_hook_count(model) == before


def test_a_z_hook_edits_the_forward():
    """Zeroing one head's z changes the attention output by exactly that head's Σ α v W_O."""
    model = prepare(tiny_family("gpt_neox"))
    adapter, tokens = adapter_for(model), hf_tokens()

    def drop_head(z, hook):
        z = z.clone()
        z[:, :, 2] = 0
        return z

    with torch.no_grad():
        _, clean = model.run_with_cache(tokens)
        with model.hooks(fwd_hooks=[(adapter.z_hook(0), drop_head)]):
            _, edited = model.run_with_cache(tokens, names_filter=[adapter.attn_out_hook(0)])
    W_O = adapter.output_weights(0)[0].double()
    head = clean[adapter.z_hook(0)][:, :, 2].double() @ W_O[2]
    torch.testing.assert_close(
        edited[adapter.attn_out_hook(0)].double(), clean[adapter.attn_out_hook(0)].double() - head, rtol=0, atol=1e-6
    )
