"""The parameter-free Retriever / Mixer / Reset head taxonomy (docs/method.md §6; Mudarisov et al. 2026).

For head h of layer l and query i (over the visible sources j ≤ i), the *winner* is the source
with the largest attention-scaled value norm

    w_i = argmax_{j ≤ i} α_ij ‖v_j‖          (ties: the smallest index j, as ``torch.argmax``)

with v the value vector before W_O (``space="value"``, as in Mudarisov et al. 2026) or the projected value
ṽ_j = v_j W_O (``space="projected"``). Per head the winners are counted as

- sink: w_i = 0 (the first position, BOS);
- current: w_i = i (the query's own token);
- other: any other source (distributed selection).

The head's regime is its largest share: sink → **Mixer**, current → **Retriever**,
other → **Reset**. There is no threshold. Exact ties between shares (rare with many queries) are
broken in the order sink, current, other.

Query 0 sees only itself (its winner is both the sink and the current token), so it is left out
by default (``skip_first_query=True``); queries 1 … T−1 of every window count
(``queries="all"``), or only the final query T−1 of each window (``queries="final"``, the
authors' protocol); the choice is recorded with the result.

**Relative offsets.** "Other" lumps together every winner that is neither the sink nor the
current token, so a previous-token head (w_i = i − 1 for most i) is a Reset head although one
source dominates. Each head therefore also reports the distribution of the relative offset
d = w_i − i (< 0) over its "other" winners (streamed exactly as a histogram over i − w_i), its
most frequent offset ``top_offset`` (ties: the offset nearest the query), that offset's count,
its share of all the head's counted queries (``top_offset_share``) and of its "other" winners
(``top_offset_share_of_other``). A head whose single offset wins more than half of all its
counted queries (``top_offset_share > 0.5``; such a head is necessarily Reset) is flagged
``offset_dominant`` and labelled e.g. ``"Reset (offset −1, 83 %)"`` in the ``label`` column
(otherwise ``label`` is the regime). The three regimes themselves are unchanged.

**Window length.** Causal attention makes query i's winner independent of the tokens after i,
so the prefix of length P of a window is a window of length P. ``prefix_lengths`` (default
16, 32, 64, 128) re-counts the winners on those prefixes of the same windows (all queries
1 … P−1, or the final query P−1), which shows how much the regime shares depend on the window
length (:meth:`TaxonomyResult.by_length`); prefixes longer than a window are skipped.

**Sliding-window layers** (:mod:`geolens.visibility`): winners are taken over the true visible
set T_i = {max(0, i−W+1) … i} of a local layer. A query i ≥ W cannot see the sink, so its winner
is never "sink"; it is still counted (current or other), and the number of such out-of-window
queries is reported per head (``n_out_of_window``). Its sink alignment cos(o_i, u_0) is left
out of the mean (the sink is not among its sources).

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

from geolens.adapter import PATTERN, VALUE, get_attention_layer, hook_name, model_mode, sliding_window
from geolens.geometry import gram, gram_cosine, projected_value_norms
from geolens.streaming import CorpusAnalysis, Moments, Sum
from geolens.validation import check_choice
from geolens.visibility import sink_visible, visible_keys

Space = Literal["value", "projected"]
WINNER_KINDS = ("sink", "current", "other")
REGIMES = ("Mixer", "Retriever", "Reset")  # same order as WINNER_KINDS


SPACES = {"value": "α‖v‖, as in Mudarisov et al. 2026", "projected": "α‖vW_O‖"}


def _check_space(space: str) -> None:
    check_choice(space, SPACES, name="space")


def value_norms(layer, space: Space = "value") -> Float[Tensor, "batch head key"]:
    """‖v_j^h‖ (value space) or ‖ṽ_j^h‖ = ‖v_j^h W_O^h‖ (projected space).

    >>> import geolens
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")
    >>> _, cache = model.run_with_cache(tiny_tokens(model), names_filter=geolens.names_filter(model))
    >>> layer = geolens.get_attention_layer(model, cache, 1)
    >>> tuple(value_norms(layer).shape), torch.allclose(value_norms(layer, "projected"), projected_value_norms(layer))
    ((2, 4, 20), True)
    """
    _check_space(space)
    if space == "value":
        return layer.v.norm(dim=-1).transpose(1, 2)
    return projected_value_norms(layer)


def winners(
    pattern: Float[Tensor, "batch head query key"],
    norms: Float[Tensor, "batch head key"],
    *,
    window: int | None = None,
) -> Int[Tensor, "batch head query"]:
    """w_i = argmax_{j ∈ T_i} α_ij ‖v_j‖ (the first maximal j on ties) over the visible sources
    T_i (causal; within the sliding ``window`` of a local layer, :mod:`geolens.visibility`).

    >>> pattern = torch.tensor([[[[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.2, 0.3, 0.5]]]])  # [batch, head, query, key]
    >>> winners(pattern, torch.tensor([[[1.0, 3.0, 1.0]]]))  # ‖v_1‖ = 3 outweighs query 2's attention to itself
    tensor([[[0, 1, 1]]])
    """
    if (
        pattern.ndim != 4
        or norms.ndim != 3
        or pattern.shape[:2] != norms.shape[:2]
        or pattern.shape[-1] != norms.shape[-1]
    ):
        raise ValueError(
            f"winners needs pattern [batch, head, query, key] and norms [batch, head, key], got "
            f"{tuple(pattern.shape)} and {tuple(norms.shape)}"
        )
    n_q, n_k = pattern.shape[-2:]
    score = pattern * norms[:, :, None, :]
    visible = visible_keys(n_q, n_k, window, device=score.device)
    score = score.masked_fill(~visible, float("-inf"))
    return score.argmax(dim=-1)


def winner_kinds(win: Int[Tensor, "batch head query"], *, query_offset: int = 0) -> Int[Tensor, "batch head query"]:
    """0 = sink (w_i = 0), 1 = current (w_i = i), 2 = other; query q is position q + offset."""
    pos = torch.arange(win.shape[-1], device=win.device) + query_offset
    kind = torch.full_like(win, 2)
    kind = torch.where(win == pos, torch.ones_like(win), kind)
    return torch.where(win == 0, torch.zeros_like(win), kind)


def offset_counts(
    win: Int[Tensor, "batch head query"],
    kinds: Int[Tensor, "batch head query"],
    positions: Int[Tensor, "query"],
    size: int,
) -> Float[Tensor, "head size"]:
    """Counts ``[head, size]`` of i − w_i (index k ↔ offset −k) over the "other" winners (kind 2)."""
    back = (positions[None, None, :] - win).to(torch.int64)  # i − w_i ≥ 1 for "other"
    other = kinds == 2
    n_heads = win.shape[1]
    head = torch.arange(n_heads, device=win.device)[None, :, None].expand_as(win)
    flat = (head * size + back.clamp(0, size - 1))[other]
    return torch.bincount(flat.cpu(), minlength=n_heads * size).reshape(n_heads, size).to(torch.float64)


def _alignments(layer, space: Space, window: int | None = None) -> tuple[Tensor, Tensor]:
    """cos(o_i, u_0) and cos(o_i, u_i), [batch, head, query], with o_i = Σ_j α_ij u_j.

    cos(o_i, u_0) is NaN for a query outside the sink's window (the sink is not its source)."""
    u = layer.v  # [b, k, h, d]
    z = layer.z  # [b, q, h, d]
    G = gram(layer.W_O) if space == "projected" else None
    n_q = z.shape[1]
    cos_sink = gram_cosine(z, u[:, :1], G, eps=1e-12).transpose(1, 2)  # [b, h, q]
    cos_cur = gram_cosine(z, u[:, -n_q:], G, eps=1e-12).transpose(1, 2)
    seen = sink_visible(n_q, u.shape[1], window, device=cos_sink.device)
    cos_sink = cos_sink.masked_fill(~seen, float("nan"))
    return cos_sink, cos_cur


