"""Protocol 3's per-term endpoint (docs/faithfulness/v3/PROTOCOL.md): what a metric predicts about
the effect of removing one attention term that the norm of the removed term does not.

Protocol 2 (:mod:`geolens.faithfulness.ground_truth`) scored each metric by its Spearman correlation
with the exact KL of removing each term α_ij^h ṽ_j^h. Value-weighted attention α‖ṽ‖ is the norm
n = ‖α_ij^h ṽ_j^h‖ of the removed vector and the KL of a small removal is second order in it, so
that correlation mostly ranks the norm. Here, per position (layer, query):

- every effect is measured in float64 (the model cast to float64 inside
  :func:`geolens.per_term.float64_exact`), with the position's numerical floor
  (:func:`geolens.per_term.numerical_floor`): a term is *resolvable* when its KL ≥ 10³ × floor;
- the outcomes are the KL (primary) and Δ log p of the actual next token (signed, and its magnitude);
- the primary statistic is the **partial Spearman** correlation of a metric with the KL given the
  norm (:func:`partial_spearman`), averaged over positions; value-weighted and output-normalised
  inter rank as the norm does, so theirs is 0 by construction.

Here: :func:`norm_controlled_document` measures one document (every term of every position: its
``terms`` table; one row per position: ``positions``) and :func:`norm_controlled_stage` runs it
under the protocol, resumable per document (:func:`geolens.resume.run_protocol_stage`). Beside it:
:mod:`geolens.faithfulness.norm_controlled_stats` (the statistics of one position:
:func:`partial_spearman`, :func:`strata_spearman`, :func:`position_statistics` for every analysis),
:mod:`geolens.faithfulness.norm_controlled_summary` (:func:`norm_controlled_summary`: per-metric
means with document-cluster bootstrap intervals, the pre-registered pairs as one Holm family, the
exploratory analyses) and :mod:`geolens.pipelines.norm_controlled_text` (the printed lines and the
README section). The statistics and the summary are importable from here too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from geolens.adapter import adapter_for, get_attention_layer, names_filter
from geolens.faithfulness.ground_truth import draw_positions, term_scores
from geolens.faithfulness.norm_controlled_stats import (
    ANALYSES,
    metric_scores,
    partial_spearman,
    position_statistics,
    statistics_table,
    strata_spearman,
)
from geolens.faithfulness.norm_controlled_summary import norm_controlled_summary
from geolens.metrics import LayerInputs
from geolens.per_term import _state_dtype, float64_exact, position_effects
from geolens.resume import run_protocol_stage

SEED = 3  # numpy.random.default_rng([3, document_index]) draws the positions (PROTOCOL.md §2)
STORED = (
    "raw_attention",
    "norm",
    "output_normalized_intra",
    "output_normalized_inter",
    "contribution",
    "grad_x_act",
    "grad_x_act_next",
    "random",
)
"""The scores kept per term in ``per_term_terms.csv.gz``; value-weighted is ``norm`` and
|contribution| is derived."""


# ---------------------------------------------------------------------------------------------
# Measuring one document


def norm_controlled_document(
    model,
    tokens: torch.Tensor,
    document_index: int,
    *,
    n_positions: int = 2,
    queries: tuple[int, int] = (8, 126),
    batch_size: int = 128,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(terms, positions)`` of one window ``[1, pos]`` (PROTOCOL.md §2-4): every term of every
    drawn position (document, position, layer, query, head, source, KL, Δ log p(next), the norm
    and the scores of :data:`STORED`), and one row per position (its floors, counts, the next
    token, the clean top-1 probability). The model should be float64 inside
    :func:`geolens.per_term.float64_exact` (:func:`norm_controlled_stage` does that); the metrics'
    inputs are read in the model's dtype."""
    if tokens.ndim != 2 or tokens.shape[0] != 1:
        raise ValueError(f"tokens must be one window [1, pos], got shape {tuple(tokens.shape)}")
    n_pos = tokens.shape[1]
    if not 0 <= queries[0] <= queries[1] < n_pos - 1:
        raise ValueError(f"queries {queries} do not fit a window of {n_pos} tokens (each needs a next token)")
    drawn = draw_positions(document_index, model.cfg.n_layers, n_positions, queries, seed=SEED)
    layers = sorted({l for l, _ in drawn})
    adapter = adapter_for(model)
    wanted = names_filter(model, layers)
    resid = {adapter.resid_pre_hook(l) for l in layers}
    dtype = _state_dtype(model)
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens, names_filter=lambda name: wanted(name) or name in resid)
        kv = adapter.prefix_kv_cache(tokens)
        inputs = {}
        for l in layers:
            view = get_attention_layer(model, cache, l, dtype=dtype)
            inputs[l] = (LayerInputs.from_layer(view, "inter"), LayerInputs.from_layer(view, "intra"))
    measured = {}
    terms, positions = [], []
    for p, (l, q) in enumerate(drawn):
        target = int(tokens[0, q + 1])
        if (l, q) not in measured:
            measured[(l, q)] = position_effects(
                model,
                tokens,
                l,
                q,
                clean_run=(logits, cache),
                kv_cache=kv,
                outcome=("kl",),
                batch_size=batch_size,
                target=target,
                scopes=("term",),
            )
        e = measured[(l, q)]
        scores = term_scores(*inputs[l], e, np.random.default_rng([SEED, int(document_index), p, 1]))
        ran = e.term.ran.numpy()
        heads, sources = np.nonzero(ran)
        frame = pd.DataFrame(
            dict(
                document=int(document_index),
                position=p,
                layer=l,
                query=q,
                head=heads,
                source=sources,
                kl=e.term.kl.numpy()[ran],
                delta_logp_next=e.term.delta_logp_target.numpy()[ran],
                norm=scores["value_weighted"][ran],
                raw_attention=scores["raw_attention"][ran],
                output_normalized_intra=scores["output_normalized_intra"][ran],
                output_normalized_inter=scores["output_normalized_inter"][ran],
                contribution=scores["contribution"][ran],
                grad_x_act=e.grad_x_act.numpy()[ran],
                grad_x_act_next=e.grad_x_act_target.numpy()[ran],
                random=scores["random"][ran],
            )
        )
        terms.append(frame)
        kl = frame.kl.to_numpy()
        positions.append(
            dict(
                document=int(document_index),
                position=p,
                layer=l,
                query=q,
                n_terms=len(frame),
                next_token=target,
                clean_top_prob=e.term.clean_prob,
                floor=e.term.floor,
                reference_kl=e.term.reference_kl,
                floor_delta_logp_next=e.term.target_floor,
                kl_max=float(kl.max()) if len(kl) else 0.0,
                kl_min=float(kl.min()) if len(kl) else 0.0,
                kl_sum=float(kl.sum()),
                n_resolvable=int((kl >= 1e3 * (e.term.floor or 0.0)).sum()),
            )
        )
    return pd.concat(terms, ignore_index=True), pd.DataFrame(positions)


