"""The outcomes of one masked layer (docs/faithfulness/PROTOCOL.md §3): the masked forwards of the
per-layer masking endpoint start at the masked layer from the clean residual stream and score the
next-token predictions at the protocol's positions (:func:`masked_outcomes`). The masks and the
document runner are :mod:`geolens.faithfulness.layer_masking`."""

from __future__ import annotations

from typing import Sequence

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from geolens.adapter import adapter_for
from geolens.interventions.base import applied
from geolens.interventions.masking import pattern_mask_hooks
from geolens.validation import check_context, check_layer


def _scored_positions_hook(model, positions: Sequence[int]):
    """Keep only the scored positions just before the unembedding (position-wise maps follow)."""
    index = torch.as_tensor(list(positions), dtype=torch.long)

    def hook(x: Tensor, hook) -> Tensor:
        return x[:, index.to(x.device)]

    return (adapter_for(model).unembed_input_hook, hook)


def masked_outcomes(
    model,
    tokens: Int[Tensor, "1 pos"],
    layer: int,
    masks: Bool[Tensor, "n_masks head query key"],
    positions: Sequence[int],
    clean_logits: Float[Tensor, "scored d_vocab"],
    *,
    resid_pre: Float[Tensor, "1 pos d_model"] | None = None,
    batch_size: int = 16,
) -> dict[str, Float[Tensor, "n_masks scored"]]:
    """KL(clean ‖ masked), Δp of the clean top-1 token and the masked NLL of the actual next token
    at each scored position (float64, from the logits), for each mask of ``layer`` (α_ij^h = 0
    where True, not renormalised; head axis n_heads or 1).

    ``resid_pre`` (the clean residual stream entering ``layer``): each forward starts there
    (:meth:`~geolens.adapter.ModelAdapter.forward_from_layer`), the blocks before ``layer`` not
    run. None: each forward runs the whole model from ``tokens`` (the reference, and the
    baseline of ``benchmarks/masking.py``); both give the same outcomes. ``batch_size`` masks per
    forward; the first forward also runs one unmasked row, whose logits must equal
    ``clean_logits`` (the clean logits at ``positions``), else RuntimeError.

    >>> import geolens, torch
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")
    >>> tokens = tiny_tokens(model)[:1]
    >>> logits = model(tokens)[0, [4, 8]]
    >>> masks = torch.ones(2, 4, 20, 20, dtype=torch.bool).tril()  # everything removed, twice
    >>> out = masked_outcomes(model, tokens, 1, masks, [4, 8], logits)
    >>> tuple(out["kl"].shape), bool((out["kl"] > 0).all())
    ((2, 2), True)
    """
    tokens = check_tokens(model, tokens)
    n_pos = tokens.shape[1]
    layer = check_layer(layer, model.cfg.n_layers)
    positions = [int(p) for p in positions]
    if not positions or min(positions) < 0 or max(positions) > n_pos - 2:
        raise ValueError(
            f"scored positions must lie in 0 … {n_pos - 2} (each predicts the next token), got {positions[:3]}…"
        )
    if masks.dtype != torch.bool or masks.ndim != 4 or masks.shape[-2:] != (n_pos, n_pos):
        raise ValueError(
            f"masks must be bool [n_masks, head, {n_pos}, {n_pos}], got {masks.dtype} {tuple(masks.shape)}"
        )
    if clean_logits.shape[0] != len(positions):
        raise ValueError(f"clean_logits has {clean_logits.shape[0]} rows for {len(positions)} scored positions")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if resid_pre is not None and tuple(resid_pre.shape[:2]) != (1, n_pos):
        raise ValueError(f"resid_pre must be [1, {n_pos}, d_model], got {tuple(resid_pre.shape)}")
    adapter = adapter_for(model)
    ref = torch.log_softmax(clean_logits.to(torch.float64), dim=-1)  # [scored, vocab]
    p_ref = ref.exp()
    top = ref.argmax(-1)
    following = tokens[0, torch.tensor(positions) + 1].to(ref.device)
    rows = torch.arange(len(positions), device=ref.device)
    out = {"kl": [], "delta_p": [], "nll": []}
    tail = _scored_positions_hook(model, positions)
    with torch.no_grad():
        for start in range(0, masks.shape[0], batch_size):
            chunk = masks[start : start + batch_size]
            check = start == 0
            if check:  # one unmasked row: the clean reference of the batch
                chunk = torch.cat([torch.zeros_like(chunk[:1]), chunk])
            n = chunk.shape[0]
            hooks = list(pattern_mask_hooks(model, chunk[None], [layer])) + [tail]
            with applied(model, hooks):
                if resid_pre is None:
                    logits = model(tokens.expand(n, -1))
                else:
                    logits = adapter.forward_from_layer(resid_pre.expand(n, -1, -1).contiguous(), layer)
            if check:
                _check_reference(logits[0], clean_logits, layer)
                logits = logits[1:]
            logp = torch.log_softmax(logits.to(torch.float64), dim=-1)  # [n, scored, vocab]
            out["kl"].append((p_ref * (ref - logp)).sum(-1))
            out["delta_p"].append(logp[:, rows, top].exp() - p_ref[rows, top])
            out["nll"].append(-logp[:, rows, following])
            del logits, logp
    return {k: torch.cat(v) if v else torch.zeros(0, len(positions), dtype=torch.float64) for k, v in out.items()}


def _check_reference(row: Tensor, clean: Tensor, layer: int) -> None:
    """The batch's unmasked row must reproduce the clean logits (float32 rounding aside)."""
    scale = 1.0 + float(clean.abs().max())
    err = float((row.to(torch.float64) - clean.to(torch.float64)).abs().max())
    if not err <= 1e-4 * scale:
        raise RuntimeError(
            f"layer {layer}: the forward without masks differs from the clean forward by {err:.3g} in the "
            "logits: starting at this layer from the clean residual stream is wrong for this model"
        )


def check_tokens(model, tokens) -> Tensor:
    """``tokens`` when it is one unpadded window ``[1, pos]`` of integers within the context; ValueError otherwise."""
    if not isinstance(tokens, Tensor) or tokens.dtype.is_floating_point or tokens.ndim != 2 or tokens.shape[0] != 1:
        raise ValueError(
            f"tokens must be one unpadded window, an integer tensor [1, pos]; got {getattr(tokens, 'shape', type(tokens))}"
        )
    check_context(model, tokens.shape[1])
    return tokens