QUERY_MODES = {"all": "every query ≥ 1", "final": "the final query of each window"}
DEFAULT_PREFIX_LENGTHS = (16, 32, 64, 128)
DOMINANT_OFFSET_SHARE = 0.5  # an offset winning more than half of a head's counted queries


def _grow(acc: Sum, size: int) -> None:
    """Widen the last axis of an offset histogram to ``size`` bins (zeros appended)."""
    have = acc.total.shape[-1]
    if size > have:
        pad = torch.zeros(acc.total.shape[:-1] + (size - have,), dtype=acc.total.dtype)
        acc.total = torch.cat([acc.total, pad], dim=-1)


class TaxonomyAnalysis(CorpusAnalysis):
    """Streams winner counts and alignments per (layer, head) over a corpus (docs/method.md §6).

    State: ``counts`` (a :class:`Sum` ``[layer, head, 3]``: sink, current, other winners),
    ``offsets`` (a :class:`Sum` ``[layer, head, K]``: other winners by i − w_i = k, widened as
    longer windows arrive), ``out_of_window`` (:class:`Sum` ``[layer, head]``: counted queries that
    cannot see the sink), ``prefix_counts`` (:class:`Sum` ``[prefix, layer, head, 3]``) with
    ``prefix_windows`` (:class:`Sum` ``[prefix]``), and ``sink_alignment`` /
    ``current_alignment`` (:class:`Moments` ``[layer, head]``).

    ``queries``: ``"all"`` (queries 1 … T−1, or 0 … T−1 with ``skip_first_query=False``) or
    ``"final"`` (the final query of each window, the authors' protocol).

    >>> import geolens
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")  # 2 layers × 4 heads
    >>> analysis = TaxonomyAnalysis.for_model(model)  # what head_taxonomy streams over a corpus
    >>> _ = geolens.run_corpus(model, tiny_tokens(model), [analysis], progress=False)
    >>> res = analysis.result()
    >>> res.regimes.shape, len(res.table)
    ((2, 4), 8)
    """

    def __init__(
        self,
        n_layers: int,
        n_heads: int,
        *,
        space: Space = "value",
        skip_first_query: bool = True,
        queries: str = "all",
        prefix_lengths=DEFAULT_PREFIX_LENGTHS,
    ):
        _check_space(space)
        check_choice(queries, QUERY_MODES, name="queries")
        prefix_lengths = tuple(int(p) for p in (prefix_lengths or ()))
        if any(p < 2 for p in prefix_lengths) or len(set(prefix_lengths)) != len(prefix_lengths):
            raise ValueError(f"prefix_lengths must be distinct lengths of at least 2 tokens, got {prefix_lengths}")
        self.n_layers, self.n_heads = n_layers, n_heads
        self.space = space
        self.skip_first_query = skip_first_query
        self.queries = queries
        self.prefix_lengths = list(sorted(prefix_lengths))
        self.counts = Sum((n_layers, n_heads, 3))
        self.offsets = Sum((n_layers, n_heads, 2))
        self.out_of_window = Sum((n_layers, n_heads))
        self.prefix_counts = Sum((len(self.prefix_lengths), n_layers, n_heads, 3))
        self.prefix_windows = Sum((len(self.prefix_lengths),))
        self.sink_alignment = Moments((n_layers, n_heads))
        self.current_alignment = Moments((n_layers, n_heads))
        self.model_mode = ""

    @classmethod
    def for_model(cls, model, **kwargs) -> "TaxonomyAnalysis":
        return cls(model.cfg.n_layers, model.cfg.n_heads, **kwargs)

    def hook_names(self, model) -> list[str]:
        return [hook_name(l, n) for l in range(self.n_layers) for n in (PATTERN, VALUE)]

    def _counted(self, n: int) -> slice:
        """Query positions counted in a window of ``n`` tokens."""
        start = 1 if self.skip_first_query else 0
        return slice(n - 1, n) if self.queries == "final" else slice(start, n)

    def update(self, model, cache, tokens) -> None:
        self.model_mode = model_mode(model)
        sink_cos, cur_cos = [], []
        for l in range(self.n_layers):
            layer = get_attention_layer(model, cache, l)
            n_q, n_k = layer.pattern.shape[2:]
            if n_q != n_k or n_q < 2:
                raise ValueError(
                    f"the taxonomy needs full square patterns of windows of at least 2 tokens, got {n_q} queries and {n_k} keys"
                )
            window = sliding_window(model, l)
            win = winners(layer.pattern, value_norms(layer, self.space), window=window)
            kinds = winner_kinds(win)
            q = self._counted(n_q)
            pos = torch.arange(n_q, device=win.device)
            onehot = torch.nn.functional.one_hot(kinds[:, :, q], 3).to(torch.float64)  # [b, h, q, 3]
            self.counts.total[l] += onehot.sum(dim=(0, 2)).cpu()
            _grow(self.offsets, n_q)
            self.offsets.total[l] += offset_counts(win[:, :, q], kinds[:, :, q], pos[q], self.offsets.total.shape[-1])
            unseen = (~sink_visible(n_q, n_k, window))[q].sum().item() * win.shape[0]
            self.out_of_window.total[l] += float(unseen)
            for p_idx, p in enumerate(self.prefix_lengths):
                if p > n_q:
                    continue
                pq = self._counted(p)
                self.prefix_counts.total[p_idx, l] += (
                    torch.nn.functional.one_hot(kinds[:, :, pq], 3).to(torch.float64).sum(dim=(0, 2)).cpu()
                )
            cos_sink, cos_cur = _alignments(layer, self.space, window)
            sink_cos.append(cos_sink[:, :, q])
            cur_cos.append(cos_cur[:, :, q])
        n_windows, n = layer.pattern.shape[0], layer.pattern.shape[2]
        for p_idx, p in enumerate(self.prefix_lengths):
            if p <= n:
                self.prefix_windows.total[p_idx] += float(n_windows)
        # samples: every (batch, query), elementwise over [layer, head]
        for acc, xs in ((self.sink_alignment, sink_cos), (self.current_alignment, cur_cos)):
            x = torch.stack(xs, dim=0)  # [layer, b, h, q]
            acc.update(x.permute(1, 3, 0, 2).reshape(-1, self.n_layers, self.n_heads), dim=0)

    def merge(self, other: "TaxonomyAnalysis") -> "TaxonomyAnalysis":
        mine = (self.n_layers, self.n_heads, self.space, self.queries, self.skip_first_query, self.prefix_lengths)
        theirs = (
            other.n_layers,
            other.n_heads,
            other.space,
            other.queries,
            other.skip_first_query,
            other.prefix_lengths,
        )
        if mine != theirs:
            raise ValueError(f"cannot merge taxonomy analyses of different settings: {mine} vs {theirs}")
        size = max(self.offsets.total.shape[-1], other.offsets.total.shape[-1])
        _grow(self.offsets, size)
        theirs_offsets = Sum(()).load_state_dict(other.offsets.state_dict())
        _grow(theirs_offsets, size)
        self.counts.merge(other.counts)
        self.offsets.merge(theirs_offsets)
        self.out_of_window.merge(other.out_of_window)
        self.prefix_counts.merge(other.prefix_counts)
        self.prefix_windows.merge(other.prefix_windows)
        self.sink_alignment.merge(other.sink_alignment)
        self.current_alignment.merge(other.current_alignment)
        self.model_mode = self.model_mode or other.model_mode
        return self

    def result(self) -> "TaxonomyResult":
        res = taxonomy_from_counts(
            self.counts.total,
            sink_alignment=self.sink_alignment.mean,
            current_alignment=self.current_alignment.mean,
            offsets=self.offsets.total,
            out_of_window=self.out_of_window.total,
            space=self.space,
            model_mode=self.model_mode,
        )
        res.queries = self.queries
        res.prefix_lengths = list(self.prefix_lengths)
        res.prefix_counts = self.prefix_counts.total.clone()
        res.prefix_windows = self.prefix_windows.total.clone()
        return res


