"""Contribution flow through the whole model and its tests (docs/method.md §10).

- :mod:`geolens.flow.core`: :func:`contribution_flow` (contribution, ALTI, attention rollout,
  Value-Zeroing rollout composed through the layers), :func:`layer_mixing`, the hook filter;
- :mod:`geolens.flow.routes`: the information-flow routes of one prediction (:func:`flow_routes`);
- :mod:`geolens.flow.baselines`: the gradient baselines (gradient × input, integrated gradients, the
  prefix-mean baseline x′, f along the integration path);
- :mod:`geolens.flow.erasure`: the input-token erasure test, one document at a time;
- :mod:`geolens.flow.induction`: its known-answer check on a repeated random sequence;
- :mod:`geolens.flow.summary`: normalised AOPC, intervals and Holm verdicts of an erasure run.

Every method is in the one registry of :func:`geolens.list_methods`; the pipeline that runs the
erasure test and the command's renderers are :mod:`geolens.pipelines.flow`.
"""

from geolens.flow.baselines import (
    IntegratedGradients,
    IntegrationPath,
    gradient_x_input,
    input_embeddings,
    integrated_gradients,
    integration_path,
    prefix_mean_baseline,
    relative_gap,
)
from geolens.flow.core import (
    FLOW_METHODS,
    FlowMethod,
    LayerResidual,
    check_flow_method,
    contribution_flow,
    flow_hook_names,
    flow_names_filter,
    layer_mixing,
    residual_decomposition,
)
from geolens.flow.erasure import (
    DIRECTIONS,
    ERASURE_METHODS,
    FRACTIONS,
    REPLACEMENTS,
    ErasureSettings,
    erase,
    erasure_outcomes,
    erasure_sets,
    measure_document,
    method_pairs,
    n_erased,
    ranking,
    replacement_ids,
    space_token,
    unigram_counts,
)
from geolens.flow.induction import induction_check, induction_summary, induction_tokens
from geolens.flow.routes import FlowGraph, flow_routes, token_strings
from geolens.flow.summary import curves_table, erasure_summary

__all__ = [
    "DIRECTIONS",
    "ERASURE_METHODS",
    "FLOW_METHODS",
    "FRACTIONS",
    "REPLACEMENTS",
    "ErasureSettings",
    "FlowGraph",
    "FlowMethod",
    "IntegratedGradients",
    "IntegrationPath",
    "LayerResidual",
    "check_flow_method",
    "contribution_flow",
    "curves_table",
    "erase",
    "erasure_outcomes",
    "erasure_sets",
    "erasure_summary",
    "flow_hook_names",
    "flow_names_filter",
    "flow_routes",
    "gradient_x_input",
    "induction_check",
    "induction_summary",
    "induction_tokens",
    "input_embeddings",
    "integrated_gradients",
    "integration_path",
    "layer_mixing",
    "measure_document",
    "method_pairs",
    "n_erased",
    "prefix_mean_baseline",
    "ranking",
    "relative_gap",
    "replacement_ids",
    "residual_decomposition",
    "space_token",
    "token_strings",
    "unigram_counts",
]
