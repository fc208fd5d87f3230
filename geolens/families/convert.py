"""A TransformerLens 2.x ``HookedTransformer`` converted from an in-memory HF causal LM, with
TransformerLens' own tools (the support matrix's ``tl2-hooked`` column, and its tests)."""

from __future__ import annotations

import torch

from geolens.families import hooked_config

N_POS = 12  # the comparison batch: longer than the tiny sliding windows (8)


def comparison_tokens(n_rows: int = 2, n_pos: int = N_POS, seed: int = 0) -> torch.Tensor:
    """``[n_rows, n_pos]`` token ids in 4 … 63, BOS (0) first, from a fixed seed."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(4, 64, (n_rows, n_pos), generator=g)
    t[:, 0] = 0
    return t


def hooked_from_hf(hf, tokenizer=None):
    """A TransformerLens 2.x ``HookedTransformer`` holding the weights of the in-memory HF causal LM
    ``hf``: the config of its family's ``hooked_config`` (:func:`geolens.families.hooked_config`),
    the weights converted by TransformerLens' own
    ``transformer_lens.pretrained.weight_conversions.convert_*_weights`` and loaded unprocessed (no
    norm folding, no centring, value biases kept), so W_V, b_V, W_O and b_O are the HF model's.

    Raises ``NotImplementedError`` for a family TransformerLens 2.x cannot hold, and
    ``ValueError`` when the converted model's logits differ from ``hf``'s (max abs error above
    1e-5 on a [2, 12] batch that reaches past the sliding windows).
    """
    import transformer_lens.pretrained.weight_conversions as conversions

    from geolens.adapter.hooked import hooked_transformer

    fields, converter = hooked_config(hf.config)
    process = dict(fold_ln=False, center_writing_weights=False, center_unembed=False, fold_value_biases=False)
    convert = getattr(conversions, converter)
    model = hooked_transformer(fields, tokenizer, weights=lambda cfg: convert(hf, cfg), **process).eval()
    tokens = comparison_tokens()
    with torch.no_grad():
        err = float((model(tokens) - hf(tokens).logits).abs().max())
    if not err <= 1e-5:
        raise ValueError(
            f"the HookedTransformer converted from this {hf.config.model_type} model gives other logits than the HF model"
        )
    return model
