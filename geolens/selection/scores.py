"""Geometric precision, recall and extremal F_N of a head's token selection (docs/method.md §5; Mudarisov et al. 2026).

For one head and one query t over its visible sources T_t = {0 … t} (in a sliding-window layer
T_t = {max(0, t − W + 1) … t}, :mod:`geolens.visibility`: the sink is a source only for t < W;
``sink="force"`` cannot select an invisible sink), each source i contributes
y_i = α_i u_i, with u the value vector before W_O (``space="value"``, as in Mudarisov et al. 2026) or the projected
value ṽ = v W_O (``space="projected"``). A ranking r (attention r_i = α_i, contribution norm
r_i = ‖y_i‖, or a random ranking) selects S = top-N (ties by increasing index). With the
aggregate s_N = Σ_{i∈S} y_i (its magnitude kept) and D_i = d(y_i, s_N), where
d is Euclidean ‖x − y‖ or cosine 1 − ⟨x, y⟩ / (‖x‖‖y‖ + 1e-12):

- ρ_max = max_{i∈S} D_i, ρ_min = min_{j∈T_t∖S} D_j;
- precision P_N = N / (N + |{j ∉ S : D_j ≤ ρ_max}|)   (closed ball of outer radius ρ_max);
- recall    R_N = |{i ∈ S : D_i < ρ_min}| / N        (open ball of inner radius ρ_min);
- F_N = 2 P_N R_N / (P_N + R_N)  (0 when P_N + R_N = 0), defined for 1 ≤ N < |T_t|.

The projected space is computed without building ṽ: with G = W_O W_Oᵀ, ‖(y_i − s) W_O‖² =
(y_i − s) G (y_i − s)ᵀ and ⟨y_i W_O, s W_O⟩ = y_i G sᵀ (docs/method.md §2's efficient form).

Caveats (docs/method.md §5, tested): with Euclidean distance F_1 = 1 for any selection rule (D_i = 0 for
the single selected token); if s_N = 0 the cosine distance is 1 for every source, so R_N = F_N = 0;
the metrics need not be monotone in N.

Sink handling (``sink=``): ``"keep"`` (the sink competes like any source), ``"exclude"`` (the
sink is removed from T_t: neither selected nor counted outside S) and ``"force"`` (the sink is
always in S, with the top N − 1 other sources).

Everything is vectorised over batch, heads, queries (and random draws); the only Python loop is
over the few values of N. Queries can be chunked (``query_chunk_size``) to bound memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from geolens import geometry
from geolens.selection.bounds import inversion_bounds
from geolens.validation import check_choice
from geolens.visibility import visible_keys

Distance = Literal["euclidean", "cosine"]
Space = Literal["value", "projected"]
Sink = Literal["keep", "exclude", "force"]
COSINE_EPS = 1e-12


def power_of_two_sizes(max_n: int, *, cap: int = 256) -> list[int]:
    """N ∈ {1, 2, 4, …} with N < max_n (the visible count) and N ≤ cap (the authors' protocol).

    >>> power_of_two_sizes(20), power_of_two_sizes(1000)[-1]
    ([1, 2, 4, 8, 16], 256)
    """
    out, n = [], 1
    while n < max_n and n <= cap:
        out.append(n)
        n *= 2
    return out


def source_ranks(ranking: Float[Tensor, "... key"], visible: Bool[Tensor, "... key"]) -> Tensor:
    """Position of each source in the descending ranking (0 = best; ties by increasing index;
    invisible sources last). S = top-N is ``rank < N`` for every N, hence nested across N."""
    masked = ranking.masked_fill(~visible, float("-inf"))
    order = torch.sort(masked, dim=-1, descending=True, stable=True).indices
    rank = torch.empty_like(order)
    rank.scatter_(-1, order, torch.arange(order.shape[-1], device=order.device).expand_as(order))
    return rank


def top_n_mask(ranking: Float[Tensor, "... key"], visible: Bool[Tensor, "... key"], n: int) -> Bool[Tensor, "... key"]:
    """S = the n visible sources with the largest ranking, ties broken by increasing index."""
    return (source_ranks(ranking, visible) < n) & visible


def _per_key(gram: Tensor | None) -> Tensor | None:
    """``gram`` (broadcast against the axes of y before key) with a key axis, for :mod:`geolens.geometry`'s
    helpers, which broadcast G against every leading axis."""
    return None if gram is None else gram.unsqueeze(-3)


def distances(
    y: Float[Tensor, "... key d"],
    selected: Bool[Tensor, "... key"],
    distance: Distance = "euclidean",
    gram: Float[Tensor, "... d d"] | None = None,
    *,
    y_sq: Tensor | None = None,
) -> Float[Tensor, "... key"]:
    """D_i = d(y_i, s_N) with s_N = Σ_{i∈S} y_i, in the metric ⟨x, y⟩_G = x G yᵀ (G = I if None).

    Computed from inner products, d² = ‖y_i‖² − 2⟨y_i, s⟩ + ‖s‖² (Euclidean) and
    1 − ⟨y_i, s⟩ / (‖y_i‖‖s‖ + 1e-12) (cosine), with matrix products: ``selected`` may carry
    extra leading axes (e.g. random draws) that ``y`` lacks, and ``y`` is then never copied per
    draw. Use float64 when exact near-ties matter (the expansion loses about half the digits of
    small distances). ``gram`` broadcasts against the leading axes of ``y`` (e.g.
    ``[head, 1, d, d]`` for y ``[batch, head, query, key, d]``); ``y_sq`` = ‖y_i‖²_G may be
    passed when already known.
    """
    return _distances(y, selected, (distance,), gram, y_sq)[distance]


def _distances(
    y: Tensor, selected: Tensor, kinds: Sequence[str], gram: Tensor | None, y_sq: Tensor | None
) -> dict[str, Tensor]:
    """:func:`distances` for several distance kinds sharing s_N and ⟨y_i, s_N⟩."""
    for kind in kinds:
        check_choice(kind, ("euclidean", "cosine"), name="distance")
    lead = y.ndim - 1  # axes of y before d, key included
    extra = selected.ndim - lead
    if extra < 0:
        selected = selected.expand(y.shape[:-1])
        extra = 0
    sel = selected.to(y.dtype)
    if extra:
        # [*extra, *lead] -> [*lead_without_key, E, key]
        E = int(torch.tensor(sel.shape[:extra]).prod())
        sel = sel.reshape((E,) + tuple(sel.shape[extra:]))
        sel = sel.movedim(0, -2)  # [..., E, key]
    else:
        sel = sel.unsqueeze(-2)  # [..., 1, key]
    s = sel @ y  # [..., E, d]
    yg = geometry.gram_apply(y, _per_key(gram))
    dot = yg @ s.transpose(-1, -2)  # [..., key, E]
    if y_sq is None:
        y_sq = (yg * y).sum(-1)
    s_sq = geometry.gram_dot(s, s, _per_key(gram))  # [..., E]
    out = {}
    for kind in kinds:
        if kind == "euclidean":
            D = (y_sq[..., None] - 2 * dot + s_sq[..., None, :]).clamp_min(0).sqrt()
        else:
            D = 1 - dot / (y_sq.clamp_min(0).sqrt()[..., None] * s_sq.clamp_min(0).sqrt()[..., None, :] + COSINE_EPS)
        D = D.transpose(-1, -2)  # [..., E, key]
        if extra:
            D = D.movedim(-2, 0).reshape(tuple(selected.shape[:extra]) + tuple(D.shape[:-2]) + (D.shape[-1],))
        else:
            D = D.squeeze(-2)
        out[kind] = D
    return out


@dataclass
class Separation:
    """P_N, R_N, F_N, the radii and the inversion bounds, each ``[...]`` (NaN where N ≥ |T_t|)."""

    precision: Tensor
    recall: Tensor
    f: Tensor
    rho_min: Tensor
    rho_max: Tensor
    ginv: Tensor
    margin: Tensor
    precision_bound: Tensor
    recall_bound: Tensor

    FIELDS = ("precision", "recall", "f", "rho_min", "rho_max", "ginv", "margin", "precision_bound", "recall_bound")

    def as_dict(self) -> dict[str, Tensor]:
        return {k: getattr(self, k) for k in self.FIELDS}

    @staticmethod
    def stack(items: Sequence["Separation"], dim: int = -1) -> "Separation":
        return Separation(**{k: torch.stack([getattr(s, k) for s in items], dim=dim) for k in Separation.FIELDS})


def separation_from_distances(
    D: Float[Tensor, "... key"],
    selected: Bool[Tensor, "... key"],
    visible: Bool[Tensor, "... key"],
    *,
    bounds: bool = True,
) -> Separation:
    """P_N, R_N, F_N (docs/method.md §5) and the inversion bounds from distances and the selected set.

    ``bounds=False`` skips GInv_N and the two lower bounds (NaN), the most expensive part.
    """
    n = selected.sum(-1).to(D.dtype)
    outside = visible & ~selected
    n_out = outside.sum(-1)
    inf = torch.tensor(float("inf"), dtype=D.dtype, device=D.device)
    rho_max = torch.where(selected, D, -inf).amax(-1)
    rho_min = torch.where(outside, D, inf).amin(-1)
    in_outer = (outside & (D <= rho_max[..., None])).sum(-1).to(D.dtype)
    in_inner = (selected & (D < rho_min[..., None])).sum(-1).to(D.dtype)
    precision = n / (n + in_outer)
    recall = in_inner / n.clamp_min(1)
    denom = precision + recall
    f = torch.where(denom > 0, 2 * precision * recall / denom.clamp_min(1e-300), torch.zeros_like(denom))
    if bounds:
        ginv, _, p_bound, r_bound = inversion_bounds(D, selected, visible)
    else:
        ginv = p_bound = r_bound = torch.full_like(precision, float("nan"))
    margin = rho_min - rho_max
    valid = (n >= 1) & (n_out >= 1)
    nan = torch.full_like(precision, float("nan"))
    out = [precision, recall, f, rho_min, rho_max, ginv, margin, p_bound, r_bound]
    return Separation(*[torch.where(valid, x.to(D.dtype), nan) for x in out])


def selection_scores(
    y: Float[Tensor, "... key d"],
    ranking: Float[Tensor, "... key"],
    visible: Bool[Tensor, "... key"],
    sizes: Sequence[int],
    *,
    distance: Distance = "euclidean",
    gram: Tensor | None = None,
    sink: Sink = "keep",
) -> Separation:
    """:class:`Separation` for each N in ``sizes``, stacked on a last axis ``[..., len(sizes)]``.

    ``y`` are the contributions y_i (``ranking`` may carry extra leading axes, e.g. random draws,
    that share the same ``y``), ``visible`` marks T_t. Position 0 is the sink.

    >>> y = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.0, -1.0]])  # 4 sources' y_i
    >>> sep = selection_scores(y, torch.tensor([0.4, 0.1, 0.3, 0.2]), torch.ones(4, dtype=torch.bool), [1, 2])
    >>> [round(p, 3) for p in sep.precision.tolist()], sep.recall.tolist()  # N=2 picks 0 and 2, leaves 1 nearer
    ([1.0, 0.667], [1.0, 0.0])
    """
    return selection_scores_multi(y, ranking, visible, sizes, distances=(distance,), gram=gram, sink=sink)[distance]


def selection_scores_multi(
    y: Float[Tensor, "... key d"],
    ranking: Float[Tensor, "... key"],
    visible: Bool[Tensor, "... key"],
    sizes: Sequence[int],
    *,
    distances: Sequence[Distance] = ("euclidean", "cosine"),
    gram: Tensor | None = None,
    sink: Sink = "keep",
    bounds: bool = True,
) -> dict[str, Separation]:
    """:func:`selection_scores` for several distances at once (the sets and s_N are shared).

    ``bounds=False`` leaves GInv_N and the lower bounds NaN (faster; the margin is kept)."""
    if any(int(n) < 1 for n in sizes):
        raise ValueError(f"selection sizes must be ≥ 1, got {list(sizes)}")
    ranking, visible = apply_sink_mode(ranking, visible, sink)
    extra = max(0, ranking.ndim - (y.ndim - 1))
    visible = visible & torch.ones(ranking.shape[:extra] + y.shape[:-1], dtype=torch.bool, device=y.device)
    ranking = ranking.expand(visible.shape)
    rank = source_ranks(ranking, visible)
    y_sq = geometry.gram_dot(y, y, _per_key(gram))
    n_t = torch.tensor([int(n) for n in sizes], device=rank.device).reshape((-1,) + (1,) * rank.ndim)
    selected = (rank[None] < n_t) & visible[None]  # [N, ..., key]: every size at once
    out = {}
    for kind, D in _distances(y, selected, distances, gram, y_sq).items():
        sep = separation_from_distances(D, selected, visible[None], bounds=bounds)
        out[kind] = Separation(**{k: getattr(sep, k).movedim(0, -1) for k in Separation.FIELDS})
    return out


def apply_sink_mode(ranking: Tensor, visible: Tensor, sink: Sink) -> tuple[Tensor, Tensor]:
    """(ranking, visible) after the sink rule: ``exclude`` hides position 0, ``force`` ranks it first."""
    check_choice(sink, ("keep", "exclude", "force"), name="sink")
    ranking, visible = torch.broadcast_tensors(ranking, visible)
    if sink == "exclude":
        visible = visible.clone()
        visible[..., 0] = False
    elif sink == "force":
        ranking = ranking.clone()
        ranking[..., 0] = float("inf")
    return ranking, visible


def aggregate(
    y: Float[Tensor, "... key d"], ranking: Tensor, visible: Tensor, n: int, sink: Sink = "keep"
) -> Float[Tensor, "... d"]:
    """s_N = Σ_{i∈S} y_i for the top-n set under the sink rule."""
    ranking, visible = apply_sink_mode(ranking, visible, sink)
    selected = top_n_mask(ranking, visible, int(n))
    return (y * selected[..., None].to(y.dtype)).sum(-2)


def layer_contributions(layer, queries: slice | None = None, *, window: int | None = None) -> tuple[Tensor, Tensor]:
    """(y [batch, head, query, key, d_head] = α_ij v_j, visible [query, key]) of one layer.

    ``visible`` is T_t: the causal keys, within the sliding ``window`` of a local layer
    (:func:`geolens.visibility.visible_keys`; :func:`geolens.adapter.sliding_window` reads it)."""
    pattern = layer.pattern if queries is None else layer.pattern[:, :, queries]
    n_q_all, n_k = layer.pattern.shape[2], pattern.shape[-1]
    visible = visible_keys(n_q_all, n_k, window, device=pattern.device)
    visible = visible if queries is None else visible[queries]
    v = layer.v.permute(0, 2, 1, 3)  # [b, h, k, d]
    y = pattern[..., None] * v[:, :, None]  # [b, h, q, k, d]
    return y, visible


def rankings(y_norm: Tensor, pattern: Tensor, by: str) -> Tensor:
    """Ranking scores: ``"attention"`` → α_ij, ``"norm"`` → ‖y_ij‖ (contribution norm)."""
    check_choice(by, ("attention", "norm"), name="by")
    return pattern if by == "attention" else y_norm


def head_selection_scores(
    layer,
    sizes: Sequence[int],
    *,
    space: Space = "value",
    distance: Distance = "euclidean",
    by: str = "attention",
    sink: Sink = "keep",
    queries: str | slice = "final",
    query_chunk_size: int = 16,
    window: int | None = None,
) -> Separation:
    """Scores of every (batch, head, query) of one :class:`geolens.adapter.AttentionLayer`.

    Returns a :class:`Separation` with fields ``[batch, head, query, len(sizes)]`` where query runs
    over the final position (``queries="final"``, the authors' protocol), every position
    (``"all"``) or a slice. ``by`` ranks by attention α or by contribution norm ‖α u‖ in the chosen
    space. ``window``: the layer's sliding window (``geolens.adapter.sliding_window(model, l)``),
    which restricts T_t to the last W keys; None for full attention.

    >>> import geolens
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")
    >>> _, cache = model.run_with_cache(tiny_tokens(model), names_filter=geolens.names_filter(model))
    >>> sep = head_selection_scores(geolens.get_attention_layer(model, cache, 1), power_of_two_sizes(20))
    >>> tuple(sep.f.shape), bool(((sep.f >= 0) & (sep.f <= 1)).all())  # [batch, head, final query, N]
    ((2, 4, 1, 5), True)
    """
    check_choice(space, ("value", "projected"), name="space")
    n_q = layer.pattern.shape[2]
    if queries == "final":
        q_slice = slice(n_q - 1, n_q)
    elif queries == "all":
        q_slice = slice(0, n_q)
    elif isinstance(queries, slice):
        q_slice = queries
    else:
        raise ValueError(f"queries must be 'final', 'all' or a slice, got {queries!r}")
    gram = None
    if space == "projected":
        gram = geometry.gram(layer.W_O)[:, None]  # [h, 1, d, d]
    start, stop, _ = q_slice.indices(n_q)
    parts = []
    for queries in geometry.query_slices(start, stop, query_chunk_size):
        y, visible = layer_contributions(layer, queries, window=window)
        y_norm = _norms(y, gram)
        pattern = layer.pattern[:, :, queries]
        parts.append(
            selection_scores(y, rankings(y_norm, pattern, by), visible, sizes, distance=distance, gram=gram, sink=sink)
        )
    return Separation(**{k: torch.cat([getattr(p, k) for p in parts], dim=2) for k in Separation.FIELDS})


def _norms(y: Tensor, gram: Tensor | None) -> Tensor:
    """‖y_i‖_G (‖y_i‖ when ``gram`` is None)."""
    if gram is None:
        return y.norm(dim=-1)
    return geometry.gram_dot(y, y, _per_key(gram)).clamp_min(0).sqrt()
