"""The constants the parsers show (geolens.commands._names, kept there so that --help imports nothing
heavy) equal those of the modules that own them."""

from __future__ import annotations


def test_the_parser_constants_equal_their_sources():
    from geolens import models, testing
    from geolens.commands import _names
    from geolens.faithfulness import FRACTIONS
    from geolens.flow import FLOW_METHODS
    from geolens.interventions.masking import RANKING_SCOPES
    from geolens.metrics import get_metric, metric_names
    from geolens.multiple_choice import DEFAULT_TASKS
    from geolens.sinks.drift import DEFAULT_LAMBDAS

    assert _names.SHIPPED_MODELS == tuple(sorted(models.MODELS))
    assert _names.TINY_KINDS == testing.TINY_KINDS and _names.TINY_MODELS == testing.TINY_MODELS
    assert _names.FLOW_METHODS == FLOW_METHODS
    assert _names.RANKING_SCOPES == RANKING_SCOPES
    assert _names.FRACTIONS == FRACTIONS
    assert _names.DEFAULT_LAMBDAS == DEFAULT_LAMBDAS
    assert _names.DEFAULT_TASKS == DEFAULT_TASKS
    assert _names.METRICS == metric_names()
    assert _names.DEFAULT_METRICS == metric_names(default_only=True)
    costly = {m: get_metric(m).description for m in metric_names() if m not in metric_names(default_only=True)}
    assert _names.COSTLY_METRICS == costly
