"""One pipeline per topic: the function that runs the topic and returns everything it shows.

Both the topic's command (``geolens/commands/<topic>.py``: writes the result to disk) and its
report section (``geolens/report/sections/<topic>.py``: renders it) call the same function, with
their own parameters; neither computes anything else of the topic.

- sinks: :func:`geolens.pipelines.sinks.run_sinks` (:class:`~geolens.pipelines.sinks.SinksParams`);
- selection: :func:`geolens.pipelines.selection.run_selection` (:class:`~geolens.pipelines.selection.SelectionParams`);
- taxonomy: :func:`geolens.pipelines.taxonomy.run_taxonomy` (:class:`~geolens.pipelines.taxonomy.TaxonomyParams`);
- faithfulness: :func:`geolens.pipelines.faithfulness.run_faithfulness`
  (:class:`~geolens.pipelines.faithfulness.FaithfulnessParams`), and protocol 2's per-term endpoint
  :func:`geolens.pipelines.faithfulness.run_per_term` (:class:`~geolens.pipelines.faithfulness.PerTermParams`),
  and protocol 3's, controlled for the norm, :func:`geolens.pipelines.norm_controlled.run_norm_controlled`
  (:class:`~geolens.pipelines.norm_controlled.NormControlledParams`; the report's faithfulness section runs it);
- contribution flow: :func:`geolens.pipelines.flow.run_flow` (:class:`~geolens.pipelines.flow.FlowParams`)
  and the one-prompt look :func:`geolens.pipelines.flow.prompt_flow`;
- pruning: :func:`geolens.pipelines.pruning.run_pruning` (:class:`~geolens.pipelines.pruning.PruningParams`).

Every pipeline returns a :class:`TopicRun` (a dataclass per topic, with the topic's own result
objects besides):

- ``parameters``: the parameters of the run (a dict);
- ``tables``: name → ``pandas.DataFrame`` (a command writes ``<name>.csv``);
- ``figures``: name → a function that draws the figure (a :class:`~geolens.viz.common.PlotView`)
  when called, so that only the figures a caller shows are drawn;
- ``claims()``: the paper claims (:class:`geolens.claims.Claim`), each decided from this run's
  numbers by the criterion written next to it.

The topics with a corpus pass also have ``<topic>_analyses(model, tokens, params)``: the
streaming analyses (:class:`geolens.streaming.CorpusAnalysis`) of that pass. The pipeline builds
and runs them itself, unless it is given them already run (``analyses=``): the report runs the
analyses of all sections in one shared corpus pass, then each section's pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from geolens.runner import run_corpus


@dataclass(kw_only=True)
class TopicRun:
    """What a topic pipeline returns (see the module docstring); topics add their own fields."""

    parameters: dict[str, Any] = field(default_factory=dict)
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)

    @property
    def figures(self) -> dict[str, Callable]:
        return {}

    def claims(self) -> list:
        return []


def streamed(
    model, tokens, analyses: dict | None, make: Callable[[], dict], *, batch_size: int, progress: bool, desc: str
) -> dict:
    """The topic's corpus analyses: ``analyses`` when the caller already ran them over ``tokens``
    (the report's shared pass), else ``make()`` run over ``tokens`` now."""
    if analyses is None:
        analyses = make()
        run_corpus(model, tokens, list(analyses.values()), batch_size=batch_size, progress=progress, desc=desc)
    return analyses


def write_tables(
    out: Path,
    tables: dict[str, pd.DataFrame],
    names=None,
    *,
    suffix: str = "",
    float_format: str | None = "%.6g",
    index: bool = False,
) -> None:
    """Write ``tables[name]`` to ``out/<name><suffix>.csv`` for each of ``names`` (default: all) in ``tables``."""
    for name in tables if names is None else names:
        if name in tables:
            tables[name].to_csv(out / f"{name}{suffix}.csv", index=index, float_format=float_format)


def save_figures(out: Path, figures: dict[str, Callable], *, dpi: int, suffix: str = "") -> None:
    """Draw each figure, save it as ``out/<name><suffix>.png`` and close it."""
    for name, draw in figures.items():
        view = draw()
        view.save(out / f"{name}{suffix}.png", dpi=dpi)
        view.close()
