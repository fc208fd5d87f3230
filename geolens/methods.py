"""The one registry of attribution methods: every method geolens computes, at every level.

A method scores the source tokens of one prediction (or of one query's attention output), at one
of three levels:

- ``"head"``: one attention head of one layer (the metrics of :mod:`geolens.metrics`: raw,
  value-weighted, output-normalised, contribution, |contribution|, and any metric added with
  :func:`geolens.register_metric`); summed over heads, they score a whole layer;
- ``"layer"``: one layer as a whole (Value Zeroing);
- ``"model"``: the whole model, i.e. which input tokens a prediction comes from (the flows of
  :func:`geolens.contribution_flow` and the gradient baselines of :mod:`geolens.flow.erasure`).

Each :class:`Method` says what it needs (``"cache"``: one forward with cache; ``"gradients"``:
backward passes; ``"reruns"``: extra forwards per source; ``"none"``), where it comes from
(author-year, full references in docs/method.md), and its name inside its own family (``key``:
what ``geolens flow --method``, ``geolens faithfulness --metrics`` and the protocols call it).
The metric registry is read live, so a metric registered with :func:`geolens.register_metric` is
a method here at once. :func:`geolens.attribute` takes any of these names.

>>> import geolens
>>> table = geolens.list_methods()
>>> table.loc[table.name == "alti", ["level", "needs", "citation"]].values.tolist()
[['model', 'cache', 'Ferrando, Gállego & Costa-jussà 2022']]
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Literal

Level = Literal["head", "layer", "model"]
Needs = Literal["none", "cache", "gradients", "reruns"]
Family = Literal["metric", "flow", "gradient"]
LEVELS: tuple[str, ...] = ("head", "layer", "model")


@dataclass(frozen=True)
class Method:
    """One attribution method of the registry.

    Attributes:
        name: what :func:`geolens.attribute` takes (unique in the registry).
        level: the finest level it scores: ``"head"``, ``"layer"`` or ``"model"``.
        needs: ``"cache"``, ``"gradients"``, ``"reruns"`` or ``"none"``.
        citation: author-year of its source (``""``: none; references in docs/method.md).
        label: how tables and plots name it.
        description: one line: what it computes.
        family: ``"metric"`` (:mod:`geolens.metrics`), ``"flow"`` (:func:`geolens.contribution_flow`)
            or ``"gradient"`` (:mod:`geolens.flow.erasure`).
        key: its name inside its family (the CLI's and the protocols' spelling).
        signed: its scores take both signs (a plot centres its colours on 0).
        unit: what a score is, with its unit, as a plot's axis says it (``""``: not given, e.g. a
            metric registered without ``unit=``; a plot then says "score").
    """

    name: str
    level: Level
    needs: Needs
    citation: str
    label: str
    description: str
    family: Family
    key: str
    signed: bool = False
    unit: str = ""


# The units of the whole-model methods: a flow row is a share of the prediction; a gradient
# method's score is in nats of log p(target) (integrated gradients' add up to its change from the
# baseline input).
SHARE_OF_PREDICTION = "share of the prediction (unitless, a row sums to 1)"
LOG_PROB_NATS = "contribution to log p(target) (nats)"


# The whole-model methods (the metrics are read from geolens.metrics when asked).
_MODEL_METHODS: tuple[Method, ...] = (
    Method(
        "contribution_flow",
        "model",
        "cache",
        "Cunningham & Muça Cirone 2026 (composed over layers, docs/method.md §10)",
        "contribution flow",
        "contribution weights of each layer's residual update, composed through the layers",
        "flow",
        "contribution",
        unit=SHARE_OF_PREDICTION,
    ),
    Method(
        "alti",
        "model",
        "cache",
        "Ferrando, Gállego & Costa-jussà 2022",
        "ALTI",
        "L1 proximity of each source's term to the layer output, composed through the layers",
        "flow",
        "alti",
        unit=SHARE_OF_PREDICTION,
    ),
    Method(
        "attention_rollout",
        "model",
        "cache",
        "Abnar & Zuidema 2020",
        "attention rollout",
        "0.5 · mean_h α + 0.5 · I, composed through the layers",
        "flow",
        "attention_rollout",
        unit=SHARE_OF_PREDICTION,
    ),
    Method(
        "value_zeroing_rollout",
        "model",
        "reruns",
        "Mohebbi et al. 2023",
        "Value-Zeroing rollout",
        "Value Zeroing scores of each layer, rows normalised, composed through the layers",
        "flow",
        "value_zeroing_rollout",
        unit=SHARE_OF_PREDICTION,
    ),
    Method(
        "grad_x_input",
        "model",
        "gradients",
        "Shrikumar et al. 2016",
        "gradient × input",
        "Σ_d x_jd ∂ log p(t*)/∂x_jd on the input embeddings (t*: the top-1 prediction)",
        "gradient",
        "grad_x_input",
        signed=True,
        unit=LOG_PROB_NATS,
    ),
    Method(
        "integrated_gradients",
        "model",
        "gradients",
        "Sundararajan, Taly & Yan 2017",
        "integrated gradients",
        "(x − x′) · mean gradient of log p(t*) along the straight path from a baseline input x′",
        "gradient",
        "integrated_gradients",
        signed=True,
        unit=LOG_PROB_NATS,
    ),
)


def _metric_methods() -> list[Method]:
    # Imported here, not at module level: the command line builds its --method choices from
    # model_methods() without importing torch (geolens.metrics needs it). Importing it registers
    # every built-in metric, value_zeroing included.
    from geolens import metrics

    out = []
    for name in metrics.metric_names():
        m = metrics.get_metric(name)
        needs = "cache" if m.per_layer else ("none" if name == "random" else "reruns")
        out.append(
            Method(
                name,
                m.scope,
                needs,
                m.citation,
                m.label,
                m.description,
                "metric",
                name,
                signed=not m.absolute and name not in _UNSIGNED_METRICS,
                unit=m.unit,
            )
        )
    return out


# built-in metrics whose scores are never negative (a registered metric's sign is not known: it
# counts as signed, and a plot centres its colours on 0, which shows either kind)
_UNSIGNED_METRICS = ("raw_attention", "value_weighted", "output_normalized", "value_zeroing", "random")


def model_methods(family: str | None = None) -> tuple[Method, ...]:
    """The whole-model methods (or one family's: ``"flow"``, ``"gradient"``), without importing
    torch: what the command line's choices are built from.

    >>> [m.key for m in model_methods("flow")]
    ['contribution', 'alti', 'attention_rollout', 'value_zeroing_rollout']
    """
    return tuple(m for m in _MODEL_METHODS if family is None or m.family == family)


def methods(level: str | None = None) -> tuple[Method, ...]:
    """Every registered method (metrics first, in registration order, then the whole-model ones),
    or those of one ``level``."""
    if level is not None and level not in LEVELS:
        raise ValueError(f"level must be one of {', '.join(map(repr, LEVELS))}, got {level!r}")
    found = (*_metric_methods(), *_MODEL_METHODS)
    return tuple(m for m in found if level is None or m.level == level)


ALIASES: dict[str, str] = {
    "input_x_gradient": "grad_x_input",  # inseq
    "inputxgradient": "grad_x_input",  # captum's InputXGradient
    "gradient_x_input": "grad_x_input",
    "integratedgradients": "integrated_gradients",  # captum's IntegratedGradients
    "attention": "raw_attention",  # inseq's attention weights
    "rollout": "attention_rollout",
}
"""The peers' names of geolens' methods (inseq, captum) → the registry's: :func:`get_method` takes
both, and the results carry the registry's name."""


def get_method(name: str) -> Method:
    """The method ``name`` (or a peer's name for it, :data:`ALIASES`); a one-line ValueError naming
    the choices otherwise.

    >>> get_method("integrated_gradients").needs
    'gradients'
    >>> get_method("input_x_gradient").name  # inseq's name
    'grad_x_input'
    """
    name = ALIASES.get(str(name).lower(), name) if isinstance(name, str) else name
    for m in methods():
        if m.name == name:
            return m
    names = [m.name for m in methods()]
    close = difflib.get_close_matches(str(name), names, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(f"unknown method {name!r}{hint}; choose from {', '.join(names)}")


def method_for(family: str, key: str) -> Method | None:
    """The method a family calls ``key`` (``method_for("flow", "contribution")`` is
    ``contribution_flow``), or None."""
    return next((m for m in methods() if m.family == family and m.key == key), None)


def list_methods(level: str | None = None):
    """The registry of attribution methods as a table (a pandas DataFrame), one row per method.

    Columns: ``name`` (what :func:`geolens.attribute` takes), ``level`` (head, layer or model),
    ``needs`` (cache only, gradients, reruns), ``citation`` (author-year; references in
    docs/method.md), ``description``. Every metric registered with :func:`geolens.register_metric`
    is listed too. ``level`` keeps one level's methods.

    >>> import geolens
    >>> geolens.list_methods("model").name.tolist()
    ['contribution_flow', 'alti', 'attention_rollout', 'value_zeroing_rollout', 'grad_x_input', 'integrated_gradients']
    """
    import pandas as pd  # not at module level: model_methods() stays light for the command line

    rows = [
        dict(name=m.name, level=m.level, needs=m.needs, citation=m.citation, description=m.description)
        for m in methods(level)
    ]
    return pd.DataFrame(rows, columns=["name", "level", "needs", "citation", "description"])


def markdown_table() -> str:
    """The registry as the Markdown table of docs/methods.md (tests/test_methods.py checks that the
    page holds exactly this; regenerate with ``python -m geolens.methods``)."""
    lines = ["| method | level | needs | source | what it computes |", "|---|---|---|---|---|"]
    for m in methods():
        cells = [f"`{m.name}`", m.level, m.needs, m.citation or "—", m.description]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
