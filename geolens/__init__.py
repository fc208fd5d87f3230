"""geolens: the geometry of attention in TransformerLens models (see docs/method.md).

Core entry points::

    import geolens
    model = geolens.load_model()                      # SmolLM2-135M, offline
    _, cache = model.run_with_cache(tokens, names_filter=geolens.names_filter(model))
    c = geolens.contribution_weights(model, cache, layer=5, mode="intra")
    m = geolens.attention_metrics(model, cache, layer=5)
"""

# The public API: one ``__all__``, each name with a short runnable ``>>>`` example on a tiny random
# model in its docstring (run as doctests by tests/test_public_api.py). Everything else is imported
# from its module (``geolens.sinks``, ``geolens.selection``, ``geolens.interventions``, ...).
from geolens import checkpoint, faithfulness, multiple_choice, pruning, runner, selection, streaming, taxonomy
from geolens._version import __version__
from geolens.adapter import (
    AttentionLayer,
    adapter_for,
    get_attention_layer,
    hook_name,
    model_mode,
    names_filter,
    required_hook_names,
)
from geolens.contributions import (
    AttentionMetrics,
    InfluenceFactors,
    LayerMetrics,
    ZeroNormOutputWarning,
    attention_metrics,
    contribution_weights,
    influence_factors,
    layer_metrics,
    per_source_totals,
)
from geolens.faithfulness import Protocol, faithfulness_curves, value_zeroing
from geolens.flow import contribution_flow
from geolens.geometry import head_output_norms, head_outputs, layer_output, projected_value_norms
from geolens.hf import run_with_cache
from geolens.metrics import register_metric
from geolens.models import load_model
from geolens.runner import run_analysis, run_corpus
from geolens.sinks import sink_geometry
from geolens.taxonomy import head_taxonomy

__all__ = [
    # models and activations
    "load_model",
    "adapter_for",
    "names_filter",
    "get_attention_layer",
    # contribution weights and their geometry (docs/method.md §1-2)
    "contribution_weights",
    "attention_metrics",
    "influence_factors",
    "layer_metrics",
    "per_source_totals",
    "projected_value_norms",
    "head_outputs",
    "layer_output",
    # corpus runs
    "run_corpus",
    "run_analysis",
    # topics
    "sink_geometry",
    "head_taxonomy",
    "faithfulness_curves",
    "Protocol",
    "value_zeroing",
    "register_metric",
    # across layers (docs/method.md §10)
    "contribution_flow",
    # any transformers model, without TransformerLens (geolens/hf)
    "run_with_cache",
]
