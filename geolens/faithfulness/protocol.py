"""The masking protocol of the faithfulness curves (docs/method.md §3; Cunningham & Muça Cirone 2026, §2.3 and §3.1).

For a metric s_ij^{(l,h)} (an attribution of query i to source j in head h of layer l), the
masking intervention of :mod:`geolens.interventions.masking` removes the terms α_ij ṽ_j of the
chosen sources from the attention sum (α_ij set to 0 in ``hook_pattern``, no renormalisation),
in every layer of the protocol at once.

- **Comprehensiveness** at fraction k: remove the top-k of each ranking group. A more faithful
  metric hurts the model more: larger ΔPPL, more negative Δ log-prob.
- **Sufficiency** at fraction k: remove the bottom-k. A more faithful metric hurts it less.

The :class:`MaskingConfig` (recorded with every result) fixes

- the **masking scope**: the layers masked together (all = the primary protocol; the thirds
  ``early`` / ``middle`` / ``late`` of the stack; one layer);
- the **ranking scope** (:data:`geolens.interventions.masking.RANKING_SCOPES`): ``row`` ranks the
  sources of one (layer, head, query); ``query`` ranks all (head, source) terms of one (layer,
  query) together, so the scores of different heads are compared on their common scale;
  ``source`` ranks one score per (layer, query, source), the sum over heads, and removes a source
  in every head;
- whether the sink (position 0) and the current token (j = i) are removable;
- ``mode``: the output o_i of the output-normalised metric and of c_ij (``inter``: the layer
  output, on which the inter-head contribution weights are a common scale; ``intra``: the head's);
- the fractions k and ``skip_prefix``: every next-token prediction after the first
  ``skip_prefix`` positions is scored.

**Scoring.** Per document, the mean NLL over its scored predictions, clean and under each mask
(and with the sink alone removed: α_i0 = 0 for every query i ≥ 1, every head, every masked layer).
Corpus-level ΔPPL at k = exp(mean NLL masked) − exp(mean NLL clean), means over all scored tokens
of all documents; Δ log-prob = mean log p(target) masked − clean. The area under each curve is
the trapezoid rule over k. Confidence intervals resample documents (≥ 1000 paired resamples: the
same documents for every metric); a claimed-order step "a < b" is decided on the paired
difference of AUCs, signed so that a positive difference means b is more faithful:
**holds** when its 95% CI lies above 0, **reversed** when below 0, **tie** otherwise.

**Range check before any verdict.** The random ranking at the largest fraction must move the
corpus PPL by at least :data:`MIN_RANGE` (1 %) relative; otherwise the protocol cannot separate
metrics and every verdict is ``"no range"``.

Metrics (docs/method.md §2 and §3.1): ``raw_attention`` α_ij, ``value_weighted``
α_ij‖ṽ_j‖, ``output_normalized`` α_ij‖ṽ_j‖/‖o_i‖, ``contribution`` c_ij ranked by signed value,
``contribution_abs`` |c_ij|, ``value_zeroing`` (Mohebbi et al. 2023, :func:`value_zeroing`; one
score per source, shared by the heads of a layer) and ``random`` (uniform scores: the floor).

Note on ties by construction: ‖o_i‖ is one positive number per (layer, query) in ``inter`` mode
and per (layer, head, query) in ``intra`` mode. Dividing by it never changes a ranking inside that
group, so ``output_normalized`` ranks exactly like ``value_weighted`` under ``row`` ranking (both
modes) and under ``query`` / ``source`` ranking in ``inter`` mode; the two differ only under
``query`` / ``source`` ranking in ``intra`` mode, where each head is divided by its own output
norm. Identical rankings give identical masks, a paired difference of exactly 0 and a "tie".
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal, Sequence, get_args

import numpy as np

from geolens.interventions.masking import RANKING_SCOPES, RankingScope
from geolens.metrics import MetricName
from geolens.stats import verdict as ci_verdict

ALL_METRICS: tuple[str, ...] = get_args(MetricName)  # the built-in metrics; metric_names() also lists registered ones
CLAIMED_ORDER = ("raw_attention", "value_weighted", "output_normalized", "contribution")
NormMode = Literal["intra", "inter"]
MODES: tuple[str, ...] = get_args(NormMode)
Direction = Literal["comprehensiveness", "sufficiency"]
DIRECTIONS: tuple[str, ...] = get_args(Direction)
Quantity = Literal["delta_ppl", "delta_logprob"]
QUANTITIES: tuple[str, ...] = get_args(Quantity)
LayerGroup = Literal["all", "early", "middle", "late"]
LAYER_GROUPS: tuple[str, ...] = get_args(LayerGroup)
FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9)
MIN_RANGE = 0.01  # the random ranking must move corpus PPL by ≥ 1 % (relative) at the largest k
MIN_DOCUMENTS = 5  # fewer documents: a bootstrap over documents is degenerate, no verdict
# pairs (a, b) compared: the claimed order's steps first, then the overall gap and the controls
PAIRS = (
    ("raw_attention", "value_weighted"),
    ("value_weighted", "output_normalized"),
    ("output_normalized", "contribution"),
    ("raw_attention", "contribution"),
    ("contribution", "contribution_abs"),
    ("value_zeroing", "contribution"),
    ("random", "raw_attention"),
    ("random", "contribution"),
)
CLAIMED_STEPS = tuple(zip(CLAIMED_ORDER, CLAIMED_ORDER[1:]))


def layer_group(name: str, n_layers: int) -> tuple[int, ...]:
    """``all`` or the ``early`` / ``middle`` / ``late`` third of the stack (sizes differ by ≤ 1)."""
    if name not in LAYER_GROUPS:
        raise ValueError(f"unknown layer group {name!r}; choose from {list(LAYER_GROUPS)}")
    if name == "all":
        return tuple(range(n_layers))
    parts = np.array_split(np.arange(n_layers), 3)
    return tuple(int(l) for l in parts[LAYER_GROUPS.index(name) - 1])


def masking_scope(layers: Sequence[int], n_layers: int) -> str:
    """The name of a layer set: ``all``, ``early``/``middle``/``late``, ``one layer`` or ``layers``."""
    layers = tuple(sorted(layers))
    if len(layers) == 1 and n_layers > 1:
        return "one layer"
    for name in LAYER_GROUPS:
        if layers == layer_group(name, n_layers):
            return name
    return "one layer" if len(layers) == 1 else "layers"


@dataclass(frozen=True)
class MaskingConfig:
    """How sources are masked and scored; recorded with every result.

    Attributes:
        layers: the layers masked together in one forward (None = all layers: the primary
            protocol; :func:`layer_group` gives the thirds).
        ranking: ``row``, ``query`` (the primary) or ``source`` (see the module docstring).
        allow_sink: whether position 0 (the sink) may be removed (primary: True).
        allow_current: whether the query's own token (j = i) may be removed (primary: True).
        mode: which output o_i the output-normalised metric and c_ij use (``inter``: the layer's,
            the primary; ``intra``: the head's).
        fractions: the removal fractions k, each in (0, 1) for a curve (0 and 1 are accepted
            by the mask builders for identity checks).
        skip_prefix: score the next-token predictions of positions ≥ skip_prefix (masks still
            apply to every query).

    >>> import geolens
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")  # 2 layers, 4 query heads sharing 2 kv heads
    >>> p = geolens.MaskingConfig(layers=(1,), ranking="row", allow_sink=False, fractions=(0.1, 0.5))
    >>> p.resolved_layers(model), p.ranking
    ((1,), 'row')
    """

    layers: tuple[int, ...] | None = None
    ranking: RankingScope = "query"
    allow_sink: bool = True
    allow_current: bool = True
    mode: NormMode = "inter"
    fractions: tuple[float, ...] = FRACTIONS
    skip_prefix: int = 8

    def __post_init__(self) -> None:
        if self.ranking not in RANKING_SCOPES:
            raise ValueError(f"unknown ranking scope {self.ranking!r}; choose from {list(RANKING_SCOPES)}")
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}; choose from {list(MODES)}")
        fr = tuple(float(k) for k in self.fractions)
        if not fr:
            raise ValueError("the protocol has no fraction")
        bad = [k for k in fr if not (0.0 <= k <= 1.0) or math.isnan(k)]
        if bad:
            raise ValueError(f"fractions must lie in (0, 1), got {bad}")
        if list(fr) != sorted(set(fr)):
            raise ValueError(f"fractions must be distinct and increasing, got {list(fr)}")
        object.__setattr__(self, "fractions", fr)
        if int(self.skip_prefix) < 0:
            raise ValueError(f"skip_prefix must be ≥ 0, got {self.skip_prefix}")

    def check_curve(self) -> None:
        """A curve needs every k strictly inside (0, 1) (k = 0 masks nothing, k = 1 everything)."""
        bad = [k for k in self.fractions if not 0.0 < k < 1.0]
        if bad:
            raise ValueError(f"fractions must lie in (0, 1), got {bad}")

    def resolved_layers(self, model) -> tuple[int, ...]:
        n = model.cfg.n_layers
        if self.layers is None:
            return tuple(range(n))
        from geolens.validation import check_layer

        try:  # never wrapped past the end; 1.0 / True refused (TypeError), out of range an IndexError
            out = [check_layer(l, n) for l in self.layers]
        except (IndexError, TypeError) as err:
            raise type(err)(f"protocol layers: {err}") from None
        if not out:
            raise ValueError("the protocol masks no layer")
        return tuple(sorted(set(out)))

    def describe(self, model=None) -> str:
        if model is not None:
            layers = self.resolved_layers(model)
            span = f"{masking_scope(layers, model.cfg.n_layers)} ({layer_span(layers)})"
        else:
            span = "all" if self.layers is None else layer_span(self.layers)
        return (
            f"protocol: layers masked together = {span}; ranking = {self.ranking}; "
            f"sink (pos 0) removable = {self.allow_sink}; current token removable = {self.allow_current}; "
            f"metric mode = {self.mode}; k = {list(self.fractions)}; scored = predictions after the first "
            f"{self.skip_prefix} positions; no renormalisation of α"
        )

    def to_dict(self, model=None) -> dict:
        d = asdict(self)
        d["fractions"] = list(self.fractions)
        if model is not None:
            d["layers"] = list(self.resolved_layers(model))
            d["masking_scope"] = masking_scope(d["layers"], model.cfg.n_layers)
        return d


def layer_span(layers: Sequence[int]) -> str:
    """``3–7 (5 layers)`` for a run of more than two layers, else ``3,5``."""
    layers = list(layers)
    if layers == list(range(layers[0], layers[-1] + 1)) and len(layers) > 2:
        return f"{layers[0]}–{layers[-1]} ({len(layers)} layers)"
    return ",".join(map(str, layers))


def same_ranking_by_construction(protocol: "MaskingConfig | dict") -> bool:
    """Whether output-normalised attention ranks exactly like value-weighted attention.

    α‖ṽ‖/‖o_i‖ divides every term of a ranking group by one positive number when ‖o_i‖ is
    constant over the group: under ``row`` ranking in either mode (one head, one query), and
    under ``query`` / ``source`` ranking in ``inter`` mode (the layer output of one query).
    Only ``query`` / ``source`` ranking in ``intra`` mode divides each head by its own norm.
    """
    get = protocol.get if isinstance(protocol, dict) else lambda key: getattr(protocol, key)
    return get("ranking") == "row" or get("mode") == "inter"


def faithfulness_sign(direction: str, quantity: str) -> float:
    """+1 when a larger AUC of ``quantity`` means a more faithful metric in ``direction``, else −1.

    Comprehensiveness: larger ΔPPL (more negative Δ log-prob) is more faithful; sufficiency:
    smaller ΔPPL (less negative Δ log-prob).
    """
    if direction not in DIRECTIONS or quantity not in QUANTITIES:
        raise ValueError(f"unknown direction/quantity {direction!r}/{quantity!r}")
    sign = 1.0 if direction == "comprehensiveness" else -1.0
    return sign if quantity == "delta_ppl" else -sign


def verdict(
    ci_low: float, ci_high: float, has_range: bool = True, n_documents: int | None = None, *, testable: bool = True
) -> str:
    """``holds`` when the CI of "b more faithful than a" lies above 0, ``reversed`` when below 0,
    ``tie`` otherwise (:func:`geolens.stats.verdict`, ``not testable`` when ``testable`` is False);
    ``no range`` when the protocol failed its range check, ``too few documents`` below
    :data:`MIN_DOCUMENTS` (a bootstrap over 1 document has a zero-width interval). A pair that
    cannot differ by construction is ``not testable`` whatever its data."""
    if not testable:
        return ci_verdict(ci_low, ci_high, testable=False)
    if not has_range:
        return "no range"
    if n_documents is not None and n_documents < MIN_DOCUMENTS:
        return "too few documents"
    return ci_verdict(ci_low, ci_high, testable=testable)