@dataclass
class TaxonomyResult:
    """Per-head shares and regimes.

    - ``table``: one row per (layer, head) with ``layer, head, n_queries, share_sink,
      share_current, share_other, regime, mean_sink_alignment, mean_current_alignment`` and, when
      offsets were counted, ``top_offset`` (most frequent w_i − i among the "other" winners, NaN
      if none), ``top_offset_count``, ``top_offset_share`` (of the head's counted queries),
      ``top_offset_share_of_other`` (of its "other" winners), ``offset_dominant``
      (``top_offset_share > 0.5``), ``label`` (e.g. ``"Reset (offset −1, 83 %)"``) and
      ``n_out_of_window`` (counted queries that cannot see the sink: sliding-window layers);
    - ``regimes``: ``[layer, head]`` numpy array of regime names;
    - ``distribution``: regime → share of heads (all three regimes, zeros included);
    - ``offsets``: ``[layer, head, K]`` counts of "other" winners at offset −k (k = index);
    - ``queries``: ``"all"`` or ``"final"``; ``prefix_lengths`` / ``prefix_counts``
      ``[prefix, layer, head, 3]`` / ``prefix_windows``: the winner counts on window prefixes
      (:meth:`by_length`).
    """

    table: pd.DataFrame
    regimes: np.ndarray
    space: str = "value"
    model_mode: str = ""
    distribution: dict[str, float] = field(default_factory=dict)
    offsets: Tensor | None = None
    queries: str = "all"
    prefix_lengths: list = field(default_factory=list)
    prefix_counts: Tensor | None = None
    prefix_windows: Tensor | None = None

    def shares(self) -> np.ndarray:
        """``[layer, head, 3]`` winner shares (sink, current, other)."""
        n_layers, n_heads = self.regimes.shape
        cols = ["share_sink", "share_current", "share_other"]
        return self.table.sort_values(["layer", "head"])[cols].to_numpy().reshape(n_layers, n_heads, 3)

    def per_layer(self) -> pd.DataFrame:
        """Count of heads of each regime per layer."""
        out = pd.crosstab(self.table["layer"], self.table["regime"]).reindex(columns=list(REGIMES), fill_value=0)
        return out

    def offset_table(self, top: int = 5) -> pd.DataFrame:
        """The ``top`` most frequent offsets per head: ``layer, head, offset, count, share``
        (share of the head's counted queries), largest counts first."""
        if self.offsets is None:
            raise ValueError("this taxonomy has no offset counts (built by taxonomy_from_counts without offsets=)")
        n = self.table.sort_values(["layer", "head"])["n_queries"].to_numpy().reshape(self.regimes.shape)
        rows = []
        for l in range(self.offsets.shape[0]):
            for h in range(self.offsets.shape[1]):
                c = self.offsets[l, h]
                for k in [int(k) for k in torch.argsort(-c, stable=True)[:top] if c[k] > 0]:
                    rows.append(
                        {"layer": l, "head": h, "offset": -k, "count": int(c[k]), "share": float(c[k] / n[l, h])}
                    )
        return pd.DataFrame(rows, columns=["layer", "head", "offset", "count", "share"])

    def by_length(self) -> pd.DataFrame:
        """Regime shares on window prefixes: one row per prefix length P with ``n_windows``,
        ``n_queries_per_head``, the share of heads in each regime (``Mixer``, ``Retriever``,
        ``Reset``), the mean winner shares over heads (``share_sink``, …) and the share of heads
        whose regime differs from the full windows' (``changed_vs_full``)."""
        cols = [
            "prefix_length",
            "n_windows",
            "n_queries_per_head",
            *REGIMES,
            "share_sink",
            "share_current",
            "share_other",
            "changed_vs_full",
        ]
        if self.prefix_counts is None or not self.prefix_lengths:
            return pd.DataFrame(columns=cols)
        rows = []
        for i, p in enumerate(self.prefix_lengths):
            c = self.prefix_counts[i].to(torch.float64)
            tot = c.sum(-1, keepdim=True)
            if bool((tot == 0).any()):
                continue
            sh = c / tot
            reg = regimes_from_shares(sh)
            rows.append(
                {
                    "prefix_length": int(p),
                    "n_windows": int(self.prefix_windows[i]),
                    "n_queries_per_head": int(tot[0, 0, 0]),
                    **{r: float((reg == r).mean()) for r in REGIMES},
                    **{f"share_{k}": float(sh[..., j].mean()) for j, k in enumerate(WINNER_KINDS)},
                    "changed_vs_full": float((reg != self.regimes).mean()),
                }
            )
        return pd.DataFrame(rows, columns=cols)


