"""Tiny random models built offline from a config, for tests, tutorials and quick experiments.

- ``tiny_bridge("gqa")``: Llama, 4 query heads sharing 2 kv heads, RMSNorm, no biases.
- ``tiny_bridge("mha")``: GPT-2, 4 heads, LayerNorm, biases everywhere (b_V, b_O non-zero).
- ``tiny_bridge("gemma")``: Gemma 3 text, GQA, a post-attention norm and a sliding window.
- ``tiny_hooked("gqa" | "mha")``: the same shapes as a TransformerLens 2.x/3.x
  ``HookedTransformer`` (only where that class exists).

All use a character-level tokenizer (``<bos>`` = id 0) so that nothing is downloaded. This module
only writes their configurations; the TransformerLens models are built by the adapter of their
family (:func:`geolens.adapter.bridge.transformer_bridge`,
:func:`geolens.adapter.hooked.hooked_transformer`), and :func:`geolens.models.load_model` loads
them by name (``"tiny-gqa"``, ...), so this module imports nothing from :mod:`geolens.models`.
"""

from __future__ import annotations

import string

import torch

from geolens.adapter.bridge import transformer_bridge
from geolens.adapter.hooked import hooked_transformer

TINY_KINDS = ("gqa", "mha", "gemma")  # the kinds of tiny_hf_model and tiny_bridge
HOOKED_TINY_KINDS = ("gqa", "mha")  # the kinds of tiny_hooked
TINY_MODELS = tuple(f"tiny-{kind}" for kind in TINY_KINDS)  # their names for geolens.load_model

ALPHABET = string.ascii_lowercase + string.digits + " .,!?'-"
SPECIALS = ["<bos>", "<eos>", "<pad>", "<unk>"]
VOCAB_SIZE = 64


def tiny_tokenizer():
    """A character-level fast tokenizer: ``<bos>``=0, ``<eos>``=1, ``<pad>``=2, ``<unk>``=3.

    >>> tok = tiny_tokenizer()
    >>> ids = tok("The cat")["input_ids"]  # BOS first, one id per character, lower-cased
    >>> ids, tok.convert_ids_to_tokens(ids)[:4]
    ([0, 23, 11, 8, 40, 6, 4, 23], ['<bos>', 't', 'h', 'e'])
    """
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + list(ALPHABET))}
    assert len(vocab) <= VOCAB_SIZE
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        add_bos_token=True,
        name_or_path="geolens-tiny",
    )


def _randomise_biases(model: torch.nn.Module, scale: float = 0.1) -> None:
    """Random init zeroes biases; make them non-zero so that b_V/b_O handling is tested."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or name.split(".")[-1].startswith("b_"):
                p.normal_(0, scale)


def tiny_hf_model(kind: str = "gqa", *, seed: int = 0, n_layers: int = 2, n_ctx: int = 128):
    """A random HF causal LM of the given ``kind`` (see module docstring), in eval mode."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    if kind == "gqa":
        cfg = LlamaConfig(
            vocab_size=VOCAB_SIZE,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=n_layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=n_ctx,
            tie_word_embeddings=False,
            bos_token_id=0,
            eos_token_id=1,
            pad_token_id=2,
        )
        model = LlamaForCausalLM(cfg)
    elif kind == "mha":
        cfg = GPT2Config(
            vocab_size=VOCAB_SIZE,
            n_embd=32,
            n_layer=n_layers,
            n_head=4,
            n_positions=n_ctx,
            bos_token_id=0,
            eos_token_id=1,
            attn_pdrop=0.0,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
        )
        model = GPT2LMHeadModel(cfg)
        _randomise_biases(model)
    elif kind == "gemma":
        from transformers import Gemma3ForCausalLM, Gemma3TextConfig

        cfg = Gemma3TextConfig(
            vocab_size=VOCAB_SIZE,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=n_layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            max_position_embeddings=n_ctx,
            sliding_window=16,
            layer_types=["sliding_attention"] * (n_layers - 1) + ["full_attention"],
            bos_token_id=0,
            eos_token_id=1,
            pad_token_id=2,
        )
        model = Gemma3ForCausalLM(cfg)
        # Random init leaves the norm weights at their neutral value; perturb them so that the
        # post-attention norm really changes hook_attn_out.
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.normal_(0, 0.5)
    else:
        raise ValueError(f"unknown tiny model kind {kind!r}: use one of {', '.join(map(repr, TINY_KINDS))}")
    model.config.architectures = [type(model).__name__]
    model.config._attn_implementation = "eager"
    return model.eval()


def tiny_bridge(
    kind: str = "gqa",
    *,
    seed: int = 0,
    compatibility_mode: bool = False,
    n_layers: int = 2,
    dtype: torch.dtype = torch.float32,
):
    """A tiny random ``TransformerBridge`` (TransformerLens 4.x), built offline, its parameters in
    ``dtype`` (float32 buffers such as rotary frequencies kept, as ``from_pretrained`` does).

    >>> model = tiny_bridge("gqa")  # raises ImportError under TransformerLens 2.x/3.x: use tiny_hooked
    >>> type(model).__name__, model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_model
    ('TransformerBridge', 2, 4, 32)
    """
    hf = tiny_hf_model(kind, seed=seed, n_layers=n_layers)
    with torch.no_grad():
        for p in hf.parameters():
            p.data = p.data.to(dtype)
    return transformer_bridge(
        f"geolens-tiny-{kind}", hf, tiny_tokenizer(), compatibility_mode=compatibility_mode, device="cpu", dtype=dtype
    )


def tiny_hooked(kind: str = "gqa", *, seed: int = 0, n_layers: int = 2):
    """A tiny random ``HookedTransformer`` (TransformerLens 2.x/3.x) with non-zero biases."""
    common = dict(
        n_layers=n_layers, d_model=32, n_heads=4, d_head=8, d_mlp=64, d_vocab=VOCAB_SIZE, n_ctx=128, seed=seed
    )
    if kind == "gqa":
        fields = dict(
            **common,
            n_key_value_heads=2,
            act_fn="silu",
            normalization_type="RMS",
            positional_embedding_type="rotary",
            rotary_dim=8,
            gated_mlp=True,
        )
    elif kind == "mha":
        fields = dict(**common, act_fn="gelu_new", normalization_type="LN")
    else:
        raise ValueError(f"unknown tiny model kind {kind!r}: use one of {', '.join(map(repr, HOOKED_TINY_KINDS))}")
    model = hooked_transformer(fields, tiny_tokenizer())
    _randomise_biases(model)
    return model.eval()


def tiny_tokens(model, texts=("the cat sat on the mat.", "a dog ran far away!!"), *, length: int = 20) -> torch.Tensor:
    """``[batch, length]`` token ids starting with BOS (0), equal length, no padding.

    >>> tiny_tokens(tiny_bridge("gqa"), length=8)  # each text repeated to fill the length
    tensor([[ 0, 23, 11,  8, 40,  6,  4, 23],
            [ 0,  4, 40,  7, 18, 10, 40, 21]])
    """
    tok = tiny_tokenizer()
    rows = []
    for text in texts:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        ids = (ids * (length // max(len(ids), 1) + 1))[: length - 1]
        rows.append([tok.bos_token_id] + ids)
    return torch.tensor(rows, device=next(model.parameters()).device)
