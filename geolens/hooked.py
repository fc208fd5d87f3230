"""SmolLM2 (or any local Llama-architecture checkpoint) as a TransformerLens 2.x/3.x ``HookedTransformer``.

Researchers' existing notebooks use ``HookedTransformer``, whose ``from_pretrained`` does not know
SmolLM2, and a forced local load silently uses ``rotary_base`` 10000 instead of 100000
(docs/tl-notes.md). The correct route, used here, is a config written from the HF config (rotary base
included) plus TransformerLens' own ``convert_llama_weights``; weights are then processed as
``HookedTransformer.from_pretrained`` does by default (folded norms, centred writing weights).

Only importable where ``transformer_lens.HookedTransformer`` exists (TL 2.x/3.x).
"""

from __future__ import annotations

import torch


def _rope_theta(hf_cfg) -> float:
    params = getattr(hf_cfg, "rope_parameters", None) or {}
    if not isinstance(params, dict):
        params = {}
    return float(params.get("rope_theta") or getattr(hf_cfg, "rope_theta", None) or 10000.0)


def _tokenizer(path: str):
    """The checkpoint's tokenizer; a folder saved by transformers 5 names a tokenizer class
    (``TokenizersBackend``) that transformers 4.x lacks, so fall back to its ``tokenizer.json``."""
    import json
    from pathlib import Path

    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    try:
        return AutoTokenizer.from_pretrained(path)
    except ValueError:
        config = json.loads((Path(path) / "tokenizer_config.json").read_text())
        special = {k: config[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token") if config.get(k)}
        return PreTrainedTokenizerFast(
            tokenizer_file=str(Path(path) / "tokenizer.json"), name_or_path=path, add_bos_token=True, **special
        )


def hooked_llama_from_checkpoint(path: str, *, fold_ln: bool = True, center_writing_weights: bool = True):
    """A ``HookedTransformer`` from a local Llama-architecture HF folder (e.g. the converted SmolLM2)."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_llama_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    c = AutoConfig.from_pretrained(path)
    # A config saved by transformers 5 keeps the rotary base in rope_parameters; transformers 4.x
    # ignores that key and silently falls back to rope_theta = 10000 (seen with SmolLM2's 1e5).
    c.rope_theta = _rope_theta(c)
    hf = AutoModelForCausalLM.from_pretrained(path, config=c, torch_dtype=torch.float32)
    if c.model_type != "llama":
        raise ValueError(f"{path} is a {c.model_type!r} checkpoint; this loader handles Llama architectures")
    d_head = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    cfg = HookedTransformerConfig(
        d_model=c.hidden_size, d_head=d_head, n_heads=c.num_attention_heads, d_mlp=c.intermediate_size,
        n_layers=c.num_hidden_layers, n_ctx=min(c.max_position_embeddings, 8192), eps=c.rms_norm_eps,
        d_vocab=c.vocab_size, act_fn=c.hidden_act, n_key_value_heads=c.num_key_value_heads,
        normalization_type="RMS", positional_embedding_type="rotary", rotary_adjacent_pairs=False,
        rotary_dim=d_head, rotary_base=_rope_theta(c), final_rms=True, gated_mlp=True,
        original_architecture="LlamaForCausalLM", default_prepend_bos=True,
    )  # fmt: skip
    state = convert_llama_weights(hf, cfg)
    tok = _tokenizer(path)
    model = HookedTransformer(cfg, tokenizer=tok)
    model.load_and_process_state_dict(
        state, fold_ln=fold_ln, center_writing_weights=center_writing_weights, center_unembed=True, fold_value_biases=True
    )
    model.eval()
    return model, hf
