"""Zero- and mean-ablation of attention heads at ``hook_z`` (docs/method.md §6).

Ablating head h of layer l replaces its z_i^h = Σ_j α_ij^h v_j^h (``blocks.{l}.attn.hook_z``,
``[batch, query, head, d_head]``) at every query position by

- ``"zero"``: 0, so the head adds nothing to Σ_h z^h W_O^h (b_O stays);
- ``"mean"``: the mean of z^h over a reference corpus (all batch rows and positions), so the
  head adds its average output instead of its input-dependent one.

Heads are given per layer as a bool ``[batch, head]`` (or ``[head]``) table: a batch of rows may
ablate different heads (one forward for many single-head ablations, as the sensitivity scan
does). :class:`MeanHeadZ` computes the reference means as a streaming
:class:`~geolens.streaming.CorpusAnalysis`.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterable, Iterator, Literal, Mapping

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from geolens.adapter import Z, hook_name
from geolens.interventions.base import FwdHooks, applied
from geolens.streaming import CorpusAnalysis, Moments

AblationMode = Literal["zero", "mean"]


def heads_by_layer(heads: Iterable[tuple[int, int]], n_layers: int, n_heads: int) -> dict[int, Bool[Tensor, "head"]]:
    """``{layer: bool[head]}`` from a list of ``(layer, head)`` pairs, with range checks."""
    out: dict[int, Tensor] = {}
    for l, h in heads:
        l, h = int(l), int(h)
        if not 0 <= l < n_layers or not 0 <= h < n_heads:
            raise IndexError(f"head ({l}, {h}) out of range for {n_layers} layers × {n_heads} heads")
        out.setdefault(l, torch.zeros(n_heads, dtype=torch.bool))[h] = True
    return out


def head_ablation_hooks(
    model,
    heads: Iterable[tuple[int, int]] | Mapping[int, Tensor],
    mode: AblationMode = "zero",
    means: Float[Tensor, "layer head d_head"] | None = None,
) -> FwdHooks:
    """``fwd_hooks`` that ablate heads at ``hook_z``.

    Args:
        heads: ``(layer, head)`` pairs, or ``{layer: bool[head] or bool[batch, head]}`` (per-row
            head sets; the batch axis must match the forward's batch).
        mode: ``"zero"`` or ``"mean"``.
        means: ``[n_layers, n_heads, d_head]`` reference means of z (:func:`mean_head_z`), needed
            for ``mode="mean"``.

    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")
    >>> tokens = tiny_tokens(model)
    >>> hooks = head_ablation_hooks(model, [(1, 0), (1, 3)])  # zero heads 0 and 3 of layer 1
    >>> with applied(model, hooks):
    ...     ablated = model(tokens)
    >>> [name for name, _ in hooks], bool((ablated != model(tokens)).any())
    (['blocks.1.attn.hook_z'], True)
    """
    cfg = model.cfg
    if mode not in ("zero", "mean"):
        raise ValueError(f"mode must be 'zero' or 'mean', got {mode!r}")
    if mode == "mean":
        if means is None:
            raise ValueError("mode='mean' needs the reference means of hook_z: means=mean_head_z(model, tokens)")
        if tuple(means.shape) != (cfg.n_layers, cfg.n_heads, cfg.d_head):
            raise ValueError(
                f"means must be [n_layers, n_heads, d_head]={(cfg.n_layers, cfg.n_heads, cfg.d_head)}, got {tuple(means.shape)}"
            )
    table = dict(heads) if isinstance(heads, Mapping) else heads_by_layer(heads, cfg.n_layers, cfg.n_heads)

    def make(layer: int, mask: Tensor):
        if mask.dtype != torch.bool or mask.shape[-1] != cfg.n_heads or mask.ndim not in (1, 2):
            raise ValueError(
                f"layer {layer}: head mask must be bool [head] or [batch, head], got {mask.dtype} {tuple(mask.shape)}"
            )

        def hook(z: Tensor, hook) -> Tensor:
            m = mask.to(z.device)
            m = m[None, None, :, None] if m.ndim == 1 else m[:, None, :, None]  # [b|1, 1, head, 1]
            if m.shape[0] not in (1, z.shape[0]):
                raise ValueError(f"{hook.name}: head mask has {m.shape[0]} rows, the batch has {z.shape[0]}")
            if mode == "zero":
                repl = torch.zeros((), dtype=z.dtype, device=z.device)
            else:
                repl = means[layer].to(device=z.device, dtype=z.dtype)[None, None]  # [1, 1, head, d_head]
            return torch.where(m, repl, z)

        return hook

    return [(hook_name(l, Z), make(l, mask)) for l, mask in sorted(table.items()) if bool(mask.any())]


@contextmanager
def ablated_heads(
    model,
    heads: Iterable[tuple[int, int]] | Mapping[int, Tensor],
    mode: AblationMode = "zero",
    means: Tensor | None = None,
) -> Iterator[None]:
    """Context manager: heads ablated inside the block, hooks removed on any exit (even errors)."""
    with applied(model, head_ablation_hooks(model, heads, mode, means)):
        yield


class MeanHeadZ(CorpusAnalysis):
    """Mean of ``hook_z`` per (layer, head) over all rows and positions: ``[layer, head, d_head]``."""

    def __init__(self, n_layers: int, n_heads: int, d_head: int):
        self.moments = Moments((n_layers, n_heads, d_head))

    @classmethod
    def for_model(cls, model) -> "MeanHeadZ":
        return cls(model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head)

    def hook_names(self, model) -> list[str]:
        return [hook_name(l, Z) for l in range(model.cfg.n_layers)]

    def update(self, model, cache, tokens) -> None:
        z = torch.stack([cache[hook_name(l, Z)] for l in range(model.cfg.n_layers)])  # [layer, b, q, h, d]
        samples = z.permute(1, 2, 0, 3, 4).reshape(-1, *z.shape[:1], *z.shape[3:])  # [b*q, layer, h, d]
        self.moments.update(samples, dim=0)

    def merge(self, other: "MeanHeadZ") -> "MeanHeadZ":
        self.moments.merge(other.moments)
        return self

    def result(self) -> Float[Tensor, "layer head d_head"]:
        return self.moments.mean.to(torch.float32)


def mean_head_z(
    model, tokens: Tensor, *, batch_size: int = 8, progress: bool = False
) -> Float[Tensor, "layer head d_head"]:
    """Reference means of z for mean ablation, streamed over ``tokens`` ``[n, seq]``.

    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")  # 2 layers, 4 heads of d_head 8
    >>> means = mean_head_z(model, tiny_tokens(model))
    >>> hooks = head_ablation_hooks(model, [(0, 2)], mode="mean", means=means)
    >>> tuple(means.shape), [name for name, _ in hooks]
    ((2, 4, 8), ['blocks.0.attn.hook_z'])
    """
    from geolens.runner import run_analysis

    return run_analysis(
        model, tokens, MeanHeadZ.for_model, model, batch_size=batch_size, progress=progress, desc="mean z"
    )
