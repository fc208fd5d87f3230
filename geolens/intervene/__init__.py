"""Interventions in one call: sink value scaling, head ablation and regime ablation.

Each function takes a loaded model (TransformerBridge or HookedTransformer) or a name that
:func:`geolens.load_model` accepts, the text(s) to measure on, and what to edit; it runs the clean
and the edited forward passes and returns a result object that a notebook shows (``_repr_html_``),
tabulates (``.summary``) and plots (``.plot()``):

- :func:`scale_sink_values`: v_0 ← λ v_0 in chosen layers and heads (docs/method.md §4,
  Cunningham & Muça Cirone 2026 §3.3): the clean and edited logits, the loss and perplexity
  change, and the semantic drift of the low-norm heads (their outputs' cosine with the semantic
  cone) per edited layer;
- :func:`ablate_heads`: chosen heads zero- or mean-ablated at ``hook_z`` (docs/method.md §6): the
  loss change per text;
- :func:`ablate_regime`: every head of one regime of the Retriever / Mixer / Reset taxonomy
  (Mudarisov et al. 2026) ablated, against a size-matched control: as many heads drawn at
  random, over several draws, with a bootstrap interval of the difference.

Every result is also a context manager that applies its edit to the researcher's own forward
passes and removes the hooks on any exit, even when an exception escapes::

    with geolens.intervene.ablate_heads(model, heads=[(3, 1)]):   # no text: nothing measured
        logits = model(my_tokens)

They are thin layers over the one home of each idea: the hooks of
:mod:`geolens.interventions` (:func:`~geolens.interventions.sink_values.scale_sink_value`,
:func:`~geolens.interventions.ablation.head_ablation_hooks`), the drift statistics of
:func:`geolens.sinks.semantic_drift` and the regimes of :func:`geolens.head_taxonomy`.

The loss is the mean next-token negative log-likelihood in nats over every predicted position of
a text (−log p(t_{i+1} | t_≤i), i = 0 … n − 2, BOS included as context); a change is edited minus
clean, so a positive Δloss means the edit hurts. With several texts, each text weighs the same.

Modules: :mod:`geolens.intervene.sink` (:func:`scale_sink_values`), :mod:`geolens.intervene.heads`
(:func:`ablate_heads`), :mod:`geolens.intervene.regime` (:func:`ablate_regime`).
"""

from geolens.intervene.heads import HeadAblation, ablate_heads
from geolens.intervene.regime import REGIME_NAMES, RegimeAblation, ablate_regime, random_head_sets, regime_heads
from geolens.intervene.sink import SinkScaling, scale_sink_values

__all__ = [
    "HeadAblation",
    "REGIME_NAMES",
    "RegimeAblation",
    "SinkScaling",
    "ablate_heads",
    "ablate_regime",
    "random_head_sets",
    "regime_heads",
    "scale_sink_values",
]
