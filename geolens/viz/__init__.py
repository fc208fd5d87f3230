"""Visualisations: circuitsvis views and matplotlib plots that display in notebooks and save.

What a function returns follows its name (tests/viz/test_viz.py checks it):

- a figure function returns a :class:`HTMLView` (circuitsvis components, rendered with the JS
  bundle shipped inside the circuitsvis wheel, never a CDN) or a :class:`PlotView` (matplotlib);
  both have ``.save(path)`` and carry the numbers they show in ``.data``;
- a function named ``*_html`` returns an HTML fragment (a ``str``) to inline in a page or show
  with ``IPython.display.HTML``; one named ``*_page`` a standalone HTML page (a ``str``);
- :mod:`geolens.viz.attribution` draws :class:`geolens.Attribution`: ``attribution_figure``
  returns the matplotlib ``Figure`` of ``Attribution.plot()``.

- :mod:`geolens.viz.contributions`: signed contribution-weight heatmaps per head, attention vs
  contribution colouring of one query's sources, sink attention vs contribution per layer.
- :mod:`geolens.viz.sinks`: sink-norm/cosine bars, token-type decomposition, output norm vs sink
  rate, semantic drift.
- :mod:`geolens.viz.selection`: F_N vs N (top-N vs random, with/without the sink), per layer,
  similarity decay.
- :mod:`geolens.viz.taxonomy`: the layer × head regime grid (PNG and HTML).
- :mod:`geolens.viz.faithfulness`: faithfulness curves, MC accuracy, pruning curves, single-head
  sensitivity map.
- :mod:`geolens.viz.flow`: information-flow routes (HTML), the erasure nAOPC plot.
- :mod:`geolens.viz.attribution`: :class:`geolens.Attribution` as a bar chart and coloured tokens.
"""

from geolens.viz.common import HTMLView, PlotView, circuitsvis_bundle, to_jsonable
from geolens.viz.contributions import (
    contribution_heatmaps,
    signed_heatmaps,
    sink_attention_vs_contribution_plot,
    source_colors,
    str_tokens,
)
from geolens.viz.faithfulness import (
    faithfulness_curves_plot,
    mc_accuracy_plot,
    pruning_curves_plot,
    sensitivity_map_plot,
)
from geolens.viz.selection import f_by_layer_plot, f_vs_n_plot, similarity_decay_plot
from geolens.viz.sinks import controls_plot, decomposition_bars, drift_plot, norm_curve_plot, sink_layer_bars
from geolens.viz.taxonomy import regime_grid_html, regime_grid_plot, save_regime_grid_html

__all__ = [
    "HTMLView",
    "PlotView",
    "circuitsvis_bundle",
    "contribution_heatmaps",
    "decomposition_bars",
    "f_by_layer_plot",
    "f_vs_n_plot",
    "faithfulness_curves_plot",
    "mc_accuracy_plot",
    "pruning_curves_plot",
    "regime_grid_html",
    "regime_grid_plot",
    "save_regime_grid_html",
    "sensitivity_map_plot",
    "similarity_decay_plot",
    "controls_plot",
    "drift_plot",
    "norm_curve_plot",
    "sink_layer_bars",
    "signed_heatmaps",
    "sink_attention_vs_contribution_plot",
    "source_colors",
    "str_tokens",
    "to_jsonable",
]
