"""geolens/families: one module per family, everything geolens knows about it, and no adapter that
changes the model it reads.

- every family module declares its name, its note, its HF-native layout, the TransformerLens
  adapters that read it and its HookedTransformerConfig mapping; the registry finds it by name and
  by ``config.model_type``, and the tiny models of geolens.hf.tiny are exactly these families;
- the HF-native adapter of each family is the class built from its layout;
- ``adapter_for(model)`` and ``geolens.run_with_cache(model, ...)`` leave a ``transformers`` model
  as it was (its ``__dict__`` object for object, its config, no hook left on any module), while
  ``geolens.hf.prepare`` is the one place that attaches entry points (``model.cfg``, ...);
- on a TransformerBridge each family gets one of its ``TL_ADAPTERS`` (and the bridge is not changed either).
"""

from __future__ import annotations

import pytest
import torch

import geolens
from geolens.families import FAMILIES, family, for_model_type, hooked_config
from geolens.families.base import HFLayout
from geolens.hf.tiny import tiny_family


def test_every_family_module_declares_what_geolens_knows():
    from geolens.adapter import ModelAdapter
    from geolens.hf import tiny

    assert tiny.FAMILIES == tuple(FAMILIES) and len(FAMILIES) == 10
    for name, module in FAMILIES.items():
        assert module.NAME == name and module.__name__ == f"geolens.families.{name}"
        assert isinstance(module.NOTE, str) and module.NOTE
        assert isinstance(module.HF, HFLayout) and module.HF.model_types
        assert module.TL_ADAPTERS and all(issubclass(cls, ModelAdapter) for cls in module.TL_ADAPTERS)
        assert callable(module.hooked_config)
        assert family(name) is module
        for model_type in module.HF.model_types:
            assert for_model_type(model_type) is module
    with pytest.raises(ValueError, match="unknown family 'bert'"):
        family("bert")


@pytest.mark.parametrize("name", list(FAMILIES))
def test_the_hf_adapter_is_built_from_the_family_layout(name):
    layout = family(name).HF
    model = tiny_family(name)
    assert model.config.model_type in layout.model_types
    adapter = geolens.adapter_for(model)
    assert type(adapter).__name__ == layout.class_name and adapter.family == layout.family
    for key, value in layout.class_attributes().items():
        if key not in ("__doc__", "refuse"):
            assert getattr(adapter, key) == value, key
    assert adapter.post_attention_norm == (layout.post_norm_name is not None)


def _state(model) -> tuple[dict, dict, list]:
    """The model's own attributes, its config and the hooks on its modules."""
    hooks = [
        (name, len(m._forward_hooks), len(m._forward_pre_hooks), "forward" in vars(m))
        for name, m in model.named_modules()
    ]
    return dict(vars(model)), model.config.to_dict(), hooks


@pytest.mark.parametrize("name", list(FAMILIES))
def test_adapter_for_and_run_with_cache_never_change_the_model(name):
    model = tiny_family(name)
    attributes, config, hooks = _state(model)
    adapter = geolens.adapter_for(model)
    tokens = torch.tensor([[0, 5, 9, 4, 7, 8, 11, 12, 13, 14]])
    logits, cache = geolens.run_with_cache(model, tokens, names_filter=geolens.names_filter(model))
    geolens.contribution_weights(model, cache, layer=1)  # an analysis reads it through its adapter
    after, config_after, hooks_after = _state(model)
    assert after.keys() == attributes.keys() and all(after[k] is attributes[k] for k in attributes)
    assert config_after == config and hooks_after == hooks
    for entry in ("cfg", "to_tokens", "run_with_cache", "hooks", "run_with_hooks", "hook_dict", "tokenizer"):
        assert entry not in vars(model), entry
    assert type(model).forward is not None and "forward" not in vars(model)
    assert adapter.cfg.n_layers == 2 and tuple(logits.shape) == (1, 10, 64)
    with torch.no_grad():
        assert torch.allclose(model(tokens).logits, logits, atol=1e-5)  # its own forward, as before


def test_prepare_is_the_one_place_that_attaches_entry_points():
    from geolens.hf import prepare
    from geolens.hf.backend import is_prepared
    from geolens.testing import tiny_tokenizer

    model = tiny_family("llama")
    geolens.adapter_for(model)
    assert not is_prepared(model) and "cfg" not in vars(model)
    tokenizer = tiny_tokenizer()
    assert prepare(model, tokenizer=tokenizer) is model and is_prepared(model)
    assert model.cfg is geolens.adapter_for(model).cfg and model.tokenizer is tokenizer
    assert {"cfg", "to_tokens", "run_with_cache", "hooks", "run_with_hooks", "hook_dict", "forward"} <= set(vars(model))
    tokens = model.to_tokens("the cat", prepend_bos=True)
    logits, cache = model.run_with_cache(tokens)
    assert tuple(logits.shape) == (1, tokens.shape[1], 64) and "blocks.1.attn.hook_pattern" in cache


def test_a_family_can_refuse_a_model_it_cannot_read():
    model = tiny_family("gpt2")
    model.config.reorder_and_upcast_attn = True
    with pytest.raises(ValueError, match="reorder_and_upcast_attn=True bypasses the attention interface"):
        geolens.adapter_for(model)


def test_the_hooked_transformer_mapping_lives_with_each_family():
    fields, converter = hooked_config(tiny_family("gpt2").config)
    assert converter == "convert_gpt2_weights" and fields["normalization_type"] == "LN" and fields["n_layers"] == 2
    with pytest.raises(NotImplementedError, match="no OLMo 2 conversion"):
        hooked_config(tiny_family("olmo2").config)
    llama, gemma2 = (tiny_family(n).config for n in ("llama", "gemma2"))
    if not hasattr(llama, "rope_theta"):  # transformers 5 keeps it in rope_parameters: the mapping is TL 2.x's
        pytest.skip("the rotary families' mapping reads transformers 4.x configs (.venvs/tl2)")
    fields, converter = hooked_config(llama)
    assert converter == "convert_llama_weights" and fields["rotary_base"] == llama.rope_theta
    fields, converter = hooked_config(gemma2)
    assert fields["use_normalization_before_and_after"] and fields["attn_scores_soft_cap"] == 5.0
    assert fields["attn_types"] == ["local", "global"]


@pytest.mark.bridge_only
@pytest.mark.parametrize("name", list(FAMILIES))
def test_on_a_bridge_each_family_gets_one_of_its_tl_adapters(name):
    from geolens.adapter.bridge import transformer_bridge
    from geolens.testing import tiny_tokenizer

    bridge = transformer_bridge(
        f"geolens-tiny-{name}", tiny_family(name), tiny_tokenizer(), compatibility_mode=False, device="cpu"
    )
    before = dict(vars(bridge))
    assert type(geolens.adapter_for(bridge)) in family(name).TL_ADAPTERS
    assert vars(bridge).keys() == before.keys() and all(vars(bridge)[k] is v for k, v in before.items())
