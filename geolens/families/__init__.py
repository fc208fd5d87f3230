"""Model families in one place: one module per family, holding everything geolens knows about it.

>>> from geolens.families import FAMILIES, family, for_model_type
>>> list(FAMILIES)
['llama', 'mistral', 'qwen2', 'qwen3', 'gemma2', 'gemma3', 'phi3', 'olmo2', 'gpt2', 'gpt_neox']
>>> family("gpt2").HF.output_name, for_model_type("gemma3_text").NAME
('c_proj', 'gemma3')

Each ``geolens/families/<name>.py`` declares (:mod:`geolens.families.base`): ``NAME``, ``NOTE``
(what its tiny model exercises), ``HF`` (the HF-native layout: ``config.model_type`` values,
module names, the norm after attention, sliding windows), ``TL_ADAPTERS`` (the
:mod:`geolens.adapter` classes that read it on TransformerLens) and ``hooked_config(c)`` (the
TransformerLens 2.x ``HookedTransformerConfig`` mapping of the support matrix, used by
:func:`geolens.families.convert.hooked_from_hf`). :mod:`geolens.hf.families` builds the HF-native
adapter classes from the ``HF`` layouts; :mod:`geolens.hf.tiny` builds a tiny random model of each.

Where a family goes (CONTRIBUTING.md): a new ``geolens/families/<name>.py`` with those names, added
to :data:`FAMILIES` below; the HF-native adapter, the support matrix (``scripts/support_matrix.py``)
and ``tests/families/test_families.py`` pick it up from there. A TransformerLens block layout geolens does
not know yet (a new norm placement) is a new class in :mod:`geolens.adapter`, matched by structure,
not by name.

**No adapter changes the model it reads.** ``geolens.adapter_for(model)`` and
``geolens.run_with_cache(model, ...)`` on a ``transformers`` model leave it as it is (its
``__dict__``, its attributes, its class and its forward: ``tests/families/test_families.py``); the per-model
state of the HF-native backend (hook points, the TransformerLens-style config view, whether the
load-time check has run) lives in a ``WeakKeyDictionary`` keyed by the model
(:mod:`geolens.hf.backend`). Only :func:`geolens.hf.prepare` (what ``load_model(..., backend="hf")``,
``run_corpus`` and ``stream_corpus`` call) attaches TransformerLens-style entry points to the
instance (``model.cfg``, ``model.to_tokens``, ``model.run_with_cache``, ``model.hooks``,
``model.tokenizer``), because analyses and users call them on the model: that is the documented
contract of ``load_model(..., backend="hf")``, and it happens only when asked for.
"""

from __future__ import annotations

from types import ModuleType

from geolens.families import gemma2, gemma3, gpt2, gpt_neox, llama, mistral, olmo2, phi3, qwen2, qwen3
from geolens.families.base import HFLayout

FAMILIES: dict[str, ModuleType] = {
    m.NAME: m for m in (llama, mistral, qwen2, qwen3, gemma2, gemma3, phi3, olmo2, gpt2, gpt_neox)
}
"""name → family module, in the support matrix's order."""


def family(name: str) -> ModuleType:
    """The module of the family ``name`` (``"llama"``, ``"gpt_neox"``, ...)."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown family {name!r}: use one of {', '.join(FAMILIES)}") from None


def for_model_type(model_type: str) -> ModuleType:
    """The family module whose HF layout lists ``model_type`` (a ``config.model_type``)."""
    for module in FAMILIES.values():
        if model_type in module.HF.model_types:
            return module
    raise ValueError(f"no geolens family for model_type {model_type!r}")


def hf_layouts() -> list[HFLayout]:
    """The HF layouts of every family, in :data:`FAMILIES` order."""
    return [module.HF for module in FAMILIES.values()]


def hooked_config(config) -> tuple[dict, str]:
    """``HookedTransformerConfig`` fields for the HF config ``config`` and the name of
    TransformerLens' weight converter (its family's ``hooked_config``); ``NotImplementedError``
    for a family TransformerLens 2.x cannot hold or that has no mapping."""
    try:
        module = for_model_type(config.model_type)
    except ValueError:
        raise NotImplementedError(f"no HookedTransformerConfig mapping for model_type {config.model_type!r}") from None
    return module.hooked_config(config)


__all__ = ["FAMILIES", "HFLayout", "family", "for_model_type", "hf_layouts", "hooked_config"]
