"""Attention sinks (docs/method.md §4): geometry, token-type decomposition, norm curve, semantic drift.

Public functions, each a corpus analysis driven by :func:`geolens.runner.run_corpus`:

- :func:`sink_geometry` → :class:`SinkGeometryResult` (sink rate, Gu et al. 2024 thresholded
  sink share, sink/non-sink norm ratios and cosines in value and projected space);
- :func:`token_type_decomposition` → :class:`DecompositionResult` (variance shares of
  log|c_ij| explained by attention, relative norm and alignment, sink vs tail);
- :func:`output_norm_curve` → :class:`NormCurveResult` (mean ‖o_i^h‖ per sink-rate bin with CIs,
  quadratic convexity fit and argmin);
- :func:`semantic_drift` → :class:`DriftResult` (λ grid of sink-value scaling: output norms,
  cosine with the semantic cone, ΔPPL, low-norm heads);
- :func:`sink_controls` → :class:`ControlsResult` (is it the sink's norm? norm edits of v_0 against
  norm-preserving and random-token controls, per layer and all at once, paired bootstrap CIs).

The hooks these use live in :mod:`geolens.interventions.sink_values`.
"""

from geolens.sinks.controls import ControlsResult, default_conditions, sink_controls
from geolens.sinks.decomposition import DecompositionResult, TokenTypeDecomposition, token_type_decomposition
from geolens.sinks.drift import DEFAULT_LAMBDAS, DriftResult, DriftStatistics, low_norm_heads, semantic_drift
from geolens.sinks.geometry import GU_EPSILON, SinkGeometry, SinkGeometryResult, layer_sink_statistics, sink_geometry
from geolens.sinks.norm_curve import NormCurve, NormCurveResult, output_norm_curve, quadratic_fit

__all__ = [
    "ControlsResult",
    "DEFAULT_LAMBDAS",
    "DecompositionResult",
    "DriftResult",
    "DriftStatistics",
    "GU_EPSILON",
    "NormCurve",
    "NormCurveResult",
    "SinkGeometry",
    "SinkGeometryResult",
    "TokenTypeDecomposition",
    "layer_sink_statistics",
    "default_conditions",
    "low_norm_heads",
    "output_norm_curve",
    "quadratic_fit",
    "semantic_drift",
    "sink_controls",
    "sink_geometry",
    "token_type_decomposition",
]
