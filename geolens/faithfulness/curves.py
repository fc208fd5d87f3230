"""Comprehensiveness and sufficiency curves of every metric over a corpus (:func:`faithfulness_curves`)."""

from __future__ import annotations

from typing import Sequence

import pandas as pd
import torch
from jaxtyping import Int
from torch import Tensor
from tqdm.auto import tqdm

from geolens.adapter import names_filter
from geolens.faithfulness.masks import metric_scores, ranked_removals, sink_only_mask
from geolens.faithfulness.protocol import DIRECTIONS, MaskingConfig, same_ranking_by_construction
from geolens.faithfulness.result import FaithfulnessResult
from geolens.interventions.masking import mask_from_ranks, masked_token_nll, require_pattern_hooks, token_nll
from geolens.metrics import check_metric_names, get_metric, metric_names


def faithfulness_curves(
    model,
    tokens: Int[Tensor, "n pos"],
    protocol: MaskingConfig = MaskingConfig(),
    metrics: Sequence[str] | None = None,
    *,
    chunk_size: int = 12,
    seed: int = 0,
    progress: bool = True,
    n_boot: int = 1000,
    first_sequence: int = 0,
) -> FaithfulnessResult:
    """Comprehensiveness and sufficiency curves per metric over ``tokens`` (one row per document).

    Per document: one cached forward (the attention metrics and the clean NLL), the Value
    Zeroing forwards when asked (batched over source tokens), and the masked forwards, run
    ``chunk_size`` masks per batched forward (each batch row its own mask, every masked layer):
    2·n_k per distinct metric ranking, plus one with the sink alone removed. Metrics whose
    rankings are identical to an earlier metric's reuse its results instead of running the same
    masks again (``same_as`` in the rows): output-normalised reuses value-weighted whenever the
    two rank identically in exact arithmetic (:func:`same_ranking_by_construction`; float32
    rounding would otherwise reorder a few near-ties), other metrics when their rankings are
    equal element for element. Random
    rankings use seed ``seed + first_sequence + document index``. ``metrics``: names in
    :mod:`geolens.metrics` (None = every registered metric).

    >>> import geolens
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")  # 2 layers, 4 query heads sharing 2 kv heads
    >>> protocol = geolens.MaskingConfig(fractions=(0.1, 0.5), skip_prefix=4)
    >>> res = geolens.faithfulness_curves(model, tiny_tokens(model, length=16), protocol,
    ...                                   metrics=["raw_attention", "contribution", "random"], progress=False, n_boot=50)
    >>> res.range_check()["has_range"], sorted(set(res.pairs().verdict))  # a random 2-layer model moves PPL < 1 %
    (False, ['no range'])
    """
    metrics = metric_names() if metrics is None else metrics
    check_metric_names(metrics)
    protocol.check_curve()
    if tokens.ndim != 2 or tokens.shape[1] < 3:
        raise ValueError(f"tokens must be [n_sequences, pos ≥ 3], got shape {tuple(tokens.shape)}")
    n_pos = tokens.shape[1]
    n_scored = n_pos - 1 - protocol.skip_prefix
    if n_scored < 1:
        raise ValueError(f"skip_prefix={protocol.skip_prefix} leaves no prediction to score in {n_pos} tokens")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be ≥ 1, got {chunk_size}")
    layers = protocol.resolved_layers(model)
    require_pattern_hooks(model, layers)
    n_heads = model.cfg.n_heads
    rows, clean_rows = [], []
    for s in tqdm(range(tokens.shape[0]), desc="faithfulness", disable=not progress):
        seq = tokens[s : s + 1]
        doc = first_sequence + s
        with torch.no_grad():
            logits, cache = model.run_with_cache(seq, names_filter=names_filter(model, layers))
        clean_nll = token_nll(logits, seq)[0, protocol.skip_prefix :]
        del logits
        scores = metric_scores(model, seq, protocol, metrics, seed=seed + doc, cache=cache)
        del cache
        ranks, alias = {}, {}
        if same_ranking_by_construction(protocol):  # e.g. output-normalised reuses value-weighted
            twins = {m: get_metric(m).same_ranking_as for m in metrics}
            alias.update({m: t for m, t in twins.items() if t is not None and t in metrics})
        for m in metrics:
            if m in alias:
                continue
            r = ranked_removals(scores[m], protocol)
            same = next((o for o, ro in ranks.items() if all(torch.equal(r[d][0], ro[d][0]) for d in DIRECTIONS)), None)
            if same is not None:
                alias[m] = same
            else:
                ranks[m] = r
        del scores
        jobs = [(m, d, k) for m in ranks for d in DIRECTIONS for k in protocol.fractions] + [("sink_only", None, None)]
        results: dict = {}
        for start in range(0, len(jobs), chunk_size):
            chunk = jobs[start : start + chunk_size]
            masks = []
            for m, d, k in chunk:
                mk = sink_only_mask(len(layers), n_pos) if m == "sink_only" else mask_from_ranks(*ranks[m][d], k)
                masks.append(mk.expand(len(layers), 1, n_heads, n_pos, n_pos))
            remove = torch.cat(masks, dim=1)
            nll = masked_token_nll(model, seq, remove, layers, chunk_size=len(chunk), n_scored=n_scored)
            removed = remove.flatten(2).sum(-1).sum(0)
            for (m, d, k), row_nll, r in zip(chunk, nll, removed):
                results[m, d, k] = (float(row_nll.double().mean()), int(r))
            del remove, masks
        clean_rows.append(
            dict(
                sequence=doc,
                nll=float(clean_nll.double().mean()),
                n_scored=int(clean_nll.numel()),
                sink_nll=results["sink_only", None, None][0],
            )
        )
        for m in metrics:
            src = alias.get(m, m)
            for d in DIRECTIONS:
                for k in protocol.fractions:
                    v, r = results[src, d, k]
                    rows.append(
                        dict(
                            sequence=doc,
                            metric=m,
                            direction=d,
                            fraction=k,
                            nll=v,
                            n_removed=r,
                            same_as=alias.get(m, ""),
                        )
                    )
    meta = dict(
        n_sequences=int(tokens.shape[0]),
        seq_len=int(n_pos),
        metrics=list(metrics),
        seed=seed,
        model=getattr(model.cfg, "model_name", "?"),
    )
    return FaithfulnessResult(
        protocol=protocol.to_dict(model),
        per_sequence=pd.DataFrame(rows),
        clean=pd.DataFrame(clean_rows),
        meta=meta,
        n_boot=n_boot,
    )
