"""Information-flow routes: the graph of one prediction's sources through the layers
(docs/method.md §10).

For the residual stream at one position after the last layer, :func:`flow_routes` keeps the
edges of the layer mixing matrices M^(l) (:func:`geolens.flow.layer_mixing`) whose share exceeds a
threshold, traced backwards from that node so that only what reaches it is kept. The idea and the
shape of the graph are those of

    Javier Ferrando, Elena Voita. *Information Flow Routes: Automatically Interpreting Language
    Models at Scale.* Proceedings of EMNLP 2024.

How geolens' graph differs from theirs:

- **edge weights**: Ferrando & Voita weigh the edge j → i of a layer by the *proximity* of the
  attention term to the updated residual, ALTI-style (a distance-based importance,
  max(0, ‖x̃_i‖₁ − ‖t_ij − x̃_i‖₁), normalised). geolens' default ``method="contribution"`` weighs
  it by the *contribution share* of the term on the residual, ⟨x̃_i, t_ij⟩ / ‖x̃_i‖² with
  negatives clipped and rows renormalised (docs/method.md §10): a projection, not a proximity.
  ``method="alti"`` gives the proximity-based weights, the closest to the paper's;
  ``"attention_rollout"`` and ``"value_zeroing_rollout"`` are the baselines of §10.
- **granularity**: the paper has separate attention-head and MLP nodes and edges per head;
  here a node is the residual stream (layer, position) after a whole block, the edge (l−1, j) →
  (l, i) is the whole layer's share of source j (all heads), and the MLPs, which act token by
  token, are inside the residual edge (l−1, i) → (l, i) (the own term t_ii: the residual plus
  position i's attention to itself).
- **threshold**: one fixed threshold τ on the normalised shares of every layer (the paper uses
  the same rule, an edge is kept when its importance exceeds τ).

Nodes are (layer, position) with layer 0 the token embeddings (the input of block 0) and layer
l ≥ 1 the residual stream after block l − 1; the prediction is node (n_layers, position).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from geolens.adapter import adapter_for
from geolens.flow.core import FLOW_METHODS, cache_entry, check_flow_method, layer_mixing

# (layer, source, target, share): the edge (layer − 1, source) → (layer, target), share M^(layer)[target, source]
Edge = tuple[int, int, int, float]
Node = tuple[int, int]  # (layer, position)


@dataclass
class FlowGraph:
    """The information-flow routes of one prediction (:func:`flow_routes`): plain data.

    ``nodes``: (layer, position) pairs, sorted by layer then position, layer 0 = the token
    embeddings, ``n_layers`` = the output of the last block. ``edges``: (layer, source, target,
    share) for the edge (layer − 1, source) → (layer, target) with weight ``share`` =
    M^(layer)[target, source], sorted. ``tokens``: the token of every position, as strings.
    """

    position: int
    threshold: float
    method: str
    n_layers: int
    tokens: list[str]
    nodes: list[Node] = field(default_factory=list)
    edges: list[Edge] = field(default_factory=list)
    batch_index: int = 0
    model: str = ""

    def sources(self, layer: int, position: int) -> list[tuple[int, float]]:
        """The kept sources (position in layer − 1, share) of node (layer, position), largest share first."""
        found = [(s, w) for (l, s, t, w) in self.edges if l == layer and t == position]
        return sorted(found, key=lambda sw: (-sw[1], sw[0]))

    def positions(self) -> list[int]:
        """The positions that appear in the graph, sorted."""
        return sorted({p for _, p in self.nodes})

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data; :meth:`from_dict` reads it back."""
        return {
            "position": self.position,
            "threshold": self.threshold,
            "method": self.method,
            "n_layers": self.n_layers,
            "batch_index": self.batch_index,
            "model": self.model,
            "tokens": list(self.tokens),
            "nodes": [[l, p] for l, p in self.nodes],
            "edges": [{"layer": l, "source": s, "target": t, "share": w} for l, s, t, w in self.edges],
        }

    def to_json(self, **kwargs) -> str:
        """:meth:`to_dict` as JSON (keyword arguments go to :func:`json.dumps`)."""
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "FlowGraph":
        return cls(
            position=int(data["position"]),
            threshold=float(data["threshold"]),
            method=str(data["method"]),
            n_layers=int(data["n_layers"]),
            batch_index=int(data.get("batch_index", 0)),
            model=str(data.get("model", "")),
            tokens=[str(t) for t in data["tokens"]],
            nodes=[(int(l), int(p)) for l, p in data["nodes"]],
            edges=[(int(e["layer"]), int(e["source"]), int(e["target"]), float(e["share"])) for e in data["edges"]],
        )

    @classmethod
    def from_json(cls, text: str) -> "FlowGraph":
        return cls.from_dict(json.loads(text))

    def _repr_html_(self) -> str:  # displays itself in a notebook
        from geolens.viz.flow import flow_routes_html

        return flow_routes_html(self)


