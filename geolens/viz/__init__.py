"""Visualisations: circuitsvis views and matplotlib plots that display in notebooks and save.

Every function returns a :class:`HTMLView` (circuitsvis components, rendered with the JS bundle
shipped inside the circuitsvis wheel, never a CDN) or a :class:`PlotView` (matplotlib); both have
``.save(path)`` and carry the numbers they show in ``.data``.

- :mod:`geolens.viz.contributions`: signed contribution-weight heatmaps per head, attention vs
  contribution colouring of one query's sources, sink attention vs contribution per layer.
- :mod:`geolens.viz.sinks`: sink-norm/cosine bars, token-type decomposition, output norm vs sink
  rate, semantic drift.
"""

from geolens.viz.common import HTMLView, PlotView, circuitsvis_bundle, to_jsonable
from geolens.viz.contributions import (
    contribution_heatmaps,
    signed_heatmaps,
    sink_attention_vs_contribution_plot,
    source_colors,
    str_tokens,
)
from geolens.viz.sinks import decomposition_bars, drift_plot, norm_curve_plot, sink_layer_bars

__all__ = [
    "HTMLView",
    "PlotView",
    "circuitsvis_bundle",
    "contribution_heatmaps",
    "decomposition_bars",
    "drift_plot",
    "norm_curve_plot",
    "sink_layer_bars",
    "signed_heatmaps",
    "sink_attention_vs_contribution_plot",
    "source_colors",
    "str_tokens",
    "to_jsonable",
]
