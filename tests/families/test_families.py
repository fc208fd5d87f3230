"""geolens/families: one module per family, everything geolens knows about it, and no adapter that
changes the model it reads.

- every family module declares its name, its note, its HF-native layout, the TransformerLens
  adapters that read it and its HookedTransformerConfig mapping; the registry finds it by name and
  by ``config.model_type``, and the tiny models of geolens.hf.tiny are exactly these families;
- ``geolens.hf.prepare`` is the one place that attaches entry points (``model.cfg``, ...).

Each family's own checks (its adapters, the model left unchanged, its support-matrix cells) are in
tests/families/test_<family>.py.
"""

from __future__ import annotations

import pytest

import geolens
from geolens.families import FAMILIES, family, for_model_type
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
