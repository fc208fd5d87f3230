"""geolens: the geometry of attention in TransformerLens models (see docs/method.md).

Core entry points::

    import geolens
    model = geolens.load_model()                      # SmolLM2-135M, offline
    _, cache = model.run_with_cache(tokens, names_filter=geolens.names_filter(model))
    c = geolens.contribution_weights(model, cache, layer=5, mode="intra")
    m = geolens.attention_metrics(model, cache, layer=5)
"""

from geolens.adapter import (
    AttentionLayer,
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
    head_outputs,
    influence_factors,
    layer_metrics,
    layer_output,
    per_source_totals,
    projected_value_norms,
)
from geolens.geometry import head_output_norms
from geolens.models import load_model

__version__ = "0.1.0"

__all__ = [
    "AttentionLayer",
    "AttentionMetrics",
    "InfluenceFactors",
    "LayerMetrics",
    "ZeroNormOutputWarning",
    "attention_metrics",
    "contribution_weights",
    "get_attention_layer",
    "head_output_norms",
    "head_outputs",
    "hook_name",
    "influence_factors",
    "layer_metrics",
    "layer_output",
    "load_model",
    "model_mode",
    "names_filter",
    "per_source_totals",
    "projected_value_norms",
    "required_hook_names",
]

from geolens import checkpoint, runner, streaming  # noqa: E402  (issue 7; geolens.distributed is imported on use)
from geolens.runner import run_analysis, run_corpus  # noqa: E402

__all__ += ["run_analysis", "run_corpus"]

from geolens import faithfulness, multiple_choice, pruning  # noqa: E402  (issue 5: causal evaluation)
from geolens.faithfulness import Protocol, faithfulness_curves, value_zeroing  # noqa: E402

__all__ += ["Protocol", "faithfulness_curves", "value_zeroing"]

from geolens import selection, taxonomy  # noqa: E402  (issue 4: token selection and head taxonomy)
from geolens.taxonomy import head_taxonomy  # noqa: E402

__all__ += ["head_taxonomy"]
