"""The attribution metrics that the masking evaluation ranks: the one place where they are named.

Each :class:`Metric` carries its score function and everything the rest of geolens needs to know
about it: the label, colour, marker and line style of its curves (:mod:`geolens.viz.faithfulness`),
whether default runs include it (``geolens faithfulness`` without ``--metrics`` and the report),
and whether its ranking equals another metric's by construction. The registry's order, the
registration order, is the order of the tables, legends and the report.

Built-in metrics (docs/method.md §2 and §3.1; formulas in the :mod:`geolens.faithfulness.protocol`
docstring): ``raw_attention`` α_ij, ``value_weighted`` α_ij‖ṽ_j‖, ``output_normalized``
α_ij‖ṽ_j‖/‖o_i‖, ``contribution`` c_ij (ranked by signed value), ``contribution_abs`` |c_ij|,
``value_zeroing`` (Mohebbi et al. 2023; computed by :mod:`geolens.interventions.value_zeroing`,
below this registry, so that importing it registers every built-in) and ``random`` (uniform
scores: the floor). The built-ins keep the order of :data:`MetricName`; other metrics follow in
registration order.

A metric is either

- **per layer** (the default): ``fn(inputs: LayerInputs) -> Tensor[batch, head, query, key]``,
  computed from one layer's attention geometry (:class:`LayerInputs`) under the protocol's
  ``mode``. Under ``source`` ranking its scores are summed over heads, then, for an ``absolute``
  metric, replaced by their magnitude; or
- **per sequence** (``per_layer=False``): ``fn(inputs: SequenceInputs) -> Tensor[layer, 1, head,
  query, key]`` (head = 1 for one score shared by every head), for scores that need the model
  itself (Value Zeroing's extra forwards) or none of the geometry (random).

Add one with :func:`register_metric`; it then takes part in :func:`geolens.faithfulness.faithfulness_curves`,
multiple choice under masks, ``geolens faithfulness --metrics`` and, when ``default=True``, the report::

    from geolens.metrics import register_metric
    register_metric("value_norm", label="value norm ‖ṽ‖", colour="#8c564b",
                    fn=lambda x: x.value_norm.expand_as(x.alpha))
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Literal, get_args

import torch
from jaxtyping import Float, Int
from torch import Tensor

from geolens.adapter import AttentionLayer
from geolens.contributions import layer_metrics
from geolens.finite import check_finite
from geolens.interventions.masking import random_scores
from geolens.interventions.value_zeroing import value_zeroing

MetricName = Literal[
    "raw_attention",
    "value_weighted",
    "output_normalized",
    "contribution",
    "contribution_abs",
    "value_zeroing",
    "random",
]
BUILT_IN: tuple[str, ...] = get_args(MetricName)  # their order is the registry's, before any other metric
# Names that result tables already use for rows that are no metric.
RESERVED_NAMES = ("clean", "sink_only")
_NAME = re.compile(r"[a-z][a-z0-9_]*")


@dataclass(frozen=True)
class LayerInputs:
    """What a per-layer metric sees: one layer's attention geometry (docs/method.md §1-§2).

    ``mode`` is the protocol's: which output o_i the relative norm and c_ij use (``inter``: the
    layer's, ``intra``: the head's). Every tensor is ``[batch, head, query, key]`` except
    ``value_norm`` (``[batch, head, 1, key]``: it does not depend on the query).
    """

    view: AttentionLayer
    mode: str
    alpha: Float[Tensor, "batch head query key"]  # α_ij
    value_norm: Float[Tensor, "batch head 1 key"]  # ‖ṽ_j‖
    relative: Float[Tensor, "batch head query key"]  # ‖ṽ_j‖ / ‖o_i‖
    contribution: Float[Tensor, "batch head query key"]  # c_ij

    @classmethod
    def from_layer(cls, view: AttentionLayer, mode: str) -> LayerInputs:
        m = layer_metrics(view, mode)
        return cls(view, mode, m.attention, m.value_norm, m.relative_norm, m.contribution)


@dataclass(frozen=True)
class SequenceInputs:
    """What a per-sequence metric sees: the model, one sequence and the protocol's layers.

    ``heads``: the head axis to return (n_heads, or 1 under ``source`` ranking); ``seed``: the
    sequence's random seed; ``value_zeroing_chunk``: sources per Value Zeroing forward.
    """

    model: object
    tokens: Int[Tensor, "1 pos"]
    layers: tuple[int, ...]
    heads: int
    seed: int
    value_zeroing_chunk: int | None = None


@dataclass(frozen=True)
class Metric:
    """One attribution metric: its score function and how it is shown.

    Attributes:
        name: identifier used in ``--metrics``, result tables and file names.
        label: legend text of its curves.
        fn: the score function (see the module docstring for both signatures).
        colour: its curves' colour (None: matplotlib's cycle).
        marker, linestyle, markersize: its curves' marks (hollow markers of decreasing size keep
            curves lying on top of each other visible; marker None: one picked by position).
        per_layer: ``fn`` takes :class:`LayerInputs` (True) or :class:`SequenceInputs` (False).
        absolute: rank by magnitude: |score|, taken after the head sum of ``source`` ranking.
        default: included when no metric list is given (the CLI and the report); False for
            costly ones.
        same_ranking_as: a metric that ranks every group identically in exact arithmetic whenever
            :func:`geolens.faithfulness.same_ranking_by_construction` holds (its masks are then
            reused), with ``same_ranking_reason`` saying why (printed under the figures).
        description: one line: the formula and its source.
        citation: where the metric comes from, author-year (``""``: none); listed by
            :func:`geolens.list_methods`.
        level: ``"head"`` (a score per head, summed over heads for a whole layer) or ``"layer"``
            (one score per layer); default: ``"head"`` for a per-layer metric, ``"layer"`` for a
            per-sequence one.
        unit: what a score is, with its unit, as a plot's axis says it (``""``: not given); the
            method registry (:class:`geolens.methods.Method`) carries it to :meth:`geolens.Attribution.plot`.
    """

    name: str
    label: str
    fn: Callable[..., Tensor]
    colour: str | None = None
    marker: str | None = None
    linestyle: str | tuple = "-"
    markersize: float = 5
    per_layer: bool = True
    absolute: bool = False
    default: bool = True
    same_ranking_as: str | None = None
    same_ranking_reason: str = ""
    description: str = ""
    citation: str = ""
    level: Literal["head", "layer"] | None = None
    unit: str = ""

    @property
    def scope(self) -> str:
        """``"head"`` or ``"layer"``: the finest level the metric scores (``level``, or its default)."""
        return self.level or ("head" if self.per_layer else "layer")

    def scores(self, inputs: LayerInputs | SequenceInputs) -> Tensor:
        """``fn(inputs)``, checked: a torch tensor (a numpy array is converted; integers become
        floats) of the shape the metric promises (per layer: ``[batch, head, query, key]``, that of
        ``inputs.alpha``; per sequence: ``[layer, 1, head or 1, query, key]``) holding finite numbers;
        else one line (``ValueError``) naming the metric and, for a NaN or inf, where it is."""
        x = self.fn(inputs)
        per_layer = isinstance(inputs, LayerInputs)
        like = inputs.alpha if per_layer else None
        if not isinstance(x, Tensor):
            import numpy as np

            if not isinstance(x, np.ndarray):
                raise ValueError(
                    f"metric {self.name!r} returned a {type(x).__name__}: its fn must return a torch tensor or a numpy array"
                )
            x = torch.from_numpy(np.ascontiguousarray(x))
            x = x.to(like.device, like.dtype) if per_layer else x.to(inputs.tokens.device)
        if x.dtype == torch.bool or not (x.is_floating_point() or x.is_complex()):
            x = x.to(like.dtype if per_layer else torch.float32)
        if x.is_complex():
            raise ValueError(f"metric {self.name!r} returned complex scores ({x.dtype}): a score must be a real number")
        if per_layer:
            expected, names = tuple(like.shape), "[batch, head, query, key]"
            ok = tuple(x.shape) == expected
        else:
            n = int(inputs.tokens.shape[-1])
            expected, names = (len(inputs.layers), 1, inputs.heads, n, n), "[layer, 1, head or 1, query, key]"
            ok = x.ndim == 5 and tuple(x.shape) in (expected, expected[:2] + (1,) + expected[3:])
        if not ok:
            raise ValueError(
                f"metric {self.name!r} returned scores of shape {list(x.shape)}: expected {names} = {list(expected)}"
                + (", one score per (head, query, key) term of each layer" if per_layer else "")
            )
        bad = ~torch.isfinite(x)
        if per_layer and bool(bad.any()):
            check_finite(
                x,
                what=f"the scores of metric {self.name!r}",
                dims=("batch", "head", "query", "key"),
                layer=inputs.view.layer,
                cause=None
                if bool(torch.isfinite(like).all())
                else "the attention weights α of that layer hold NaN or inf: the model's weights or its input are not finite",
            )
        elif bool(bad.any()):
            l = int(bad.nonzero()[0, 0])
            check_finite(
                x[l, 0],
                what=f"the scores of metric {self.name!r}",
                dims=("head", "query", "key"),
                model=inputs.model,
                layer=int(inputs.layers[l]),
            )
        return x

    def layer_scores(self, inputs: LayerInputs, summed: bool) -> Tensor:
        """:meth:`scores` (``fn(inputs)``, checked), summed over heads when ``summed`` (source
        ranking), then |·| if absolute."""
        x = self.scores(inputs)
        if summed:
            x = x.sum(1, keepdim=True)
        return x.abs() if self.absolute else x


_REGISTRY: dict[str, Metric] = {}


def register_metric(name: str, *, label: str, fn: Callable[..., Tensor], **options) -> Metric:
    """Add a metric (the fields of :class:`Metric` as keywords); returns it.

    Raises ValueError for a name that is taken, reserved or not lower-case ``[a-z][a-z0-9_]*``.

    >>> import geolens
    >>> from geolens.metrics import metric_names, unregister_metric
    >>> m = geolens.register_metric("value_norm_only", label="‖ṽ_j‖ alone",
    ...                             fn=lambda x: x.value_norm.expand_as(x.alpha))
    >>> "value_norm_only" in metric_names()  # now ranked by faithfulness_curves and drawn in the report
    True
    >>> _ = unregister_metric("value_norm_only")
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name in RESERVED_NAMES:
        raise ValueError(
            f"bad metric name {name!r}: use lower-case letters, digits and _ (not {', '.join(RESERVED_NAMES)})"
        )
    if name in _REGISTRY:
        raise ValueError(f"metric {name!r} is already registered; unregister_metric({name!r}) first")
    if not callable(fn):
        raise ValueError(f"metric {name!r}: fn must be callable, got {type(fn).__name__}")
    metric = Metric(name=name, label=label, fn=fn, **options)
    _REGISTRY[name] = metric
    if name in BUILT_IN:  # built-ins keep MetricName's order, wherever each is registered
        ordered = sorted(
            _REGISTRY.items(), key=lambda item: BUILT_IN.index(item[0]) if item[0] in BUILT_IN else len(BUILT_IN)
        )
        _REGISTRY.clear()
        _REGISTRY.update(ordered)
    return metric


