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

The package, one module per idea:

- :mod:`geolens.per_term.state`: :class:`PerTermEffects`, the clean state of a position, the
  argument checks and the check of each batch's unperturbed row against the clean logits;
- :mod:`geolens.per_term.effects`: :func:`per_term_effects`, the fast path and the naive path;
- :mod:`geolens.per_term.position`: :func:`position_effects` (both scopes and the gradient of one
  position, :class:`PositionEffects`);
- :mod:`geolens.per_term.exact`: :func:`float64_exact` and :func:`numerical_floor` (effects
  resolved in float64, docs/faithfulness/v3/PROTOCOL.md).
"""

from geolens.per_term.effects import _naive_effects, _z_removal, per_term_effects  # noqa: F401 - private: the tests
from geolens.per_term.exact import EPS64, float64_exact, float64_model, numerical_floor
from geolens.per_term.position import PositionEffects, position_effects
from geolens.per_term.state import (  # noqa: F401 - the private names: tests and norm_controlled import them here
    OUTCOMES,
    Method,
    PerTermEffects,
    Scope,
    _check_reference,
    _clean_state,
    _state_dtype,
    clean_position,
)

__all__ = [
    "float64_model",
    "EPS64",
    "OUTCOMES",
    "Method",
    "PerTermEffects",
    "PositionEffects",
    "Scope",
    "clean_position",
    "float64_exact",
    "numerical_floor",
    "per_term_effects",
    "position_effects",
]
