"""Value Zeroing (Mohebbi et al. 2023): a metric that needs the model's own forwards.

:func:`value_zeroing` scores each source j of query i in layer l by how much the layer's output
at i turns when v_j is zeroed. It is computed in :mod:`geolens.interventions.value_zeroing` (below
the metric registry, which registers it as the metric ``value_zeroing``: ``per_layer=False``,
``default=False``, one MLP pass per (query, source ≤ query) row is costly) and named here, with the
other faithfulness evaluations, as it always was.
"""

from __future__ import annotations

from geolens.interventions.value_zeroing import value_zeroing

__all__ = ["value_zeroing"]
