"""The visible set T_i of a query, with sliding-window (local) attention layers (docs/method.md §0).

In a full causal layer query i sees the keys T_i = {0, …, i}. In a local layer with window W
(Gemma 3: W = 512, every layer but each 6th; read by :func:`geolens.adapter.sliding_window`)
it sees only T_i = {max(0, i − W + 1), …, i}: a query i ≥ W cannot see the sink (position 0).

The analyses of geolens treat such *out-of-window* queries the same way everywhere:

- a statistic *of the sink as seen by a query* (sink rate α_i0, Gu et al.'s first-token
  attention, the sink alignment cos(o_i, u_0), the norm curve, the sink drift) leaves the
  query out (it is never counted as "attention 0 to the sink"); the number left out is reported
  (``n_out_of_window`` columns);
- a statistic *over sources* (winners argmax_{j ∈ T_i}, top-N selection, the semantic cone,
  sink/tail value cosines) runs over T_i only: keys outside the window are not candidates;
- value statistics pairing the sink with other tokens (cos(v_0, v_j), the norm ratio) use the
  tokens j that share a window with the sink, 1 ≤ j ≤ W − 1.

A query position q of the pattern is position ``q + (n_key − n_query)`` of the sequence (the
queries are the last ``n_query`` positions), as everywhere in geolens.
"""

from __future__ import annotations

import torch
from jaxtyping import Bool
from torch import Tensor


def check_window(window) -> int | None:
    """``None`` (full attention) or a positive int; anything else is refused."""
    if window is None:
        return None
    if isinstance(window, bool) or int(window) != window or int(window) < 1:
        raise ValueError(f"a sliding window must be a positive number of tokens or None, got {window!r}")
    return int(window)


def query_positions(n_query: int, n_key: int, *, device=None) -> Tensor:
    """Sequence positions of the ``n_query`` last queries of a window of ``n_key`` keys."""
    if not 0 < n_query <= n_key:
        raise ValueError(f"need 0 < n_query ≤ n_key, got {n_query} queries and {n_key} keys")
    return torch.arange(n_key - n_query, n_key, device=device)


def visible_keys(n_query: int, n_key: int, window: int | None = None, *, device=None) -> Bool[Tensor, "query key"]:
    """T_i as a mask: key j is visible to query i iff i − W < j ≤ i (``window=None``: j ≤ i)."""
    window = check_window(window)
    q = query_positions(n_query, n_key, device=device)[:, None]
    k = torch.arange(n_key, device=device)[None, :]
    vis = k <= q
    if window is not None:
        vis = vis & (k > q - window)
    return vis


def sink_visible(n_query: int, n_key: int, window: int | None = None, *, device=None) -> Bool[Tensor, "query"]:
    """Whether each query sees the sink (position 0): always for full attention, i < W otherwise."""
    window = check_window(window)
    q = query_positions(n_query, n_key, device=device)
    return torch.ones_like(q, dtype=torch.bool) if window is None else q < window


def sink_window_keys(n_key: int, window: int | None = None, *, device=None) -> Bool[Tensor, "key"]:
    """Keys j ≥ 1 that some query sees together with the sink: 1 ≤ j ≤ W − 1 (all j ≥ 1 if full)."""
    window = check_window(window)
    k = torch.arange(n_key, device=device)
    keep = k >= 1
    return keep if window is None else keep & (k < window)