def _check_index(value, count: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if not -count <= value < count:
        raise ValueError(
            f"{name} {value} is out of range for {count} {'positions' if name == 'position' else 'rows'} (0…{count - 1}, or negative from the end)"
        )
    return value % count


def _check_threshold(threshold) -> float:
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
        raise TypeError(f"threshold must be a finite number, got {threshold!r}")
    if not 0 <= threshold < 1:
        raise ValueError(f"threshold must be in [0, 1) (shares are in [0, 1]), got {threshold}")
    return float(threshold)


def token_strings(model, tokens, batch_index: int, n: int) -> list[str]:
    """One string per position: the decoded tokens of row ``batch_index`` (``"0"``, ``"1"``, … without tokens).

    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")
    >>> token_strings(model, tiny_tokens(model), 0, 20)[:4], token_strings(model, None, 0, 3)
    (['<bos>', 't', 'h', 'e'], ['0', '1', '2'])
    """
    if tokens is None:
        return [str(j) for j in range(n)]
    row = tokens if tokens.ndim == 1 else tokens[batch_index]
    return [model.tokenizer.decode([int(t)]) for t in row.tolist()]


def flow_routes(
    model,
    cache,
    position: int,
    threshold: float,
    *,
    method: str = "contribution",
    batch_index: int = 0,
    tokens: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
) -> FlowGraph:
    """The information-flow routes of the prediction at ``position`` (module docstring;
    Ferrando & Voita 2024, with contribution shares instead of proximities unless ``method="alti"``).

    Starting from the node (L, ``position``), L = ``model.cfg.n_layers``, and going down the
    layers, every kept node (l, i) keeps its edges (l − 1, j) → (l, i) with M^(l)[i, j] >
    ``threshold``, M^(l) = :func:`geolens.flow.layer_mixing` of block l − 1, and their sources
    become the kept nodes of layer l − 1. A node none of whose shares exceeds the threshold ends
    its route there.

    Args:
        model: the TransformerLens model the cache comes from.
        cache: a cache with what :func:`geolens.contribution_flow` reads
            (:func:`geolens.flow.flow_names_filter`).
        position: the query position of the prediction (negative counts from the end).
        threshold: the least share an edge needs to be kept, in [0, 1).
        method: how M^(l) is read (``"contribution"``, ``"alti"``, ``"attention_rollout"``,
            ``"value_zeroing_rollout"``: the last needs ``tokens``).
        batch_index: the row of the batch.
        tokens: ``[batch, pos]`` (or ``[pos]`` for a batch of one) token ids the cache was run
            on: the graph's token strings, and what ``"value_zeroing_rollout"`` reruns.
        attention_mask: as in :func:`geolens.contribution_flow`.
        dtype: compute dtype of the mixing matrices.

    >>> import geolens
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> from geolens.flow import flow_names_filter
    >>> model = tiny_bridge("gqa")
    >>> tokens = tiny_tokens(model)
    >>> _, cache = model.run_with_cache(tokens, names_filter=flow_names_filter(model))
    >>> graph = flow_routes(model, cache, -1, 0.1, tokens=tokens)
    >>> (2, 19) in graph.nodes, all(w > 0.1 for *_, w in graph.edges)
    (True, True)
    """
    method = check_flow_method(method)
    threshold = _check_threshold(threshold)
    n_layers = model.cfg.n_layers
    pattern = cache_entry(cache, adapter_for(model).pattern_hook(0))  # a missing entry: one line naming it
    b, n = pattern.shape[0], pattern.shape[-1]
    batch_index = _check_index(batch_index, b, "batch_index")
    position = _check_index(position, n, "position")
    if tokens is not None and tokens.ndim == 1:
        tokens = tokens[None]
    if tokens is not None and tuple(tokens.shape) != (b, n):
        raise ValueError(f"tokens has shape {tuple(tokens.shape)}, the cache holds [batch, pos] = {(b, n)}")
    if attention_mask is not None and not bool(torch.as_tensor(attention_mask)[batch_index, position]):
        raise ValueError(f"position {position} of row {batch_index} is padding (attention_mask is 0 there)")
    frontier = {position}
    nodes: set[Node] = {(n_layers, position)}
    edges: list[Edge] = []
    for layer in range(n_layers, 0, -1):
        M = layer_mixing(model, cache, layer - 1, method, tokens=tokens, attention_mask=attention_mask, dtype=dtype)[
            batch_index
        ]
        rows = sorted(frontier)
        kept = M[rows] > threshold  # [kept targets, source]
        frontier = set()
        for r, s in kept.nonzero().tolist():
            target = rows[r]
            edges.append((layer, s, target, float(M[target, s])))
            frontier.add(s)
        nodes.update((layer - 1, s) for s in frontier)
        if not frontier:
            break
    model_name = getattr(model.cfg, "model_name", "") or ""
    return FlowGraph(
        position=position,
        threshold=threshold,
        method=method,
        n_layers=n_layers,
        tokens=token_strings(model, tokens, batch_index, n),
        nodes=sorted(nodes),
        edges=sorted(edges),
        batch_index=batch_index,
        model=str(model_name),
    )


__all__ = ["FLOW_METHODS", "FlowGraph", "flow_routes", "token_strings"]
