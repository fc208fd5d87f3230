"""The effect of removing each single term of one (layer, query): :func:`per_term_effects`.

The fast path (batched single-position forwards from the layer on, over a KV cache of the clean
prefix, with a ``hook_z`` edit per row) and the naive path (a full forward of the whole text per
term with α zeroed in ``hook_pattern``: the oracle of the tests and the speed baseline), as the
docstring of :mod:`geolens.per_term` derives them.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from geolens.adapter import adapter_for
from geolens.interventions.base import applied
from geolens.per_term.exact import numerical_floor
from geolens.per_term.state import (
    OUTCOMES,
    Method,
    PerTermEffects,
    Scope,
    _assemble,
    _check_args,
    _check_reference,
    _chunks,
    _Clean,
    _clean_state,
    _outcomes,
    _param_dtype,
    _terms,
)

# ---------------------------------------------------------------------------------------------
# The fast path


def _z_removal(clean: _Clean, chunk: Sequence[tuple[int, int]]) -> Float[Tensor, "batch head d_head"]:
    """Row 0 zeros (the clean reference); row b + 1: α_ij^h v_j^h in the term's head (every head
    for a source), what removing the term subtracts from z_i."""
    n_heads, d_head = clean.v.shape[1:]
    delta = clean.v.new_zeros(len(chunk) + 1, n_heads, d_head)
    for b, (h, j) in enumerate(chunk, start=1):
        if h < 0:
            delta[b] = clean.alpha[:, j, None] * clean.v[j]
        else:
            delta[b, h] = clean.alpha[h, j] * clean.v[j, h]
    return delta


def _z_hook(delta: Tensor) -> Callable:
    def hook(z: Tensor, hook) -> Tensor:
        rows = delta.shape[0]  # [batch, 1, ...] (batched rows) or [1, rows, ...] (packed rows)
        return (z.reshape(rows, -1) - delta.reshape(rows, -1).to(z.dtype)).reshape(z.shape)

    return hook


def _removal_effects(
    model, clean: _Clean, prefix, layer: int, query: int, scope: str, outcome, batch_size: int, only=None, target=None
) -> PerTermEffects:
    """The fast path's batches for one scope, given the clean state and the clean prefix's KV cache.
    Records the largest :func:`numerical_floor` over its batches (none ran: None)."""
    adapter = adapter_for(model)
    values: dict[str, list[Tensor]] = {name: [] for name in outcome}
    if target is not None:
        values["delta_logp_target"] = []
    ran, terms = _terms(clean, scope, only)
    top = int(clean.logits.argmax())
    floors: dict[str, float] = {}
    for chunk in _chunks(terms, batch_size):
        resid = clean.resid_pre.expand(len(chunk) + 1, -1)
        with applied(model, [(adapter.z_hook(layer), _z_hook(_z_removal(clean, chunk)))]):
            logits = adapter.single_position_logits(resid, layer, query, prefix)
        _check_reference(logits[0], clean.logits, layer, query, dtype=_param_dtype(model))
        for key, value in numerical_floor(logits[0], clean.logits, target).items():
            floors[key] = max(floors.get(key, value), value)
        for name, value in _outcomes(logits[1:], logits[0], top, outcome, target).items():
            values[name].append(value)
    extra = dict(floors, target=None if target is None else int(target))
    return _assemble(model, layer, query, scope, outcome, clean, ran, terms, values, "fast", extra)


def per_term_effects(
    model,
    tokens,
    layer: int,
    query: int,
    *,
    scope: Scope = "term",
    outcome: str | Sequence[str] = OUTCOMES,
    method: Method = "fast",
    batch_size: int | None = None,
    terms: Sequence | None = None,
) -> PerTermEffects:
    """Exact effect on the next-token prediction at ``query`` of removing each single attention
    term α_ij^h ṽ_j^h (``scope="term"``, ``[head, source]``) or each source Σ_h α_ij^h ṽ_j^h
    (``scope="source"``, ``[source]``) from ``layer``'s attention output at ``query``, everything
    else clean. Outcomes: KL(clean ‖ perturbed) and Δp of the clean top-1 token (:mod:`geolens.per_term`).

    ``method="fast"``: batched single-position forwards from ``layer`` on over a KV cache of the
    clean prefix (:mod:`geolens.per_term`), ``batch_size`` terms per forward (default 128; memory: the
    cache's keys and values are concatenated per row at each layer). ``method="naive"``, the test
    oracle and the speed baseline: for each term, a full forward of the whole text from layer 0
    with α_ij^h = 0 in ``layer``'s ``hook_pattern`` at ``query`` (every head for a source; not
    renormalised, so exactly α_ij^h ṽ_j^h leaves a_i, docs/method.md §3), ``batch_size`` terms per
    forward, one row each (default 1); its clean reference is a full forward without hooks. Both
    record their method in the result. ``terms`` restricts the run to some (head, source) pairs
    (sources for ``scope="source"``); the others are 0 with ``ran`` False (the benchmark times a
    subset). ``layer`` and ``query`` may be negative. :func:`~geolens.per_term.position_effects` gives both scopes
    and the gradient of one position at once.

    >>> import geolens
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")
    >>> effects = per_term_effects(model, tiny_tokens(model, length=12)[:1], layer=1, query=-1)
    >>> tuple(effects.kl.shape), bool((effects.kl >= 0).all())  # 4 heads, sources 0 … 11
    ((4, 12), True)
    >>> naive = per_term_effects(model, tiny_tokens(model, length=12)[:1], layer=1, query=-1, method="naive")
    >>> bool(torch.allclose(naive.kl, effects.kl, atol=1e-6))
    True
    """
    if method not in ("fast", "naive"):
        raise ValueError(f"method must be 'fast' or 'naive', got {method!r}")
    if batch_size is None:
        batch_size = 128 if method == "fast" else 1
    tokens, layer, query, outcome = _check_args(model, tokens, layer, query, scope, outcome, batch_size)
    with torch.no_grad():
        clean = _clean_state(model, tokens, layer, query)
        if method == "naive":
            return _naive_effects(model, tokens, clean, layer, query, scope, outcome, batch_size, terms)
        prefix = adapter_for(model).prefix_kv_cache(tokens[:, :query]) if bool((clean.alpha != 0).any()) else None
        return _removal_effects(model, clean, prefix, layer, query, scope, outcome, batch_size, terms)


# ---------------------------------------------------------------------------------------------
# The naive path


def _naive_effects(
    model, tokens, clean: _Clean, layer: int, query: int, scope: str, outcome, batch_size: int, only
) -> PerTermEffects:
    """The naive path of :func:`per_term_effects`: full forwards of the whole text, ``batch_size``
    terms per forward, each with its α_ij^h zeroed in ``layer``'s pattern at ``query``."""
    adapter = adapter_for(model)
    values: dict[str, list[Tensor]] = {name: [] for name in outcome}
    ran, terms = _terms(clean, scope, only)
    reference = model(tokens, return_type="logits")[0, query]
    top = int(reference.argmax())
    for chunk in _chunks(terms, batch_size):

        def zero_terms(pattern: Tensor, hook, chunk=chunk) -> Tensor:
            pattern = pattern.clone()
            for b, (h, j) in enumerate(chunk):
                pattern[b, slice(None) if h < 0 else h, query, j] = 0
            return pattern

        with applied(model, [(adapter.pattern_hook(layer), zero_terms)]):
            logits = model(tokens.expand(len(chunk), -1), return_type="logits")[:, query]
        for name, value in _outcomes(logits, reference, top, outcome).items():
            values[name].append(value)
    clean.logits = reference
    return _assemble(model, layer, query, scope, outcome, clean, ran, terms, values, "naive")
