"""OLMo 2 on a TransformerBridge (geolens.adapter.olmo2): blocks with norms after attention and the
MLP but none before the MLP are told apart from Gemma's (both norms) and Llama's (pre-norms only),
on stand-ins holding just the block modules, and on the tiny OLMo 2 bridge."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from geolens.adapter import GemmaBridgeAdapter, adapter_for
from geolens.adapter.olmo2 import Olmo2BridgeAdapter, post_norms_only


def _bridge_like(*modules: str):
    """A duck-typed bridge (original_model, adapter) whose first block holds ``modules``."""
    block = SimpleNamespace(_modules=dict.fromkeys(modules))
    cfg = SimpleNamespace(use_normalization_before_and_after=False)
    return SimpleNamespace(original_model=None, adapter=None, blocks=[block], cfg=cfg)


def test_post_norms_only_tells_olmo2_blocks_from_gemma_and_llama():
    olmo2 = _bridge_like("ln1", "attn", "ln1_post", "mlp", "ln2_post")
    gemma = _bridge_like("ln1", "attn", "ln1_post", "ln2", "mlp", "ln2_post")
    llama = _bridge_like("ln1", "attn", "ln2", "mlp")
    assert post_norms_only(olmo2) and not post_norms_only(gemma) and not post_norms_only(llama)
    assert Olmo2BridgeAdapter.matches(olmo2) and not Olmo2BridgeAdapter.matches(gemma)
    assert not GemmaBridgeAdapter.matches(olmo2) and GemmaBridgeAdapter.matches(gemma)
    assert not Olmo2BridgeAdapter.matches(llama) and not GemmaBridgeAdapter.matches(llama)
    not_a_bridge = SimpleNamespace(blocks=olmo2.blocks, cfg=olmo2.cfg)
    assert not Olmo2BridgeAdapter.matches(not_a_bridge)


@pytest.mark.bridge_only
def test_the_tiny_olmo2_bridge_gets_the_olmo2_adapter():
    import support_checks

    model = support_checks.build("olmo2", "tl4-bridge")
    adapter = adapter_for(model)
    assert type(adapter) is Olmo2BridgeAdapter and post_norms_only(model)
    assert adapter.post_attention_norm and not adapter.pre_mlp_norm