def unregister_metric(name: str) -> Metric:
    """Remove a metric; returns it."""
    return _REGISTRY.pop(get_metric(name).name)


def get_metric(name: str) -> Metric:
    """The registered metric ``name``; ValueError naming the choices otherwise."""
    metric = find_metric(name)
    if metric is None:
        raise ValueError(f"unknown metric {name!r}; choose from {list(_REGISTRY)}")
    return metric


def find_metric(name: str) -> Metric | None:
    """The registered metric ``name``, or None (e.g. for a metric of a saved result no longer registered)."""
    return _REGISTRY.get(name) if isinstance(name, str) else None


MODE_QUALIFIERS = {"intra": "per head", "inter": "per layer"}
"""How a label names a metric's mode: which output o_i its ‖o_i‖ and c_ij use, the head's or the layer's."""


def mode_variant(name: str) -> tuple[Metric, str] | None:
    """(registered metric, mode) of a mode-qualified name ``"<metric>_intra"`` or
    ``"<metric>_inter"`` (endpoints that score one metric in both modes, e.g. the per-term
    endpoint's ``output_normalized_intra``), or None.

    >>> m, mode = mode_variant("output_normalized_intra")
    >>> m.name, mode, mode_variant("contribution_abs")
    ('output_normalized', 'intra', None)
    """
    base, _, mode = name.rpartition("_") if isinstance(name, str) else ("", "", "")
    metric = find_metric(base) if mode in MODE_QUALIFIERS else None
    return None if metric is None else (metric, mode)


