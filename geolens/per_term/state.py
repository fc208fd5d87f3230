"""The clean state of one (layer, query) and the shape of a per-term result (:mod:`geolens.per_term`).

:class:`PerTermEffects` is what :func:`~geolens.per_term.per_term_effects` returns; the argument
checks, the clean state of a position (α, v and the residual entering the layer at the query,
the clean logits) and the assembly of a result from the outcomes of the terms run are shared by
the fast and the naive paths (:mod:`geolens.per_term.effects`) and by
:func:`~geolens.per_term.position_effects`. :func:`_check_reference` refuses a batch whose
unperturbed row does not reproduce the clean logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Literal, Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from geolens.adapter import adapter_for, get_attention_layer, model_mode
from geolens.validation import check_context, check_layer

Scope = Literal["term", "source"]
Method = Literal["fast", "naive"]
OUTCOMES = ("kl", "delta_p")

# ---------------------------------------------------------------------------------------------
# Results


@dataclass
class PerTermEffects:
    """Exact effects of removing single attention terms of one (layer, query) (:mod:`geolens.per_term`).

    ``kl`` and ``delta_p`` are float64, ``[head, source]`` for ``scope="term"`` and ``[source]``
    for ``scope="source"``, sources 0 … query (None when that outcome was not asked for).
    """

    layer: int
    query: int
    scope: str
    kl: Tensor | None
    delta_p: Tensor | None
    clean_token: int  # t*, the clean top-1 next token at ``query``
    clean_prob: float  # p_{t*}
    ran: Tensor  # bool, same shape: the terms run (α ≠ 0); the others are 0 without running
    model_mode: str
    method: str  # "fast" (batched single-position forwards) or "naive" (a full forward per term)
    # The fast path's numerical floor (:func:`~geolens.per_term.numerical_floor`, the largest over its batches; None
    # for the naive path): how far the in-batch clean row is from the clean reference.
    floor: float | None = None  # first-order bound on a computed KL's error, nats
    reference_kl: float | None = None  # KL(reference ‖ in-batch clean row)
    target: int | None = None  # the token of ``delta_logp_target`` (e.g. the actual next token)
    delta_logp_target: Tensor | None = None  # log p̃(target) − log p(target), float64
    target_floor: float | None = None  # the floor of ``delta_logp_target``


# ---------------------------------------------------------------------------------------------
# Argument checks and the clean state


def _check_tokens(model, tokens) -> Tensor:
    if not isinstance(tokens, Tensor) or tokens.dtype.is_floating_point or tokens.ndim not in (1, 2):
        raise TypeError("tokens must be an integer tensor [pos] or [1, pos] of one unpadded text")
    tokens = tokens.reshape(1, -1) if tokens.ndim == 1 else tokens
    if tokens.shape[0] != 1:
        raise ValueError(f"per-term effects take one unpadded text [1, pos], got a batch of {tokens.shape[0]}")
    if tokens.shape[1] == 0:
        raise ValueError("tokens is empty")
    check_context(model, tokens.shape[1])
    return tokens


def _check_query(query, n_pos: int) -> int:
    if isinstance(query, (bool, float)) or not isinstance(query, int):
        raise TypeError(f"query must be an integer position, got {query!r}")
    if not -n_pos <= query < n_pos:
        raise IndexError(f"query={query} is out of range for {n_pos} positions")
    return query % n_pos


def _check_outcome(outcome) -> tuple[str, ...]:
    outcome = (outcome,) if isinstance(outcome, str) else tuple(outcome)
    bad = [o for o in outcome if o not in OUTCOMES]
    if bad or not outcome:
        raise ValueError(f"outcome must be some of {OUTCOMES}, got {outcome!r}")
    return outcome


def _check_args(model, tokens, layer, query, scope, outcome, batch_size):
    tokens = _check_tokens(model, tokens)
    layer = check_layer(layer, model.cfg.n_layers)
    query = _check_query(query, tokens.shape[1])
    if scope not in ("term", "source"):
        raise ValueError(f"scope must be 'term' or 'source', got {scope!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    return tokens, layer, query, _check_outcome(outcome)


@dataclass
class _Clean:
    alpha: Float[Tensor, "head source"]  # α_i· of layer l at the query, float32 (float64 model: float64)
    v: Float[Tensor, "source head d_head"]  # kv heads expanded, float32 (float64 model: float64)
    resid_pre: Float[Tensor, "d_model"]  # entering layer l at the query
    logits: Float[Tensor, "d_vocab"]  # clean logits at the query


def _clean_state(model, tokens: Tensor, layer: int, query: int) -> _Clean:
    """α, v of ``layer`` at ``query``, the residual entering ``layer`` there and the clean logits,
    from one forward over positions ≤ query."""
    adapter = adapter_for(model)
    wanted = {adapter.pattern_hook(layer), adapter.value_hook(layer), adapter.resid_pre_hook(layer)}
    logits, cache = model.run_with_cache(tokens[:, : query + 1], names_filter=lambda name: name in wanted)
    view = get_attention_layer(model, cache, layer, dtype=_state_dtype(model))
    return _Clean(
        alpha=view.pattern[0, :, query],
        v=view.v[0],
        resid_pre=cache[adapter.resid_pre_hook(layer)][0, query],
        logits=logits[0, query],
    )


def clean_position(model, logits: Tensor, cache, layer: int, query: int) -> _Clean:
    """The clean state of (``layer``, ``query``) read from a ``run_with_cache`` of the whole text
    (``logits [1, pos, d_vocab]``; ``cache`` holding the layer's pattern, v and resid_pre)."""
    view = get_attention_layer(model, cache, layer, dtype=_state_dtype(model))
    adapter = adapter_for(model)
    return _Clean(
        alpha=view.pattern[0, :, query, : query + 1],
        v=view.v[0, : query + 1],
        resid_pre=cache[adapter.resid_pre_hook(layer)][0, query],
        logits=logits[0, query],
    )


# ---------------------------------------------------------------------------------------------
# The terms run, their outcomes and the result


def _terms(clean: _Clean, scope: str, only: Sequence | None = None) -> tuple[Tensor, list[tuple[int, int]]]:
    """(which terms run: α ≠ 0, as a bool tensor of the result's shape; their (head, source)
    list, head −1 for a whole source), in (head, source) order; ``only`` keeps those of its
    (head, source) pairs (sources for ``scope="source"``)."""
    nonzero = clean.alpha != 0
    if scope == "source":
        ran = nonzero.any(0)
        every = [(-1, int(j)) for j in ran.nonzero().flatten()]
    else:
        ran = nonzero
        every = [(int(h), int(j)) for h, j in nonzero.nonzero()]
    if only is None:
        return ran, every
    wanted = {(-1, int(t)) if scope == "source" else (int(t[0]), int(t[1])) for t in only}
    every = [t for t in every if t in wanted]
    ran = torch.zeros_like(ran)
    for h, j in every:
        ran[j if h < 0 else (h, j)] = True
    return ran, every


def _outcomes(
    logits: Float[Tensor, "batch d_vocab"], reference: Float[Tensor, "d_vocab"], top: int, outcome, target=None
) -> dict[str, Tensor]:
    """KL(reference ‖ row) and p_row(top) − p_reference(top) per row, in float64; with ``target``,
    also log p_row(target) − log p_reference(target) (``delta_logp_target``)."""
    logp = torch.log_softmax(logits.to(torch.float64), dim=-1)
    ref = torch.log_softmax(reference.to(torch.float64), dim=-1)
    out = {}
    if "kl" in outcome:
        out["kl"] = (ref.exp() * (ref - logp)).sum(-1)
    if "delta_p" in outcome:
        out["delta_p"] = logp[:, top].exp() - ref[top].exp()
    if target is not None:
        out["delta_logp_target"] = logp[:, target] - ref[target]
    return out


def _assemble(
    model, layer, query, scope, outcome, clean, ran, terms, values: dict[str, list[Tensor]], method, extra=None
) -> PerTermEffects:
    top = int(clean.logits.argmax())
    fields = {}
    for name in OUTCOMES + ("delta_logp_target",):
        if name not in outcome and name not in values:
            fields[name] = None
            continue
        full = torch.zeros(ran.shape, dtype=torch.float64)
        if terms:
            flat = torch.cat(values[name]).cpu()
            if scope == "source":
                full[[j for _, j in terms]] = flat
            else:
                full[[h for h, _ in terms], [j for _, j in terms]] = flat
        fields[name] = full
    p = torch.softmax(clean.logits.to(torch.float64), -1)[top]
    extra = dict(extra or {})
    if "delta_logp_target" in values:
        extra["delta_logp_target"] = fields["delta_logp_target"]
    return PerTermEffects(
        layer,
        query,
        scope,
        fields["kl"],
        fields["delta_p"],
        top,
        float(p),
        ran.cpu(),
        model_mode(model),
        method,
        **extra,
    )


def _chunks(items: Sequence, size: int) -> Iterable[Sequence]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


# ---------------------------------------------------------------------------------------------
# The model's dtype and the check of each batch's clean row


def _state_dtype(model) -> torch.dtype:
    """The dtype of the clean state (α, v): float64 for a float64 model, else float32."""
    return torch.float64 if _param_dtype(model) == torch.float64 else torch.float32


def _param_dtype(model) -> torch.dtype | None:
    try:
        return next(model.parameters()).dtype
    except (StopIteration, AttributeError, TypeError):
        return None


def _check_reference(row: Tensor, clean: Tensor, layer: int, query: int, *, dtype: torch.dtype | None = None) -> None:
    """The batch's unperturbed row must reproduce the clean logits (float32 rounding aside).

    A model in bfloat16 or float16 rounds the single-position forward and the full forward
    differently: that, not the KV cache or the positions, is then named as the cause."""
    scale = 1.0 + float(clean.abs().max())
    err = float((row.to(torch.float64) - clean.to(torch.float64)).abs().max())
    if not err <= 1e-4 * scale:
        if dtype in (torch.bfloat16, torch.float16):
            name = "bfloat16" if dtype == torch.bfloat16 else "float16"
            raise RuntimeError(
                f"layer {layer}, query {query}: the model runs in {name}, whose rounding makes the single-position "
                f"forward differ from the clean forward by {err:.3g} in the logits (beyond the float32 tolerance "
                f"{1e-4 * scale:.3g}): per-term effects need a float32 model (load it with dtype=torch.float32)"
            )
        raise RuntimeError(
            f"layer {layer}, query {query}: the single-position forward without removal differs from the clean "
            f"forward by {err:.3g} in the logits: its KV cache or positions are wrong for this model"
        )
