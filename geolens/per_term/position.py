"""Everything measured at one (layer, query) at once: :func:`position_effects`.

Both scopes of :func:`~geolens.per_term.per_term_effects` and the gradient of the clean top-1
log-probability with respect to each head's z_i (gradient × activation, the first-order estimate
of each removal), sharing one clean state and one KV cache of the clean prefix; a corpus run
passes a ``run_with_cache`` of the whole text and its KV cache, computed once per text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from geolens.adapter import adapter_for
from geolens.interventions.base import applied
from geolens.per_term.effects import _removal_effects
from geolens.per_term.state import (
    OUTCOMES,
    PerTermEffects,
    _check_args,
    _check_reference,
    _Clean,
    _clean_state,
    _param_dtype,
    clean_position,
)


@dataclass
class PositionEffects:
    """Everything measured at one (layer, query) by :func:`position_effects`."""

    term: PerTermEffects  # scope "term": [head, source]
    source: PerTermEffects | None  # scope "source": [source] (None when not asked for)
    grad_z: Float[Tensor, "head d_head"]  # ∂ log p_{t*} / ∂ z_i^h at the clean forward (the model's dtype)
    alpha: Float[Tensor, "head source"]  # α_i· of the layer, sources 0 … query
    v: Float[Tensor, "source head d_head"]  # the layer's values, kv heads expanded
    grad_z_target: Tensor | None = None  # ∂ log p_target / ∂ z_i^h, with ``target=`` (else None)

    @property
    def grad_x_act_target(self) -> Tensor | None:
        """:attr:`grad_x_act` for the log-probability of ``target`` (None without ``target=``)."""
        if self.grad_z_target is None:
            return None
        dots = torch.einsum("hd,jhd->hj", self.grad_z_target.double(), self.v.double())
        return -(self.alpha.double() * dots)

    @property
    def grad_x_act(self) -> Float[Tensor, "head source"]:
        """−⟨∂ log p_{t*}/∂ a_i, α_ij^h ṽ_j^h⟩ = −α_ij^h ⟨∂ log p_{t*}/∂ z_i^h, v_j^h⟩: the first-order
        estimate of the change of log p_{t*} when the term is removed (attribution patching,
        Syed et al. 2023), float64."""
        dots = torch.einsum("hd,jhd->hj", self.grad_z.double(), self.v.double())
        return -(self.alpha.double() * dots)


def _gradient(model, clean: _Clean, prefix, layer: int, query: int, token: int | None = None) -> Tensor:
    """∂ log p_{token} / ∂ z_i^h (default token t*) at the clean single-position forward: a zero
    probe added to ``hook_z``."""
    adapter = adapter_for(model)
    n_heads, d_head = clean.v.shape[1:]
    top = int(clean.logits.argmax()) if token is None else int(token)
    probe = torch.zeros(n_heads, d_head, dtype=clean.v.dtype, device=clean.v.device, requires_grad=True)

    def add_probe(z: Tensor, hook) -> Tensor:
        return z + probe.reshape((1,) * (z.ndim - 2) + (n_heads, d_head)).to(z.dtype)

    with torch.enable_grad(), applied(model, [(adapter.z_hook(layer), add_probe)]):
        logits = adapter.single_position_logits(clean.resid_pre[None].detach(), layer, query, prefix)
        _check_reference(logits[0].detach(), clean.logits, layer, query, dtype=_param_dtype(model))
        (grad,) = torch.autograd.grad(torch.log_softmax(logits[0].double(), -1)[top], probe)
    return grad.detach()


def position_effects(
    model,
    tokens,
    layer: int,
    query: int,
    *,
    clean_run: tuple | None = None,
    kv_cache=None,
    outcome: str | Sequence[str] = OUTCOMES,
    batch_size: int = 128,
    target: int | None = None,
    scopes: Sequence[str] = ("term", "source"),
) -> PositionEffects:
    """:func:`~geolens.per_term.per_term_effects` at both scopes, and the gradient of log p_{t*}
    with respect to each head's z_i (for :attr:`PositionEffects.grad_x_act`), for one (``layer``,
    ``query``), sharing one clean state and one KV cache of the clean prefix.

    A corpus run measures many positions of one text: ``clean_run`` (the ``(logits, cache)`` of
    a ``run_with_cache`` of the whole ``tokens`` holding the layer's pattern, v and resid_pre) and
    ``kv_cache`` (``adapter_for(model).prefix_kv_cache(tokens)``, cropped here to the positions
    before ``query``) are then computed once per text.

    ``target`` (a token id, e.g. the actual next token): each scope also measures
    ``delta_logp_target`` (log p̃ − log p of that token) and the result carries the gradient of its
    log-probability (:attr:`PositionEffects.grad_x_act_target`). ``scopes``: drop ``"source"`` to
    measure the term scope only (``source`` is then None).

    >>> import geolens
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")
    >>> tokens = tiny_tokens(model, length=12)[:1]
    >>> e = position_effects(model, tokens, layer=1, query=7)
    >>> tuple(e.term.kl.shape), tuple(e.source.kl.shape), tuple(e.grad_x_act.shape)
    ((4, 8), (8,), (4, 8))
    """
    tokens, layer, query, outcome = _check_args(model, tokens, layer, query, "term", outcome, batch_size)
    adapter = adapter_for(model)
    with torch.no_grad():
        if clean_run is None:
            clean = _clean_state(model, tokens, layer, query)
        else:
            logits, cache = clean_run
            if logits.shape[:2] != tokens.shape:
                raise ValueError(
                    f"clean_run's logits {tuple(logits.shape)} are not those of tokens {tuple(tokens.shape)}"
                )
            clean = clean_position(model, logits, cache, layer, query)
        if kv_cache is None:
            prefix = adapter.prefix_kv_cache(tokens[:, :query])
        else:
            prefix = adapter.crop_kv_cache(kv_cache, query)
        term = _removal_effects(model, clean, prefix, layer, query, "term", outcome, batch_size, target=target)
        source = (
            _removal_effects(model, clean, prefix, layer, query, "source", outcome, batch_size, target=target)
            if "source" in scopes
            else None
        )
    grad = _gradient(model, clean, prefix, layer, query)
    grad_target = None if target is None else _gradient(model, clean, prefix, layer, query, int(target))
    return PositionEffects(term, source, grad, clean.alpha, clean.v, grad_target)
