"""Tiny random Hugging Face models of every supported family, built offline from their configs.

2 layers, d_model 32, 4 query heads (2 kv heads where the family has grouped-query attention),
d_head 8, a 64-token vocabulary (the character tokenizer of :mod:`geolens.testing`), 128
positions; the features that tell families apart are switched on at sizes a short test reaches:
a sliding window of 8 (Mistral, Qwen2 on its second layer, Gemma 2/3 on their first, Phi-3),
attention-logit and final-logit soft-capping (Gemma 2), partial rotary and parallel attention +
MLP (GPT-NeoX), non-zero biases (GPT-2, GPT-NeoX, Qwen2's q/k/v) and perturbed norm weights (so
that a post-attention norm really changes the block's output).

>>> from geolens.hf.tiny import FAMILIES, tiny_family
>>> len(FAMILIES), type(tiny_family("gpt2")).__name__
(10, 'GPT2LMHeadModel')
"""

from __future__ import annotations

import torch

from geolens import families as _families

WINDOW = 8

FAMILIES = tuple(_families.FAMILIES)
"""The families of the support matrix (:data:`geolens.families.FAMILIES`: HF ``config.model_type``
spellings, Gemma 3's text model aside)."""


def _configs(n_layers: int, n_ctx: int) -> dict:
    """family → (config, model class): the table of tiny configurations."""
    import transformers as T

    from geolens.testing import VOCAB_SIZE

    common = dict(
        vocab_size=VOCAB_SIZE,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=n_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=n_ctx,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        tie_word_embeddings=False,
    )
    alternating = ["sliding_attention", "full_attention"] * n_layers
    return {
        "llama": lambda: (T.LlamaConfig(**common), T.LlamaForCausalLM),
        "mistral": lambda: (T.MistralConfig(**common, sliding_window=WINDOW), T.MistralForCausalLM),
        "qwen2": lambda: (
            T.Qwen2Config(
                **common, use_sliding_window=True, sliding_window=WINDOW, layer_types=alternating[1 : n_layers + 1]
            ),
            T.Qwen2ForCausalLM,
        ),
        "qwen3": lambda: (T.Qwen3Config(**common, head_dim=8), T.Qwen3ForCausalLM),
        "gemma2": lambda: (
            T.Gemma2Config(
                **common,
                head_dim=8,
                sliding_window=WINDOW,
                layer_types=alternating[:n_layers],
                attn_logit_softcapping=5.0,
                final_logit_softcapping=3.0,
                query_pre_attn_scalar=8,
            ),
            T.Gemma2ForCausalLM,
        ),
        "gemma3": lambda: (
            T.Gemma3TextConfig(**common, head_dim=8, sliding_window=WINDOW, layer_types=alternating[:n_layers]),
            T.Gemma3ForCausalLM,
        ),
        "phi3": lambda: (T.Phi3Config(**common, sliding_window=WINDOW), T.Phi3ForCausalLM),
        "olmo2": lambda: (T.Olmo2Config(**common), T.Olmo2ForCausalLM),
        "gpt2": lambda: (
            T.GPT2Config(
                vocab_size=VOCAB_SIZE,
                n_embd=32,
                n_layer=n_layers,
                n_head=4,
                n_positions=n_ctx,
                bos_token_id=0,
                eos_token_id=1,
                pad_token_id=2,
                attn_pdrop=0.0,
                resid_pdrop=0.0,
                embd_pdrop=0.0,
            ),
            T.GPT2LMHeadModel,
        ),
        "gpt_neox": lambda: (
            T.GPTNeoXConfig(
                vocab_size=VOCAB_SIZE,
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=n_layers,
                num_attention_heads=4,
                max_position_embeddings=n_ctx,
                rotary_pct=0.5,
                use_parallel_residual=True,
                attention_bias=True,
                bos_token_id=0,
                eos_token_id=1,
                pad_token_id=2,
                tie_word_embeddings=False,
            ),
            T.GPTNeoXForCausalLM,
        ),
    }


def tiny_family(family: str, *, seed: int = 0, n_layers: int = 2, n_ctx: int = 128, attn_implementation: str = "eager"):
    """A random ``transformers`` causal LM of ``family`` (module docstring), in eval mode, float32."""
    table = _configs(n_layers, n_ctx)
    if family not in table:
        raise ValueError(f"unknown family {family!r}: use one of {FAMILIES}")
    cfg, cls = table[family]()
    cfg._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    model = cls(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
            elif "norm" in name or ".ln_" in name or name.endswith("ln_f.weight"):
                p.add_(torch.randn_like(p) * 0.3)
    model.config.architectures = [cls.__name__]
    return model.eval()
