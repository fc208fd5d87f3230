"""Per-term causal ground truth: the exact effect of removing one attention term.

For layer l, query position i, head h and source j ≤ i, the attention output of layer l at i is

    a_i = Σ_h Σ_j α_ij^h ṽ_j^h + b_O,        ṽ_j^h = v_j^h W_O^h        (docs/method.md §1)

Removing the **term** (h, j) replaces a_i by a_i − α_ij^h ṽ_j^h at position i only, everything
else clean; removing the **source** j (``scope="source"``) replaces it by a_i − Σ_h α_ij^h ṽ_j^h.
This is the removal of docs/method.md §3 (α_ij^h = 0 without renormalising) for one term and one
query. The outcomes, at the next-token prediction of position i, with p the clean distribution and
p̃ the perturbed one, computed in float64 from the logits:

    KL(p ‖ p̃) = Σ_t p_t (log p_t − log p̃_t),        Δp = p̃_{t*} − p_{t*},   t* = argmax_t p_t.

These are a metric-free ground truth against which attribution metrics (contribution weights,
value-weighted attention, ...) can be scored without the circularity of masking by the metric's
own ranking.

**Efficient computation** (:func:`per_term_effects`). The removal changes only position i's
residual stream, from layer l on, and the prediction at i reads positions ≤ i only. So each term
needs position i alone re-run through layers l … L−1, attending at every layer to the *clean*
keys and values of positions < i (a KV cache of the clean prefix) and to its own freshly computed
key and value. All terms of one (l, i) run as one batch of single-position forwards, the batch
enumerating the removed terms (plus one unperturbed row, the in-batch clean reference):

1. one clean forward over positions ≤ i caches α and v of layer l, the residual entering layer l
   at i and the logits at i; one over positions < i fills the KV cache;
2. the batch starts at layer l from the clean residual at i (``start_at_layer``); the model
   recomputes layer l's attention at i (clean: its inputs are clean) and a hook on ``hook_z``
   subtracts α_ij^h v_j^h from z_i^h of the row's head (every head for a source). Since
   a_i = Σ_h z_i^h W_O^h + b_O, that removes exactly α_ij^h ṽ_j^h *before* any post-attention norm
   (Gemma 3), which the model itself then applies, with the MLP, the later layers (rotary
   position i, sliding windows, GQA, soft-capping: the model's own code), the final norm and
   the unembedding.

Per term this costs L − l single-position layers plus one unembedding, against a full forward of
every position through all L layers for the naive path (:func:`per_term_effects` with ``method="naive"``, one full
forward per term with α_ij^h zeroed in ``hook_pattern``: the oracle of the tests and the baseline
of ``benchmarks/per_term.py``). The clean row of each batch must reproduce the clean logits at i,
else the call raises (a wrong position or cache would show there).

Terms with α_ij^h = 0 exactly (outside a sliding window, or underflowed) are reported as 0 effect
without running them (:attr:`PerTermEffects.ran` says which ran).

Input: one unpadded text ``[pos]`` or ``[1, pos]``, positions absolute (the sink is position 0,
normally BOS: pass ``prepend_bos=`` explicitly to ``model.to_tokens``). Batches and padded rows
are refused.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterable, Literal, Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from geolens.adapter import adapter_for, get_attention_layer, model_mode
from geolens.interventions.base import applied
from geolens.validation import check_context, check_layer

Scope = Literal["term", "source"]
Method = Literal["fast", "naive"]
OUTCOMES = ("kl", "delta_p")

# ---------------------------------------------------------------------------------------------
# Results


@dataclass
class PerTermEffects:
    """Exact effects of removing single attention terms of one (layer, query) (module docstring).

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
    # The fast path's numerical floor (:func:`numerical_floor`, the largest over its batches; None
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


EPS64 = float(torch.finfo(torch.float64).eps)


