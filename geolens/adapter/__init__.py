"""The one package that knows model families and TransformerLens versions (docs/method.md §0).

geolens reads three things from a forward pass, per layer, in TransformerLens layouts:

- ``pattern`` α: ``[batch, head, query_pos, key_pos]`` (``blocks.{l}.attn.hook_pattern``)
- ``v``: ``[batch, key_pos, head, d_head]`` (``blocks.{l}.attn.hook_v``), grouped-query value
  heads expanded so that query head h reads kv head ``h // (n_heads // n_kv_heads)``
  (``repeat_interleave``, as TransformerLens itself does; :func:`kv_group_size` is the one
  implementation of that rule)
- ``W_O``: ``[head, d_head, d_model]`` and ``b_O``: ``[d_model]`` (zeros for bias-free models)

and derives z_i^h = Σ_j α_ij^h v_j^h (``hook_z``), so that Σ_h z^h W_O^h + b_O is the pre-norm
attention output.

One idea per module:

- hook names and the grouped-query rule come from :mod:`geolens.layout`, which imports nothing from
  geolens (so that :mod:`geolens.validation`, which this package uses, can use them too);
- :mod:`~geolens.adapter.base`: :class:`ModelAdapter`, the base of every family;
- one module per family, as TransformerLens' ``supported_architectures``:
  :mod:`~geolens.adapter.hooked` (:class:`HookedAdapter`, TransformerLens 2.x/3.x
  ``HookedTransformer``), :mod:`~geolens.adapter.bridge` (:class:`BridgeAdapter`, TransformerLens
  4.x ``TransformerBridge``), :mod:`~geolens.adapter.gemma` (:class:`GemmaBridgeAdapter`,
  :class:`GemmaHookedAdapter`: a norm after attention), :mod:`~geolens.adapter.olmo2`
  (:class:`Olmo2BridgeAdapter`: norms after attention and MLP only); what geolens knows of each
  model family (module names, norms, the TransformerLens 2.x config mapping, the HF-native layout)
  is in :mod:`geolens.families`, one module per family, which names the classes here that read it;
- :mod:`~geolens.adapter.registry`: :func:`adapter_for`, :func:`register_family` and the free
  functions that delegate to the adapter (:func:`model_mode`, :func:`n_kv_heads`,
  :func:`attn_out_hook`, :func:`output_weights`, :func:`sliding_window`, ...);
- :mod:`~geolens.adapter.layer`: :class:`AttentionLayer` and :func:`get_attention_layer`;
- :mod:`~geolens.adapter.cache`: reading cache entries.

Everything else in geolens goes through the names below; no other module branches on the model
family or the TransformerLens version (``tests/adapter/test_adapter.py`` scans for it).
"""

from geolens.adapter.base import ModelAdapter
from geolens.adapter.bridge import BridgeAdapter
from geolens.adapter.cache import cache_lookup
from geolens.adapter.gemma import GemmaBridgeAdapter, GemmaHookedAdapter
from geolens.adapter.hooked import HookedAdapter
from geolens.adapter.layer import CAUSAL_BLOCK_ROWS, AttentionLayer, get_attention_layer
from geolens.adapter.olmo2 import Olmo2BridgeAdapter
from geolens.adapter.registry import (
    adapter_for,
    attn_out_hook,
    has_post_attention_norm,
    is_bridge,
    logits_from_cache,
    logits_hook,
    model_mode,
    n_kv_heads,
    names_filter,
    output_weights,
    register_family,
    required_hook_names,
    sliding_window,
    unembed_input_hook,
    unregister_family,
    value_weights,
)
from geolens.layout import PATTERN, VALUE, Z, expand_kv_heads, hook_layer, hook_name, kv_group_size, kv_head_of

__all__ = [
    # families
    "ModelAdapter",
    "HookedAdapter",
    "BridgeAdapter",
    "GemmaBridgeAdapter",
    "GemmaHookedAdapter",
    "Olmo2BridgeAdapter",
    "adapter_for",
    "register_family",
    "unregister_family",
    # hook names and the grouped-query rule
    "PATTERN",
    "VALUE",
    "Z",
    "hook_name",
    "hook_layer",
    "kv_group_size",
    "kv_head_of",
    "expand_kv_heads",
    # per model, through its adapter
    "is_bridge",
    "model_mode",
    "n_kv_heads",
    "attn_out_hook",
    "has_post_attention_norm",
    "required_hook_names",
    "names_filter",
    "output_weights",
    "value_weights",
    "sliding_window",
    "logits_hook",
    "logits_from_cache",
    "unembed_input_hook",
    # one layer's tensors
    "AttentionLayer",
    "get_attention_layer",
    "CAUSAL_BLOCK_ROWS",
    "cache_lookup",
]
