"""geolens: the geometry of attention in TransformerLens models (see docs/method.md).

From a sentence to a labelled picture in one call::

    import geolens
    att = geolens.attribute("smollm2-135m", "The capital of France is", method="contribution_flow")
    att.plot()                                        # which input tokens the next token comes from

Interventions in one call (:mod:`geolens.intervene`)::

    drift = geolens.intervene.scale_sink_values("smollm2-135m", text, lam=0.0, layers=[4, 10])
    reset = geolens.intervene.ablate_regime("smollm2-135m", texts, "reset")   # against random heads

The functional API underneath::

    model = geolens.load_model()                      # SmolLM2-135M, offline
    _, cache = model.run_with_cache(tokens, names_filter=geolens.names_filter(model))
    c = geolens.contribution_weights(model, cache, layer=5, mode="intra")
    m = geolens.attention_metrics(model, cache, layer=5)
"""

# The public API: one ``__all__``, each name with a short runnable ``>>>`` example on a tiny random
# model in its docstring (run as doctests by tests/test_public_api.py). Everything else is imported
# from its module (``geolens.sinks``, ``geolens.selection``, ``geolens.interventions``, ...).
#
# Names are resolved on first use (PEP 562 ``__getattr__``): ``import geolens`` imports neither
# torch nor TransformerLens, so ``geolens --version`` and argument errors answer at once. Submodules
# (``geolens.sinks``, ``geolens.faithfulness``, ...) load the same way on first attribute access.
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from geolens import threads as _threads
from geolens._version import __version__ as __version__

_threads.prefer_passive_wait()  # before torch loads OpenMP (geolens.threads); no torch import here

# public name -> the module that defines it (the one home of each)
_PUBLIC = {
    # one call from text to a picture
    "attribute": "geolens.attribution",
    "Attribution": "geolens.attribution",
    "list_methods": "geolens.methods",
    "evaluate_attribution": "geolens.faithfulness.evaluation",
    # models and activations
    "load_model": "geolens.models",
    "adapter_for": "geolens.adapter",
    "names_filter": "geolens.adapter",
    "get_attention_layer": "geolens.adapter",
    "run_with_cache": "geolens.hf",
    # contribution weights and their geometry (docs/method.md §1-2)
    "contribution_weights": "geolens.contributions",
    "attention_metrics": "geolens.factors",
    "influence_factors": "geolens.factors",
    "layer_metrics": "geolens.contributions",
    "per_source_totals": "geolens.contributions",
    "projected_values": "geolens.geometry",
    "projected_value_norms": "geolens.geometry",
    "head_output_norms": "geolens.geometry",
    "head_outputs": "geolens.geometry",
    "layer_output": "geolens.geometry",
    # corpus runs
    "run_corpus": "geolens.runner",
    "run_analysis": "geolens.runner",
    # topics
    "sink_geometry": "geolens.sinks",
    "head_taxonomy": "geolens.taxonomy",
    "faithfulness_curves": "geolens.faithfulness",
    "MaskingConfig": "geolens.faithfulness",
    "value_zeroing": "geolens.faithfulness",
    "register_metric": "geolens.metrics",
    # across layers (docs/method.md §10)
    "contribution_flow": "geolens.flow",
}

__all__ = [
    "attribute",
    "Attribution",
    "list_methods",
    "evaluate_attribution",
    "load_model",
    "adapter_for",
    "names_filter",
    "get_attention_layer",
    "run_with_cache",
    "contribution_weights",
    "attention_metrics",
    "influence_factors",
    "layer_metrics",
    "per_source_totals",
    "projected_values",
    "projected_value_norms",
    "head_output_norms",
    "head_outputs",
    "layer_output",
    "run_corpus",
    "run_analysis",
    "sink_geometry",
    "head_taxonomy",
    "faithfulness_curves",
    "MaskingConfig",
    "value_zeroing",
    "register_metric",
    "contribution_flow",
]
assert set(__all__) == set(_PUBLIC)


def __getattr__(name: str):
    module = _PUBLIC.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # resolved once
        return value
    if not name.startswith("__"):
        try:
            return importlib.import_module(f"geolens.{name}")  # a submodule: geolens.sinks, ...
        except ModuleNotFoundError as e:
            if e.name != f"geolens.{name}":
                raise
    raise AttributeError(f"module 'geolens' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:  # what the names are, for type checkers and IDEs
    from geolens.adapter import adapter_for, get_attention_layer, names_filter
    from geolens.attribution import Attribution, attribute
    from geolens.contributions import contribution_weights, layer_metrics, per_source_totals
    from geolens.factors import attention_metrics, influence_factors
    from geolens.faithfulness import MaskingConfig, faithfulness_curves, value_zeroing
    from geolens.faithfulness.evaluation import evaluate_attribution
    from geolens.flow import contribution_flow
    from geolens.geometry import (
        head_output_norms,
        head_outputs,
        layer_output,
        projected_value_norms,
        projected_values,
    )
    from geolens.hf import run_with_cache
    from geolens.methods import list_methods
    from geolens.metrics import register_metric
    from geolens.models import load_model
    from geolens.runner import run_analysis, run_corpus
    from geolens.sinks import sink_geometry
    from geolens.taxonomy import head_taxonomy