def numerical_floor(row: Tensor, reference: Tensor, target: int | None = None) -> dict[str, float]:
    """How precisely a batch resolves effects: ``row`` is the batch's unperturbed row, ``reference``
    the clean forward's logits at the same position (docs/faithfulness/v3/PROTOCOL.md §3).

    With δ_t the difference of their log-probabilities and p the reference distribution:
    ``floor`` = Σ_t p_t |δ_t| + ε Σ_t p_t |log p_t| (a perturbed row carrying an error of δ's size
    moves its computed KL by at most Σ p|δ| to first order; the sum itself rounds at ε Σ p |log p|,
    ε = 2⁻⁵²); ``reference_kl`` = KL(reference ‖ row); with ``target``, ``target_floor`` =
    |δ_target| + ε |log p_target|.

    >>> x = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    >>> f = numerical_floor(x, x)
    >>> f["reference_kl"] == 0.0, 0 < f["floor"] < 1e-15
    (True, True)
    """
    logp = torch.log_softmax(row.to(torch.float64), -1)
    ref = torch.log_softmax(reference.to(torch.float64), -1)
    p = ref.exp()
    delta = logp - ref
    weighted = torch.where(p > 0, p * ref.abs(), torch.zeros_like(p))
    out = dict(
        floor=float((p * delta.abs()).sum() + EPS64 * weighted.sum()),
        reference_kl=float(torch.where(p > 0, p * (ref - logp), torch.zeros_like(p)).sum()),
    )
    if target is not None:
        out["target_floor"] = float(delta[target].abs() + EPS64 * ref[target].abs())
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
    else clean. Outcomes: KL(clean ‖ perturbed) and Δp of the clean top-1 token (module docstring).

    ``method="fast"``: batched single-position forwards from ``layer`` on over a KV cache of the
    clean prefix (module docstring), ``batch_size`` terms per forward (default 128; memory: the
    cache's keys and values are concatenated per row at each layer). ``method="naive"``, the test
    oracle and the speed baseline: for each term, a full forward of the whole text from layer 0
    with α_ij^h = 0 in ``layer``'s ``hook_pattern`` at ``query`` (every head for a source; not
    renormalised, so exactly α_ij^h ṽ_j^h leaves a_i, docs/method.md §3), ``batch_size`` terms per
    forward, one row each (default 1); its clean reference is a full forward without hooks. Both
    record their method in the result. ``terms`` restricts the run to some (head, source) pairs
    (sources for ``scope="source"``); the others are 0 with ``ran`` False (the benchmark times a
    subset). ``layer`` and ``query`` may be negative. :func:`position_effects` gives both scopes
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
    """:func:`per_term_effects` at both scopes, and the gradient of log p_{t*} with respect to
    each head's z_i (for :attr:`PositionEffects.grad_x_act`), for one (``layer``, ``query``),
    sharing one clean state and one KV cache of the clean prefix.

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


def _weight_is_offset(module, forward) -> bool:
    """Whether an RMSNorm scales by (1 + weight) rather than by weight, read from the module's own
    output on an all-ones row (whose RMS is 1), not from its family's name."""
    weight = module.weight.detach().to(torch.float32)
    with torch.no_grad():
        out = forward(module, torch.ones(1, weight.shape[-1], dtype=module.weight.dtype, device=weight.device))
    out = out.detach().to(torch.float32).reshape(-1)
    return float((out - (1.0 + weight)).abs().max()) < float((out - weight).abs().max())


@contextmanager
def float64_exact(model):
    """Within the block, a model cast to float64 computes its attention softmax and its RMS norms in
    float64 too: the TransformerLens bridge's attention and Hugging Face's Llama and Gemma 3 RMS
    norms compute them in float32 whatever the model's dtype, which rounds α and the normalised
    residual to float32 precision (docs/faithfulness/v3/PROTOCOL.md §1). Inputs in other dtypes
    keep the model's own computation; the rotary angles are left as the model computes them. The
    patches are instance attributes, removed on exit.

    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa", dtype=torch.float64)
    >>> with float64_exact(model):
    ...     e = per_term_effects(model, tiny_tokens(model, length=12)[:1], layer=1, query=-1)
    >>> e.kl.dtype, e.floor < 1e-12
    (torch.float64, True)
    """
    import types

    patched = []
    for module in model.modules():
        kind = type(module)
        if hasattr(kind, "_masked_softmax"):

            def softmax(self, scores, dtype=None, _original=kind._masked_softmax):
                return _original(self, scores, dtype=torch.float64 if scores.dtype == torch.float64 else dtype)

            object.__setattr__(module, "_masked_softmax", types.MethodType(softmax, module))  # not forwarded to HF
            patched.append((module, "_masked_softmax"))
        elif kind.__name__.endswith("RMSNorm") and kind.__module__.startswith("transformers"):
            eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
            offset = _weight_is_offset(module, kind.forward)  # Gemma's weight is an offset from 1

            def norm(self, x, _original=kind.forward, _eps=eps, _offset=offset):
                if x.dtype != torch.float64 or _eps is None:
                    return _original(self, x)
                y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + _eps)
                return y * (1.0 + self.weight) if _offset else self.weight * y

            object.__setattr__(module, "forward", types.MethodType(norm, module))
            patched.append((module, "forward"))
    try:
        yield model
    finally:
        for module, name in patched:
            if name in vars(module):
                object.__delattr__(module, name)


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
