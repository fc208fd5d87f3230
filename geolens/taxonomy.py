"""The parameter-free Retriever / Mixer / Reset head taxonomy (docs/method.md §6, paper B).

For head h of layer l and query i (over the visible sources j ≤ i), the *winner* is the source
with the largest attention-scaled value norm

    w_i = argmax_{j ≤ i} α_ij ‖v_j‖          (ties: the smallest index j, as ``torch.argmax``)

with v the value vector before W_O (``space="value"``, paper B) or the projected value
ṽ_j = v_j W_O (``space="projected"``). Per head the winners are counted as

- sink: w_i = 0 (the first position, BOS);
- current: w_i = i (the query's own token);
- other: any other source (distributed selection).

The head's regime is its largest share: sink → **Mixer**, current → **Retriever**,
other → **Reset**. There is no threshold. Exact ties between shares (rare with many queries) are
broken in the order sink, current, other.

Query 0 sees only itself (its winner is both the sink and the current token), so it is left out
by default (``skip_first_query=True``); queries 1 … T−1 of every window count.

Besides the shares, each head reports its mean *sink alignment* cos(o_i, u_0) and mean
*current-token alignment* cos(o_i, u_i), averaged over the same queries, where o_i = Σ_j α_ij u_j
is the head's output and u the value vector of the chosen space (paper A's alignment factor,
docs/method.md §1, in paper B's space). Paper B's exact taxonomy rule and numbers are not confirmed
(docs/method.md §6); this module implements the rule as docs/method.md §6 writes it.

Corpus statistics stream through :class:`TaxonomyAnalysis` (a
:class:`geolens.streaming.CorpusAnalysis` run by :func:`geolens.runner.run_corpus`);
:func:`head_taxonomy` is the one-call entry point and :func:`compare_taxonomies` measures the
stability of the regimes across two corpora.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from geolens.adapter import PATTERN, VALUE, get_attention_layer, hook_name, model_mode
from geolens.streaming import CorpusAnalysis, Moments, Sum

Space = Literal["value", "projected"]
WINNER_KINDS = ("sink", "current", "other")
REGIMES = ("Mixer", "Retriever", "Reset")  # same order as WINNER_KINDS
REGIME_OF_KIND = dict(zip(WINNER_KINDS, REGIMES))


def _check_space(space: str) -> None:
    if space not in ("value", "projected"):
        raise ValueError(f"space must be 'value' (α‖v‖, paper B) or 'projected' (α‖vW_O‖), got {space!r}")


def value_norms(layer, space: Space = "value") -> Float[Tensor, "batch head key"]:
    """‖v_j^h‖ (value space) or ‖ṽ_j^h‖ = ‖v_j^h W_O^h‖ (projected space)."""
    _check_space(space)
    if space == "value":
        return layer.v.norm(dim=-1).transpose(1, 2)
    from geolens.contributions import projected_value_norms

    return projected_value_norms(layer)


def winners(
    pattern: Float[Tensor, "batch head query key"], norms: Float[Tensor, "batch head key"]
) -> Int[Tensor, "batch head query"]:
    """w_i = argmax_{j ≤ i} α_ij ‖v_j‖ (the first maximal j on ties; causal sources only)."""
    if pattern.ndim != 4 or norms.ndim != 3 or pattern.shape[:2] != norms.shape[:2] or pattern.shape[-1] != norms.shape[-1]:
        raise ValueError(
            f"winners needs pattern [batch, head, query, key] and norms [batch, head, key], got "
            f"{tuple(pattern.shape)} and {tuple(norms.shape)}"
        )
    n_q, n_k = pattern.shape[-2:]
    score = pattern * norms[:, :, None, :]
    offset = n_k - n_q  # queries are the last n_q positions
    visible = torch.arange(n_k, device=score.device)[None, :] <= (torch.arange(n_q, device=score.device)[:, None] + offset)
    score = score.masked_fill(~visible, float("-inf"))
    return score.argmax(dim=-1)


def winner_kinds(win: Int[Tensor, "batch head query"], *, query_offset: int = 0) -> Int[Tensor, "batch head query"]:
    """0 = sink (w_i = 0), 1 = current (w_i = i), 2 = other; query q is position q + offset."""
    pos = torch.arange(win.shape[-1], device=win.device) + query_offset
    kind = torch.full_like(win, 2)
    kind = torch.where(win == pos, torch.ones_like(win), kind)
    return torch.where(win == 0, torch.zeros_like(win), kind)


def _alignments(layer, space: Space) -> tuple[Tensor, Tensor]:
    """cos(o_i, u_0) and cos(o_i, u_i), [batch, head, query], with o_i = Σ_j α_ij u_j."""
    u = layer.v  # [b, k, h, d]
    z = layer.z  # [b, q, h, d]
    if space == "projected":
        gram = torch.einsum("hdm,hem->hde", layer.W_O, layer.W_O)
        zg = torch.einsum("bqhd,hde->bqhe", z, gram)
        ug = torch.einsum("bkhd,hde->bkhe", u, gram)
    else:
        zg, ug = z, u
    z_norm = torch.einsum("bqhd,bqhd->bhq", zg, z).clamp_min(0).sqrt()
    u_norm = torch.einsum("bkhd,bkhd->bhk", ug, u).clamp_min(0).sqrt()
    dot_sink = torch.einsum("bqhd,bhd->bhq", zg, u[:, 0])
    n_q = z.shape[1]
    dot_cur = torch.einsum("bqhd,bqhd->bhq", zg, u[:, -n_q:])
    eps = 1e-12
    cos_sink = dot_sink / (z_norm * u_norm[:, :, :1] + eps)
    cos_cur = dot_cur / (z_norm * u_norm[:, :, -n_q:] + eps)
    return cos_sink, cos_cur


class TaxonomyAnalysis(CorpusAnalysis):
    """Streams winner counts and alignments per (layer, head) over a corpus (docs/method.md §6).

    State: ``counts`` (a :class:`Sum` ``[layer, head, 3]``: sink, current, other winners) and
    ``sink_alignment`` / ``current_alignment`` (:class:`Moments` ``[layer, head]``).
    """

    def __init__(self, n_layers: int, n_heads: int, *, space: Space = "value", skip_first_query: bool = True):
        _check_space(space)
        self.n_layers, self.n_heads = n_layers, n_heads
        self.space = space
        self.skip_first_query = skip_first_query
        self.counts = Sum((n_layers, n_heads, 3))
        self.sink_alignment = Moments((n_layers, n_heads))
        self.current_alignment = Moments((n_layers, n_heads))
        self.model_mode = ""

    @classmethod
    def for_model(cls, model, **kwargs) -> "TaxonomyAnalysis":
        return cls(model.cfg.n_layers, model.cfg.n_heads, **kwargs)

    def hook_names(self, model) -> list[str]:
        return [hook_name(l, n) for l in range(self.n_layers) for n in (PATTERN, VALUE)]

    def update(self, model, cache, tokens) -> None:
        self.model_mode = model_mode(model)
        start = 1 if self.skip_first_query else 0
        sink_cos, cur_cos = [], []
        for l in range(self.n_layers):
            layer = get_attention_layer(model, cache, l)
            if layer.pattern.shape[2] <= start:
                raise ValueError("the taxonomy needs windows of at least 2 tokens")
            kinds = winner_kinds(winners(layer.pattern, value_norms(layer, self.space)))[:, :, start:]
            onehot = torch.nn.functional.one_hot(kinds, 3).to(torch.float64)  # [b, h, q, 3]
            self.counts.total[l] += onehot.sum(dim=(0, 2)).cpu()
            cos_sink, cos_cur = _alignments(layer, self.space)
            sink_cos.append(cos_sink[:, :, start:])
            cur_cos.append(cos_cur[:, :, start:])
        # samples: every (batch, query), elementwise over [layer, head]
        for acc, xs in ((self.sink_alignment, sink_cos), (self.current_alignment, cur_cos)):
            x = torch.stack(xs, dim=0)  # [layer, b, h, q]
            acc.update(x.permute(1, 3, 0, 2).reshape(-1, self.n_layers, self.n_heads), dim=0)

    def merge(self, other: "TaxonomyAnalysis") -> "TaxonomyAnalysis":
        if (other.n_layers, other.n_heads, other.space) != (self.n_layers, self.n_heads, self.space):
            raise ValueError("cannot merge taxonomy analyses of different shapes or spaces")
        self.counts.merge(other.counts)
        self.sink_alignment.merge(other.sink_alignment)
        self.current_alignment.merge(other.current_alignment)
        self.model_mode = self.model_mode or other.model_mode
        return self

    def result(self) -> "TaxonomyResult":
        return taxonomy_from_counts(
            self.counts.total,
            sink_alignment=self.sink_alignment.mean,
            current_alignment=self.current_alignment.mean,
            space=self.space,
            model_mode=self.model_mode,
        )


@dataclass
class TaxonomyResult:
    """Per-head shares and regimes.

    - ``table``: one row per (layer, head) with ``layer, head, n_queries, share_sink,
      share_current, share_other, regime, mean_sink_alignment, mean_current_alignment``;
    - ``regimes``: ``[layer, head]`` numpy array of regime names;
    - ``distribution``: regime → share of heads (all three regimes, zeros included).
    """

    table: pd.DataFrame
    regimes: np.ndarray
    space: str = "value"
    model_mode: str = ""
    distribution: dict[str, float] = field(default_factory=dict)

    def shares(self) -> np.ndarray:
        """``[layer, head, 3]`` winner shares (sink, current, other)."""
        n_layers, n_heads = self.regimes.shape
        cols = ["share_sink", "share_current", "share_other"]
        return self.table.sort_values(["layer", "head"])[cols].to_numpy().reshape(n_layers, n_heads, 3)

    def per_layer(self) -> pd.DataFrame:
        """Count of heads of each regime per layer."""
        out = pd.crosstab(self.table["layer"], self.table["regime"]).reindex(columns=list(REGIMES), fill_value=0)
        return out


def regimes_from_shares(shares: Float[Tensor, "... 3"]) -> np.ndarray:
    """Largest share → regime name (ties: sink, then current, then other)."""
    idx = torch.as_tensor(shares).argmax(dim=-1).cpu().numpy()
    return np.asarray(REGIMES, dtype=object)[idx]


def taxonomy_from_counts(
    counts: Float[Tensor, "layer head 3"],
    *,
    sink_alignment: Tensor | None = None,
    current_alignment: Tensor | None = None,
    space: str = "value",
    model_mode: str = "",
) -> TaxonomyResult:
    """Build the per-head table from winner counts ``[layer, head, (sink, current, other)]``."""
    counts = torch.as_tensor(counts, dtype=torch.float64)
    if counts.ndim != 3 or counts.shape[-1] != 3:
        raise ValueError(f"counts must be [layer, head, 3], got {tuple(counts.shape)}")
    total = counts.sum(-1, keepdim=True)
    if bool((total == 0).any()):
        raise ValueError("some heads have no counted query: run the analysis on at least one batch")
    shares = counts / total
    regimes = regimes_from_shares(shares)
    n_layers, n_heads, _ = counts.shape
    nan = torch.full((n_layers, n_heads), float("nan"), dtype=torch.float64)
    sa = nan if sink_alignment is None else torch.as_tensor(sink_alignment, dtype=torch.float64)
    ca = nan if current_alignment is None else torch.as_tensor(current_alignment, dtype=torch.float64)
    layer_idx, head_idx = np.meshgrid(np.arange(n_layers), np.arange(n_heads), indexing="ij")
    table = pd.DataFrame(
        {
            "layer": layer_idx.ravel(),
            "head": head_idx.ravel(),
            "n_queries": total[..., 0].reshape(-1).numpy().astype(np.int64),
            "share_sink": shares[..., 0].reshape(-1).numpy(),
            "share_current": shares[..., 1].reshape(-1).numpy(),
            "share_other": shares[..., 2].reshape(-1).numpy(),
            "regime": regimes.reshape(-1),
            "mean_sink_alignment": sa.reshape(-1).numpy(),
            "mean_current_alignment": ca.reshape(-1).numpy(),
        }
    )
    distribution = {r: float((regimes == r).mean()) for r in REGIMES}
    return TaxonomyResult(table=table, regimes=regimes, space=space, model_mode=model_mode, distribution=distribution)


def head_taxonomy(
    model,
    tokens: Int[Tensor, "batch seq"],
    batch_size: int = 8,
    *,
    space: Space = "value",
    skip_first_query: bool = True,
    progress: bool = False,
) -> TaxonomyResult:
    """Regime of every head over the windows ``tokens`` ``[n, seq]`` (BOS first, unpadded).

    Example::

        tax = geolens.taxonomy.head_taxonomy(model, corpus_windows(model, "lee", 128, 200))
        tax.table.query("regime == 'Retriever'")
    """
    from geolens.runner import run_corpus

    if tokens.ndim != 2 or tokens.shape[1] < 2:
        raise ValueError(f"tokens must be [n, seq] with seq ≥ 2, got {tuple(tokens.shape)}")
    analysis = TaxonomyAnalysis.for_model(model, space=space, skip_first_query=skip_first_query)
    run_corpus(model, tokens, [analysis], batch_size=batch_size, progress=progress, desc="taxonomy")
    return analysis.result()


def compare_taxonomies(a: TaxonomyResult, b: TaxonomyResult, names: tuple[str, str] = ("a", "b")) -> dict:
    """Stability of the regimes across two corpora (same model).

    Returns ``agreement`` (share of heads with the same regime), ``n_heads``, ``distribution``
    (a DataFrame: regime × corpus share of heads, side by side), ``confusion`` (regime in ``a`` ×
    regime in ``b``, head counts) and ``share_correlation`` (Pearson r of each winner share over
    heads between the corpora).
    """
    if a.regimes.shape != b.regimes.shape:
        raise ValueError(f"the two taxonomies cover different heads: {a.regimes.shape} vs {b.regimes.shape}")
    agree = float((a.regimes == b.regimes).mean())
    dist = pd.DataFrame({names[0]: pd.Series(a.distribution), names[1]: pd.Series(b.distribution)}).reindex(list(REGIMES))
    confusion = pd.crosstab(
        pd.Categorical(a.regimes.ravel(), categories=list(REGIMES)),
        pd.Categorical(b.regimes.ravel(), categories=list(REGIMES)),
        rownames=[names[0]],
        colnames=[names[1]],
        dropna=False,
    )
    sa, sb = a.shares(), b.shares()
    corr = {}
    for k, kind in enumerate(WINNER_KINDS):
        x, y = sa[..., k].ravel(), sb[..., k].ravel()
        corr[kind] = float(np.corrcoef(x, y)[0, 1]) if x.std() > 0 and y.std() > 0 else float("nan")
    return {"agreement": agree, "n_heads": int(a.regimes.size), "distribution": dist, "confusion": confusion, "share_correlation": corr}