def sign_variant(name: str) -> Metric | None:
    """The registered metric whose scores ``"<metric>_negated"`` negates (the opposite-sign control
    of a signed metric, e.g. ``contribution_negated`` = −c in protocol 3's masking addendum: its
    top-ranked terms are the most negative c), or None.

    >>> sign_variant("contribution_negated").name, sign_variant("contribution")
    ('contribution', None)
    """
    base, suffix, rest = name.rpartition("_negated") if isinstance(name, str) else ("", "", "x")
    return find_metric(base) if suffix and not rest else None


def metric_label(name: str) -> str | None:
    """The label of a registered metric, or of a mode-qualified one (:func:`mode_variant`): the
    metric's label followed by its mode in words (:data:`MODE_QUALIFIERS`), or of a negated one
    (:func:`sign_variant`); None for any other name.

    >>> metric_label("raw_attention"), metric_label("output_normalized_intra")
    ('raw attention α', 'output-normalised α‖ṽ‖/‖o‖ (per head)')
    >>> metric_label("contribution_negated")
    'contribution weights c, opposite sign (−)'
    """
    metric = find_metric(name)
    if metric is not None:
        return metric.label
    negated = sign_variant(name)
    if negated is not None:
        return f"{negated.label}, opposite sign (−)"
    variant = mode_variant(name)
    return None if variant is None else f"{variant[0].label} ({MODE_QUALIFIERS[variant[1]]})"


