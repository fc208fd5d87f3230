"""The constants the parsers of the ``geolens`` commands show, copied here from the modules that
own them so that building the parser imports no torch (the CLI's lazy-import rule,
:mod:`geolens.commands`). ``tests/test_cli_imports.py`` checks that every copy equals its source.
"""

from __future__ import annotations

from geolens.methods import model_methods

SHIPPED_MODELS = ("gemma3-270m", "smollm2-135m")  # sorted(geolens.models.MODELS)
TINY_KINDS = ("gqa", "mha", "gemma")  # geolens.testing.TINY_KINDS
TINY_MODELS = tuple(f"tiny-{kind}" for kind in TINY_KINDS)  # geolens.testing.TINY_MODELS
FLOW_METHODS = tuple(m.key for m in model_methods("flow"))  # the method registry (light: no torch)
RANKING_SCOPES = ("row", "query", "source")  # geolens.interventions.masking
FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9)  # geolens.faithfulness.FRACTIONS
DEFAULT_LAMBDAS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0)  # geolens.sinks.drift
DEFAULT_TASKS = ("general_knowledge", "hindu_knowledge", "disambiguation_qa", "causal_judgment")  # multiple_choice
# geolens.metrics' built-in registry: every name, the default ones, and the others' descriptions
METRICS = (
    "raw_attention",
    "value_weighted",
    "output_normalized",
    "contribution",
    "contribution_abs",
    "value_zeroing",
    "random",
)
DEFAULT_METRICS = tuple(m for m in METRICS if m != "value_zeroing")
COSTLY_METRICS = {
    "value_zeroing": "1 − cos of the layer output with v_j zeroed, Mohebbi et al. 2023; one MLP pass per (query, source ≤ query) row"
}


def metric_choices() -> tuple[tuple[str, ...], tuple[str, ...], dict[str, str]]:
    """(every metric, the default ones, {costly metric: its description}) for ``--metrics`` help:
    the live registry when :mod:`geolens.metrics` is already loaded (so that a metric registered
    with ``geolens.register_metric`` in this process is listed), else the copies above, without
    importing torch."""
    import sys

    registry = sys.modules.get("geolens.metrics")
    if registry is None:
        return METRICS, DEFAULT_METRICS, COSTLY_METRICS
    names = registry.metric_names()
    default = registry.metric_names(default_only=True)
    costly = {m: registry.get_metric(m).description for m in names if m not in default}
    return names, default, costly
