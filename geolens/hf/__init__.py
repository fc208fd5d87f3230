"""The HF-native backend: geolens on a plain ``transformers`` model, without TransformerLens.

>>> import geolens, torch
>>> from geolens.hf.tiny import tiny_family
>>> model = tiny_family("llama")  # a random 2-layer Llama, built offline from its config
>>> logits, cache = geolens.run_with_cache(model, torch.tensor([[0, 5, 9, 4, 7]]))
>>> tuple(cache["blocks.0.attn.hook_pattern"].shape), geolens.adapter_for(model).family
((1, 4, 5, 5), 'hf-llama')

- :mod:`geolens.hf.base`: :class:`HFAdapter`, a model read through its family's module layout;
- :mod:`geolens.hf.families`: one adapter class per family of :mod:`geolens.families` (Llama,
  Mistral, Qwen2, Qwen3, Gemma 2, Gemma 3, Phi-3, OLMo 2, GPT-2, GPT-NeoX), and the generic fallback;
- :mod:`geolens.hf.capture`: the hook points (a registered attention function wrapping each
  family's eager attention, and module hooks);
- :mod:`geolens.hf.backend`: the per-model state (held apart from the model: reading a model
  never changes it) and :func:`prepare`, the one place that gives the instance TransformerLens-style
  entry points (``model.cfg``, ``model.to_tokens``, ...);
- :mod:`geolens.hf.check`: the load-time check of the attention reading;
- :mod:`geolens.hf.streamed`: streamed mode, what :func:`geolens.run_corpus` uses on an HF-native
  model: each analysis's ``update`` runs layer by layer inside the forward, and each layer's
  entries are dropped before the next block runs, so that no more than one layer's pattern is
  held at a time (analyses that read the logits, or declare ``layerwise = False``, get the
  whole cache instead);
- :mod:`geolens.hf.tiny`: tiny random models of every family, for tests and the support matrix.
"""

from geolens.hf.backend import prepare, run_with_cache
from geolens.hf.check import AttentionCheckError, check_attention
from geolens.hf.families import HF_FAMILIES, HFAdapter

__all__ = ["prepare", "run_with_cache", "AttentionCheckError", "check_attention", "HF_FAMILIES", "HFAdapter"]
