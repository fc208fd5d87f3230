"""The load-time check of the HF-native backend: what geolens reads is what the model computes.

On a short random input, for every layer, the attention output rebuilt from the captured pattern
and v (docs/method.md §0),

    a_i = Σ_h Σ_j α_ij^h v_j^h W_O^h + b_O,

computed in float64, must equal the attention module's own output (``blocks.{l}.attn.hook_out``)
up to the rounding of the model's dtype; the pattern must be ``[batch, head, query, key]`` with
rows summing to 1, and zero outside the layer's sliding window (:meth:`HFAdapter.sliding_window`)
where the input is longer than the window. Anything else (an attention module edited after
loading, a family whose attention bypasses ``transformers``' attention interface, a head layout
the family adapter gets wrong) raises :class:`AttentionCheckError` naming the family and the
layer, so no analysis ever runs on a wrong reading.
"""

from __future__ import annotations

import torch

from geolens.adapter import adapter_for, expand_kv_heads
from geolens.hf.backend import cached_forward, config


class AttentionCheckError(RuntimeError):
    """What geolens would read of a Hugging Face model's attention is not what the model computes.

    >>> from geolens.hf import prepare
    >>> from geolens.hf.tiny import tiny_family
    >>> model = tiny_family("qwen3")  # a random 2-layer Qwen3, its layer 1 edited after loading:
    >>> _ = model.model.layers[1].self_attn.register_forward_hook(lambda m, args, out: (out[0] + 0.01, *out[1:]))
    >>> prepare(model)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    geolens.hf.check.AttentionCheckError: hf-qwen3: layer 1: the attention output rebuilt ... differs ...
    """


def check_tokens(model, *, n_pos: int = 24, batch: int = 2, seed: int = 0) -> torch.Tensor:
    """The check's input: ``[batch, n_pos]`` token ids drawn from a fixed seed (n_pos capped at the context)."""
    cfg = config(model)
    n = min(n_pos, cfg.n_ctx or n_pos)
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.d_vocab, (batch, n), generator=generator)


def check_attention(model, tokens: torch.Tensor | None = None) -> float:
    """Verify every layer's attention reading (module docstring); returns the largest error
    relative to its tolerance (≤ 1). Raises :class:`AttentionCheckError` otherwise.

    >>> from geolens.hf import prepare
    >>> from geolens.hf.tiny import tiny_family
    >>> model = prepare(tiny_family("qwen3"))  # prepare runs this check once; it can be rerun at any time
    >>> check_attention(model) <= 1
    True
    """
    adapter = adapter_for(model)
    tokens = check_tokens(model) if tokens is None else tokens
    names = set()
    for l in range(adapter.n_layers):
        names |= {adapter.pattern_hook(l), adapter.value_hook(l), adapter.attn_out_hook(l)}
    with torch.no_grad():
        _, cache = cached_forward(model, tokens, names_filter=names)
    eps = torch.finfo(next(model.parameters()).dtype).eps
    worst = 0.0
    for l in range(adapter.n_layers):
        where = f"{adapter.family}: layer {l}"
        if adapter.pattern_hook(l) not in cache:
            raise AttentionCheckError(
                f"{where}: its attention did not go through transformers' attention interface (no pattern was captured)"
            )
        pattern = cache[adapter.pattern_hook(l)].double()
        v = cache[adapter.value_hook(l)].double()
        out = cache[adapter.attn_out_hook(l)].double()
        b, n = tokens.shape
        if tuple(pattern.shape) != (b, adapter.n_heads, n, n) or tuple(v.shape) != (
            b,
            n,
            adapter.n_kv_heads,
            adapter.d_head,
        ):
            raise AttentionCheckError(
                f"{where}: captured pattern {tuple(pattern.shape)} and v {tuple(v.shape)}, expected "
                f"{(b, adapter.n_heads, n, n)} and {(b, n, adapter.n_kv_heads, adapter.d_head)}"
            )
        rows = (pattern.sum(-1) - 1).abs().max().item()
        if not rows <= max(1e-3, float(eps)):  # each weight rounded to the model's dtype: ≤ eps/2 in all
            raise AttentionCheckError(f"{where}: attention rows sum to 1 within {rows:.2g} only")
        window = adapter.sliding_window(l)
        if window is not None and window < n:
            q, k = torch.arange(n)[:, None], torch.arange(n)[None]
            outside = pattern[..., (q - k) >= window]
            if bool((outside != 0).any()):
                raise AttentionCheckError(f"{where}: keys outside the sliding window of {window} receive attention")
        W_O, b_O = adapter.output_weights(l)
        W_O, b_O = W_O.detach().double(), b_O.detach().double()
        z = torch.einsum("bhqk,bkhd->bqhd", pattern, expand_kv_heads(v, adapter.n_heads))
        rebuilt = torch.einsum("bqhd,hdm->bqm", z, W_O) + b_O
        # rounding of the model's dtype: a few eps of the largest Σ|terms|, growing like √K over the
        # K = head·d_head products summed (observed below 1 eps·scale on the tiny families)
        scale = float(torch.einsum("bqhd,hdm->bqm", z.abs(), W_O.abs()).max() + b_O.abs().max()) + 1e-30
        tolerance = 4 * (adapter.n_heads * adapter.d_head) ** 0.5 * eps * scale
        err = float((rebuilt - out).abs().max())
        if not err <= tolerance:
            raise AttentionCheckError(
                f"{where}: the attention output rebuilt from the captured pattern and v (Σ_h z^h W_O^h + b_O) "
                f"differs from the attention module's output by {err:.3g} (tolerance {tolerance:.2g}): "
                "geolens cannot read this model's attention exactly"
            )
        worst = max(worst, err / tolerance)
    return worst