def regimes_from_shares(shares: Float[Tensor, "... 3"]) -> np.ndarray:
    """Largest share → regime name (ties: sink, then current, then other)."""
    idx = torch.as_tensor(shares).argmax(dim=-1).cpu().numpy()
    return np.asarray(REGIMES, dtype=object)[idx]


def offset_label(regime: str, offset, share) -> str:
    """``"Reset (offset −1, 83 %)"`` for an offset-dominated head, else the regime name."""
    if offset is None or not np.isfinite(share) or share <= DOMINANT_OFFSET_SHARE:
        return regime
    return f"{regime} (offset {int(offset):+d}, {100 * share:.0f} %)".replace("-", "−")


def taxonomy_from_counts(
    counts: Float[Tensor, "layer head 3"],
    *,
    sink_alignment: Tensor | None = None,
    current_alignment: Tensor | None = None,
    offsets: Tensor | None = None,
    out_of_window: Tensor | None = None,
    space: str = "value",
    model_mode: str = "",
) -> TaxonomyResult:
    """Build the per-head table from winner counts ``[layer, head, (sink, current, other)]`` and,
    optionally, the offset histogram ``[layer, head, K]`` (index k ↔ offset −k)."""
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
    cols = {
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
    if offsets is not None:
        offsets = torch.as_tensor(offsets, dtype=torch.float64)
        if offsets.ndim != 3 or offsets.shape[:2] != counts.shape[:2]:
            raise ValueError(
                f"offsets must be [layer, head, K] with the counts' layers and heads, got {tuple(offsets.shape)}"
            )
        if not torch.allclose(offsets.sum(-1), counts[..., 2]):
            raise ValueError("offset counts do not add up to the 'other' winner counts")
        top_count, top_k = offsets.max(dim=-1)  # first maximum: the offset nearest the query
        has = top_count > 0
        top_offset = torch.where(has, -top_k.to(torch.float64), torch.full_like(top_count, float("nan")))
        share_q = top_count / total[..., 0]
        share_o = torch.where(has, top_count / counts[..., 2].clamp_min(1), torch.full_like(top_count, float("nan")))
        cols["top_offset"] = top_offset.reshape(-1).numpy()
        cols["top_offset_count"] = top_count.reshape(-1).numpy().astype(np.int64)
        cols["top_offset_share"] = share_q.reshape(-1).numpy()
        cols["top_offset_share_of_other"] = share_o.reshape(-1).numpy()
        cols["offset_dominant"] = (share_q > DOMINANT_OFFSET_SHARE).reshape(-1).numpy()
        cols["label"] = [
            offset_label(r, None if not np.isfinite(o) else o, s)
            for r, o, s in zip(cols["regime"], cols["top_offset"], cols["top_offset_share"])
        ]
    if out_of_window is not None:
        cols["n_out_of_window"] = (
            torch.as_tensor(out_of_window, dtype=torch.float64).reshape(-1).numpy().astype(np.int64)
        )
    table = pd.DataFrame(cols)
    distribution = {r: float((regimes == r).mean()) for r in REGIMES}
    return TaxonomyResult(
        table=table, regimes=regimes, space=space, model_mode=model_mode, distribution=distribution, offsets=offsets
    )


def head_taxonomy(
    model,
    tokens: Int[Tensor, "batch seq"],
    batch_size: int = 8,
    *,
    space: Space = "value",
    skip_first_query: bool = True,
    queries: str = "all",
    prefix_lengths=DEFAULT_PREFIX_LENGTHS,
    progress: bool = False,
) -> TaxonomyResult:
    """Regime of every head over the windows ``tokens`` ``[n, seq]`` (BOS first, unpadded).

    Example::

        tax = geolens.taxonomy.head_taxonomy(model, corpus_windows(model, "lee", 128, 200))
        tax.table.query("regime == 'Retriever'")

    >>> import geolens
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")  # 2 layers, 4 query heads sharing 2 kv heads
    >>> t = geolens.head_taxonomy(model, tiny_tokens(model, length=16), batch_size=2)
    >>> len(t.table), set(t.table.regime) <= {"Mixer", "Retriever", "Reset"}
    (8, True)
    """
    from geolens.runner import run_analysis

    if tokens.ndim != 2 or tokens.shape[1] < 2:
        raise ValueError(f"tokens must be [n, seq] with seq ≥ 2, got {tuple(tokens.shape)}")
    return run_analysis(
        model,
        tokens,
        TaxonomyAnalysis.for_model,
        model,
        space=space,
        skip_first_query=skip_first_query,
        queries=queries,
        prefix_lengths=prefix_lengths,
        batch_size=batch_size,
        progress=progress,
        desc="taxonomy",
    )


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
    dist = pd.DataFrame({names[0]: pd.Series(a.distribution), names[1]: pd.Series(b.distribution)}).reindex(
        list(REGIMES)
    )
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
    return {
        "agreement": agree,
        "n_heads": int(a.regimes.size),
        "distribution": dist,
        "confusion": confusion,
        "share_correlation": corr,
    }