# ---------------------------------------------------------------------------------------------
# The stage


def positions_per_document(settings: dict, model_name: str) -> int:
    """The protocol's positions per document for ``model_name`` (a number, or one per model; a
    model the protocol does not name takes the first)."""
    value = settings["primary"]["positions_per_document"]
    if isinstance(value, dict):
        return int(value.get(model_name, next(iter(value.values()))))
    return int(value)


def norm_controlled_stage(
    model,
    windows: torch.Tensor,
    protocol,
    out: Path,
    *,
    corpus: str,
    model_name: str,
    resume: bool,
    progress=print,
) -> dict:
    """Protocol 3's per-term endpoint on ``windows``, one document at a time through
    :func:`geolens.resume.run_protocol_stage` (tables ``per_term_terms.csv.gz`` and
    ``per_term_positions.csv.gz``), then :func:`norm_controlled_summary`. The model is cast to
    float64 (in place) and run inside :func:`geolens.per_term.float64_exact`."""
    settings = protocol.settings
    queries = tuple(settings["data"]["scored_positions"])
    n_positions = positions_per_document(settings, model_name)
    model = model.to(torch.float64)

    def measure(d: int) -> dict:
        terms, positions = norm_controlled_document(
            model, windows[d : d + 1], d, n_positions=n_positions, queries=queries
        )
        return {"terms": terms, "positions": positions}

    with float64_exact(model):
        tables = run_protocol_stage(
            "per_term",
            out,
            protocol,
            windows,
            measure,
            corpus=corpus,
            model_name=model_name,
            resume=resume,
            progress=progress,
            model=model,  # its weights fingerprint binds the saved rows (float64, as measured)
            positions_per_document=n_positions,
            queries=list(queries),
            dtype="float64",
        )
    part = norm_controlled_summary(tables["terms"], tables["positions"], dict(settings, n_layers=model.cfg.n_layers))
    part["positions_per_document"] = n_positions
    return part


__all__ = [
    "ANALYSES",
    "SEED",
    "STORED",
    "metric_scores",
    "norm_controlled_document",
    "norm_controlled_stage",
    "norm_controlled_summary",
    "partial_spearman",
    "position_statistics",
    "positions_per_document",
    "statistics_table",
    "strata_spearman",
]