def metric_names(*, default_only: bool = False) -> tuple[str, ...]:
    """Registered metric names in registration order (``default_only``: those with ``default=True``)."""
    return tuple(n for n, m in _REGISTRY.items() if m.default or not default_only)


def check_metric_names(metrics) -> None:
    """ValueError naming the unknown metrics, or for an empty list."""
    unknown = sorted(set(metrics) - set(_REGISTRY))
    if unknown:
        raise ValueError(f"unknown metrics {unknown}; choose from {list(_REGISTRY)}")
    if not metrics:
        raise ValueError("no metric given")


def _value_zeroing(x: SequenceInputs) -> Tensor:
    return value_zeroing(x.model, x.tokens, x.layers, chunk_size=x.value_zeroing_chunk)[:, :, None]


def _random(x: SequenceInputs) -> Tensor:
    n = x.tokens.shape[1]
    return random_scores((len(x.layers), 1, x.heads, n, n), seed=x.seed)


register_metric(
    "raw_attention",
    label="raw attention α",
    colour="#888888",
    marker="o",
    markersize=7,
    fn=lambda x: x.alpha,
    description="α_ij",
    unit="attention weight α (unitless; a head's row sums to 1)",
)
register_metric(
    "value_weighted",
    label="value-weighted α‖ṽ‖",
    colour="#1f77b4",
    marker="s",
    linestyle="--",
    markersize=6,
    fn=lambda x: x.alpha * x.value_norm,
    description="α_ij‖ṽ_j‖ (Kobayashi et al. 2020)",
    citation="Kobayashi et al. 2020",
    unit="α‖ṽ‖ (a norm, in the residual stream's units)",
)
register_metric(
    "output_normalized",
    label="output-normalised α‖ṽ‖/‖o‖",
    colour="#2ca02c",
    marker="^",
    linestyle="-.",
    fn=lambda x: x.alpha * x.relative,
    description="α_ij‖ṽ_j‖/‖o_i‖",
    citation="Cunningham & Muça Cirone 2026",
    unit="α‖ṽ‖/‖o‖ (unitless ratio of norms)",
    same_ranking_as="value_weighted",
    same_ranking_reason="‖o_i‖ is constant within a ranking group (a (head, query) row, or a query in inter mode), "
    "so α‖ṽ‖/‖o‖ ranks the group's terms exactly as α‖ṽ‖ does",
)
register_metric(
    "contribution",
    label="contribution weights c",
    colour="#d62728",
    marker="D",
    markersize=4,
    fn=lambda x: x.contribution,
    description="c_ij = α_ij‖ṽ_j‖/‖o_i‖ cos(o_i, ṽ_j), ranked by signed value",
    citation="Cunningham & Muça Cirone 2026",
    unit="share of the attention output (unitless, a row sums to 1)",
)
register_metric(
    "contribution_abs",
    label="|contribution weights| |c|",
    colour="#ff7f0e",
    marker="P",
    linestyle=":",
    fn=lambda x: x.contribution,
    absolute=True,
    description="|c_ij| (source ranking: |Σ_h c_ij^h|)",
    citation="Cunningham & Muça Cirone 2026",
    unit="|share| of the attention output (unitless)",
)
register_metric(
    "value_zeroing",
    label="Value Zeroing",
    colour="#9467bd",
    marker="v",
    linestyle=":",
    fn=_value_zeroing,
    per_layer=False,
    default=False,
    description="1 − cos of the layer output with v_j zeroed, Mohebbi et al. 2023; one MLP pass per (query, source ≤ query) row",
    citation="Mohebbi et al. 2023",
    unit="1 − cos of the layer output (unitless, 0 to 2)",
)
register_metric(
    "random",
    label="random",
    colour="#000000",
    marker="x",
    linestyle=(0, (6, 2)),
    fn=_random,
    per_layer=False,
    level="head",
    description="uniform scores: the floor",
    unit="uniform random score (unitless)",
)
