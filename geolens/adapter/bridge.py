"""TransformerLens 4.x ``TransformerBridge`` over a Hugging Face model: building one
(:func:`transformer_bridge`) and reading it (:class:`BridgeAdapter`).

Its pre-norm attention output is ``blocks.{l}.attn.hook_out``; the logits are cached at
``unembed.hook_out``; sliding windows are read from the HF config, because TransformerLens' cfg
does not report them (docs/tl-notes.md).
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from geolens.adapter.base import ModelAdapter, TLModel
from geolens.adapter.cache import _cache_get
from geolens.layout import hook_name


def transformer_bridge(
    path_or_name: str, hf_model, tokenizer, *, compatibility_mode: bool = False, device="cpu", **boot_kwargs
):
    """``TransformerBridge.boot_transformers`` over ``hf_model`` (or, when it is None, over the model
    it loads itself from ``path_or_name``), then compatibility mode if asked, in eval mode.
    ``boot_kwargs`` go to ``boot_transformers`` (``dtype``, ``device_map``, ``n_devices``, ...)."""
    from transformer_lens.model_bridge import TransformerBridge

    bridge = TransformerBridge.boot_transformers(
        path_or_name, hf_model=hf_model, tokenizer=tokenizer, device=device, **boot_kwargs
    )
    if compatibility_mode:
        bridge.enable_compatibility_mode(disable_warnings=True)
    bridge.eval()
    return bridge


def looks_like_bridge(model: TLModel) -> bool:
    """A TransformerLens 4.x ``TransformerBridge``, duck-typed on ``original_model`` and ``adapter``."""
    return hasattr(model, "original_model") and hasattr(model, "adapter")


class BridgeAdapter(ModelAdapter):
    """TransformerLens 4.x ``TransformerBridge`` over an HF model."""

    family = "bridge"
    is_bridge = True

    @classmethod
    def matches(cls, model) -> bool:
        return looks_like_bridge(model)

    @property
    def model_mode(self) -> str:
        """``"bridge"`` (raw HF weights) or ``"bridge-compat"`` (after ``enable_compatibility_mode()``:
        norms folded, W_O centred for LayerNorm models, b_V folded into b_O, which changes ṽ)."""
        return "bridge-compat" if getattr(self.model, "compatibility_mode", False) else "bridge"

    def attn_out_hook(self, layer: int) -> str:
        return hook_name(layer, "attn.hook_out")

    @property
    def logits_hook(self) -> str:
        """``unembed.hook_out``: the logits themselves."""
        return "unembed.hook_out"

    @property
    def unembed_input_hook(self) -> str:
        return "unembed.hook_in"

    def logits_from_cache(self, cache) -> Float[Tensor, "batch pos d_vocab"]:
        return _cache_get(cache, self.logits_hook)

    @property
    def hf_config(self):
        """The configuration of the Hugging Face model under the bridge (its text part for a
        multimodal one)."""
        config = getattr(self.model.original_model, "config", None)
        return getattr(config, "text_config", None) or config

    def sliding_window(self, layer: int) -> int | None:
        """The HF config's ``sliding_window``, where transformers applies it: on the layers whose
        ``layer_types`` entry is ``"sliding_attention"`` when the config lists layer types (Gemma
        2/3, Qwen2/3), else on every layer (Mistral, Phi-3, whose attention modules all pass
        ``config.sliding_window`` on). TransformerLens' cfg does not report these windows
        (``window_size=None``; docs/tl-notes.md)."""
        config = self.hf_config
        window = getattr(config, "sliding_window", None)
        if not window or getattr(config, "use_sliding_window", True) is False:
            return None
        types = getattr(config, "layer_types", None)
        if types is not None:
            return int(window) if types[layer] == "sliding_attention" else None
        return int(window)

    def run_with_kv_cache(self, x: Tensor, kv_cache, **kwargs) -> Float[Tensor, "batch pos d_vocab"]:
        """``model(x, past_key_values=kv_cache, **kwargs)`` (a Hugging Face ``DynamicCache``).

        TransformerLens 4.3's attention bridge reads its KV cache from the keyword
        ``past_key_values``, which transformers 5.24 renamed ``cache`` in the call it makes to each
        attention module, so the cache would be silently ignored (docs/tl-notes.md): a pre-hook on
        each attention module, removed on any exit, hands it back under the old name.
        """
        import warnings

        def rename(module, args, kw):
            if kw.get("past_key_values") is None and kw.get("cache") is not None:
                kw["past_key_values"] = kw["cache"]
            return args, kw

        handles = [block.attn.register_forward_pre_hook(rename, with_kwargs=True) for block in self.model.blocks]
        try:
            with warnings.catch_warnings():  # transformers 5.24: "`past_key_values` is deprecated", which TL 4.3 passes
                warnings.filterwarnings("ignore", message=".*past_key_values.* is deprecated", category=FutureWarning)
                return self.model(x, **kwargs, **({} if kv_cache is None else {"past_key_values": kv_cache}))
        finally:
            for handle in handles:
                handle.remove()

    def new_kv_cache(self):
        from transformers import DynamicCache

        return DynamicCache()

    def forward_from_layer(self, resid, layer, **kwargs):
        """TransformerLens 4.3's ``start_at_layer`` still runs blocks 0 … layer−1 and then discards
        their output (docs/tl-notes.md), which costs as much as a full forward. Here those blocks
        are replaced, for this call only, by the identity (an instance ``forward`` removed on any
        exit), so the forward costs the blocks from ``layer`` on. The Hugging Face decoder loop
        passes the hidden states from block to block and each attention module keeps its own
        ``layer_idx`` for the KV cache, so nothing else depends on the skipped blocks."""
        layer = int(layer) % len(self.model.blocks)
        skipped = list(self.model.blocks)[:layer]

        def identity(hidden_states, *args, **kw):
            return hidden_states

        for block in skipped:  # object's setattr: a bridge component forwards attribute writes to the HF module
            object.__setattr__(block, "forward", identity)
        try:
            return self.run_with_kv_cache(resid, kwargs.pop("past_key_values", None), start_at_layer=layer, **kwargs)
        finally:
            for block in skipped:
                object.__delattr__(block, "forward")

    def crop_kv_cache(self, kv_cache, n_pos):
        import copy

        if kv_cache is None or n_pos == 0:
            return None
        cropped = copy.copy(kv_cache)
        cropped.layers = [copy.copy(entry) for entry in kv_cache.layers]
        for entry in cropped.layers:
            entry.keys, entry.values = entry.keys[..., :n_pos, :], entry.values[..., :n_pos, :]
        return cropped

    def single_position_logits(self, resid, layer, query, kv_cache):
        """The rows are packed as ``row`` new positions of *one* sequence, all at position ``query``
        (``position_ids``), with a 4-D mask letting row r see the cached keys (inside the layer's
        sliding window) and its own key only; the cache's keys and values are thus shared, never
        copied per row. The blocks before ``layer`` do not run (:meth:`forward_from_layer`)."""
        import copy

        rows = resid.shape[0]
        if kv_cache is not None:  # a shallow copy: the forward appends the rows' keys to the copy only
            kv_cache = copy.copy(kv_cache)
            kv_cache.layers = [copy.copy(entry) for entry in kv_cache.layers]
        types = getattr(self.hf_config, "layer_types", None)
        windows = (
            {name: self.sliding_window(l) for l, name in enumerate(types)}
            if types
            else {"full_attention": self.sliding_window(0)}
        )
        masks = {}
        for name, window in windows.items():
            seen = torch.ones(rows, query, dtype=torch.bool, device=resid.device)
            if window is not None:
                seen[:, : max(0, query - window + 1)] = False
            own = torch.eye(rows, dtype=torch.bool, device=resid.device)
            masks[name] = torch.cat([seen, own], dim=1)[None, None]
        mask = masks if types else masks["full_attention"]  # one mask per layer type, as the model's forward takes them
        positions = torch.full((1, rows), query, dtype=torch.long, device=resid.device)
        return self.forward_from_layer(
            resid[None], layer, past_key_values=kv_cache, attention_mask=mask, position_ids=positions
        )[0]
