"""Head pruning by regime and a single-head sensitivity scan (docs/method.md §6; Mudarisov et al. 2026).

Heads are ablated at ``hook_z`` (:mod:`geolens.interventions.ablation`, zero or mean) in a fixed
*order*, down to retention levels 90 % … 10 % of all heads; at retention r the first
round((1 − r) · N) heads of the order are ablated. ΔPPL = PPL(pruned) − PPL(full), with the
corpus perplexity exp(mean NLL over every next-token prediction of the evaluation windows).

Orders (first pruned first):

- ``regime``: **Reset** heads first, then **Mixer**, **Retrievers** last (regimes of
  :func:`geolens.taxonomy.head_taxonomy`); within a regime, heads with the smaller
  ``share_current`` (the less Retriever-like) first, then by (layer, head).
- ``weight``: ascending ‖W_V^h‖_F · ‖W_O^h‖_F (with grouped-query attention, W_V of the kv head
  that query head h reads).
- ``entropy``: descending mean attention entropy H_i^h = −Σ_j α_ij log α_ij over queries i ≥ 1
  (diffuse heads first, focused heads last).
- ``random_<seed>``: a uniformly random permutation per seed.

:func:`head_sensitivity` ablates each head alone and reports ΔPPL as a ``[layer, head]`` map with
robust z-scores z = (x − median) / (1.4826 · MAD); |z| > 3.5 flags a critical head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from geolens.adapter import PATTERN, adapter_for, hook_name
from geolens.data import batches
from geolens.interventions.ablation import AblationMode, head_ablation_hooks
from geolens.interventions.base import applied
from geolens.interventions.masking import branch_hook, last_predictions_hook, tail_nll
from geolens.streaming import CorpusAnalysis, Moments

RETENTION = tuple(round(0.1 * k, 1) for k in range(9, 0, -1))
REGIME_PRUNE_ORDER = ("Reset", "Mixer", "Retriever")
Head = tuple[int, int]


# ---------------------------------------------------------------------------------------------
# Head scores


def weight_magnitude(model) -> Float[Tensor, "layer head"]:
    """‖W_V^h‖_F · ‖W_O^h‖_F per head (GQA: the Frobenius norm of the kv head's W_V).

    ``W_V`` and ``W_O`` are read through the adapter (:meth:`geolens.adapter.ModelAdapter.value_weights`),
    which maps a kv-head layout to query heads with h // (n_heads / n_kv_heads).
    """
    cfg = model.cfg
    adapter = adapter_for(model)
    out = torch.zeros(cfg.n_layers, cfg.n_heads)
    for l in range(cfg.n_layers):
        W_V, _ = adapter.value_weights(l)
        W_O, _ = adapter.output_weights(l)
        out[l] = W_V.detach().float().flatten(1).norm(dim=-1) * W_O.detach().float().flatten(1).norm(dim=-1)
    return out


class AttentionEntropy(CorpusAnalysis):
    """Mean attention entropy −Σ_j α_ij log α_ij per (layer, head) over queries i ≥ 1 (nats)."""

    def __init__(self, n_layers: int, n_heads: int):
        self.moments = Moments((n_layers, n_heads))
        self.n_layers = n_layers

    def hook_names(self, model) -> list[str]:
        return [hook_name(l, PATTERN) for l in range(self.n_layers)]

    def update(self, model, cache, tokens) -> None:
        per_layer = []
        for l in range(self.n_layers):
            a = cache[hook_name(l, PATTERN)][:, :, 1:].double()  # [b, h, q ≥ 1, k]
            h = -(torch.where(a > 0, a * a.log(), torch.zeros_like(a))).sum(-1)  # [b, h, q]
            per_layer.append(h.permute(0, 2, 1).reshape(-1, h.shape[1]))  # [b·q, h]
        self.moments.update(torch.stack(per_layer, dim=1), dim=0)  # samples [b·q, layer, head]

    def merge(self, other: "AttentionEntropy") -> "AttentionEntropy":
        self.moments.merge(other.moments)
        return self

    def result(self) -> Float[Tensor, "layer head"]:
        return self.moments.mean.float()


def attention_entropy(
    model, tokens: Int[Tensor, "n seq"], *, batch_size: int = 8, progress: bool = False
) -> Float[Tensor, "layer head"]:
    """Mean attention entropy per head over ``tokens`` (streamed, :class:`AttentionEntropy`)."""
    from geolens.runner import run_analysis

    return run_analysis(
        model,
        tokens,
        AttentionEntropy,
        model.cfg.n_layers,
        model.cfg.n_heads,
        batch_size=batch_size,
        progress=progress,
        desc="entropy",
    )


# ---------------------------------------------------------------------------------------------
# Orders


def order_by_score(score: Float[Tensor, "layer head"], *, descending: bool = False) -> list[Head]:
    """Heads sorted by score (ties by layer, then head)."""
    n_layers, n_heads = score.shape
    flat = score.flatten().double()
    idx = torch.sort(-flat if descending else flat, stable=True).indices.tolist()
    return [(i // n_heads, i % n_heads) for i in idx]


def regime_order(
    table: pd.DataFrame, *, regimes: Sequence[str] = REGIME_PRUNE_ORDER, tie_break: str = "share_current"
) -> list[Head]:
    """Reset → Mixer → Retriever (``regimes``), ascending ``tie_break`` within a regime.

    ``table`` has one row per head with columns ``layer, head, regime`` and ``tie_break`` (the
    ``.table`` of :func:`geolens.taxonomy.head_taxonomy`).
    """
    missing = {"layer", "head", "regime", tie_break} - set(table.columns)
    if missing:
        raise ValueError(f"taxonomy table lacks columns {sorted(missing)}")
    unknown = set(table["regime"]) - set(regimes)
    if unknown:
        raise ValueError(f"regimes {sorted(unknown)} are not in the pruning order {list(regimes)}")
    rank = {r: n for n, r in enumerate(regimes)}
    t = table.assign(_rank=table["regime"].map(rank))
    t = t.sort_values(["_rank", tie_break, "layer", "head"], kind="stable")
    return [(int(l), int(h)) for l, h in zip(t["layer"], t["head"])]


def random_order(n_layers: int, n_heads: int, seed: int) -> list[Head]:
    g = torch.Generator().manual_seed(int(seed))
    return [(int(i) // n_heads, int(i) % n_heads) for i in torch.randperm(n_layers * n_heads, generator=g)]


def pruning_orders(
    model,
    tokens: Int[Tensor, "n seq"],
    *,
    taxonomy_table: pd.DataFrame | None = None,
    entropy: Tensor | None = None,
    seeds: Sequence[int] = (0, 1, 2),
    batch_size: int = 8,
) -> dict[str, list[Head]]:
    """All orders of the module docstring; the taxonomy and entropy are computed on ``tokens``
    unless given.

    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")  # 2 layers × 4 heads
    >>> orders = pruning_orders(model, tiny_tokens(model, length=16), seeds=(0,))
    >>> every_head = [(l, h) for l in range(2) for h in range(4)]
    >>> list(orders), sorted(orders["regime"]) == sorted(orders["random_0"]) == every_head
    (['regime', 'weight', 'entropy', 'random_0'], True)
    """
    cfg = model.cfg
    if taxonomy_table is None:
        from geolens.taxonomy import head_taxonomy

        taxonomy_table = head_taxonomy(model, tokens, batch_size=batch_size).table
    if entropy is None:
        entropy = attention_entropy(model, tokens, batch_size=batch_size)
    orders = {
        "regime": regime_order(taxonomy_table),
        "weight": order_by_score(weight_magnitude(model)),
        "entropy": order_by_score(entropy, descending=True),
    }
    for s in seeds:
        orders[f"random_{s}"] = random_order(cfg.n_layers, cfg.n_heads, s)
    return orders


def n_pruned(retention: float, n_total: int) -> int:
    """round((1 − retention) · N), half up."""
    if not 0.0 <= retention <= 1.0:
        raise ValueError(f"retention must be in [0, 1], got {retention}")
    return int(np.floor((1.0 - retention) * n_total + 0.5))


# ---------------------------------------------------------------------------------------------
# Evaluation


def corpus_nll(
    model, tokens: Int[Tensor, "n seq"], fwd_hooks=(), *, batch_size: int = 8, n_scored: int | None = None
) -> float:
    """Mean next-token NLL over the predictions of ``tokens`` (the last ``n_scored`` of each
    window, all by default), with ``fwd_hooks`` applied."""
    total, count = 0.0, 0
    tail = [] if n_scored is None else [last_predictions_hook(model, tokens.shape[1], n_scored)]
    with torch.no_grad(), applied(model, list(fwd_hooks) + tail):
        for batch in batches(tokens, batch_size):
            nll = tail_nll(model(batch, return_type="logits"), batch)
            total += float(nll.double().sum())
            count += nll.numel()
    return total / count


def pruning_curves(
    model,
    tokens: Int[Tensor, "n seq"],
    orders: Mapping[str, Sequence[Head]],
    retention: Sequence[float] = RETENTION,
    *,
    mode: AblationMode = "mean",
    means: Tensor | None = None,
    batch_size: int = 8,
    n_scored: int | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """ΔPPL per order and retention level: rows ``order, retention, n_pruned, ppl, delta_ppl``.

    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")  # 8 heads
    >>> tokens = tiny_tokens(model, length=16)
    >>> orders = pruning_orders(model, tokens, seeds=(0,))
    >>> curves = pruning_curves(model, tokens, orders, (0.5,), mode="zero", progress=False)  # 4 of 8 heads zeroed
    >>> curves[["order", "retention", "n_pruned"]].values.tolist()
    [['regime', 0.5, 4], ['weight', 0.5, 4], ['entropy', 0.5, 4], ['random_0', 0.5, 4]]
    """
    cfg = model.cfg
    n_total = cfg.n_layers * cfg.n_heads
    clean = float(np.exp(corpus_nll(model, tokens, batch_size=batch_size, n_scored=n_scored)))
    rows = []
    jobs = [(name, r) for name in orders for r in retention]
    for name, r in tqdm(jobs, desc="pruning", disable=not progress):
        order = list(orders[name])
        if len(order) != n_total or len(set(order)) != n_total:
            raise ValueError(f"order {name!r} must list each of the {n_total} heads once")
        k = n_pruned(r, n_total)
        hooks = head_ablation_hooks(model, order[:k], mode, means) if k else []
        ppl = float(np.exp(corpus_nll(model, tokens, hooks, batch_size=batch_size, n_scored=n_scored)))
        rows.append(
            dict(order=name, retention=r, n_pruned=k, ppl=ppl, delta_ppl=ppl - clean, clean_ppl=clean, mode=mode)
        )
    return pd.DataFrame(rows)


def robust_z(x) -> np.ndarray:
    """(x − median) / (1.4826 · MAD); zero MAD gives ±inf for values off the median, 0 on it."""
    x = np.asarray(x, dtype=np.float64)
    med = np.median(x)
    mad = 1.4826 * np.median(np.abs(x - med))
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (x - med) / mad
    return np.where(x == med, 0.0, z)


@dataclass
class SensitivityResult:
    """Single-head ablation ΔPPL ``[layer, head]``, robust z-scores and the flagged heads."""

    delta_ppl: np.ndarray
    z: np.ndarray
    clean_ppl: float
    mode: str
    threshold: float = 3.5

    @property
    def table(self) -> pd.DataFrame:
        n_layers, n_heads = self.delta_ppl.shape
        l, h = np.meshgrid(np.arange(n_layers), np.arange(n_heads), indexing="ij")
        return pd.DataFrame(
            dict(
                layer=l.ravel(),
                head=h.ravel(),
                delta_ppl=self.delta_ppl.ravel(),
                robust_z=self.z.ravel(),
                critical=np.abs(self.z.ravel()) > self.threshold,
            )
        )

    @property
    def critical(self) -> pd.DataFrame:
        t = self.table
        return t[t.critical].sort_values("delta_ppl", ascending=False).reset_index(drop=True)


def head_sensitivity(
    model,
    tokens: Int[Tensor, "n seq"],
    *,
    mode: AblationMode = "mean",
    means: Tensor | None = None,
    threshold: float = 3.5,
    n_scored: int | None = None,
    progress: bool = True,
) -> SensitivityResult:
    """Ablate each head alone; ΔPPL per head (``[layer, head]``) with robust z-score outliers.

    Batched per (sequence, layer): the sequence is expanded to n_heads rows at that layer's
    ``hook_resid_pre`` (the earlier layers run once) and copy h ablates head h, so the scan costs
    about (n_layers + 1) / 2 · n_heads / n_layers + 1/2 forwards of n_heads rows per layer.
    """
    cfg = model.cfg
    H = cfg.n_heads
    clean_nll = corpus_nll(model, tokens, n_scored=n_scored)
    tail = [] if n_scored is None else [last_predictions_hook(model, tokens.shape[1], n_scored)]
    nll_sum = torch.zeros(cfg.n_layers, H, dtype=torch.float64)
    count = 0
    table = {"rows": torch.eye(H, dtype=torch.bool)}  # row h ablates head h
    with torch.no_grad():
        for s in tqdm(range(tokens.shape[0]), desc="sensitivity", disable=not progress):
            seq = tokens[s : s + 1]
            count += n_scored or seq.shape[1] - 1
            target = seq.expand(H, -1)
            for l in range(cfg.n_layers):
                hooks = (
                    [branch_hook(model, l, H)]
                    + list(head_ablation_hooks(model, {l: table["rows"]}, mode, means))
                    + tail
                )
                with applied(model, hooks):
                    nll = tail_nll(model(seq, return_type="logits"), target)  # [H, scored]
                nll_sum[l] += nll.double().sum(-1)
    clean_ppl = float(np.exp(clean_nll))
    delta = np.exp((nll_sum / count).numpy()) - clean_ppl
    return SensitivityResult(
        delta_ppl=delta,
        z=robust_z(delta.ravel()).reshape(delta.shape),
        clean_ppl=clean_ppl,
        mode=mode,
        threshold=threshold,
    )
