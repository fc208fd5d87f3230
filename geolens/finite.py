"""NaN and inf where geolens computes scores: one line naming where they first appear and, when the
model's weights hold some, which weights (issue #46: all-NaN scores came back without a word).

Used by :meth:`geolens.metrics.Metric.scores` (every registered metric's output),
:func:`geolens.contribution_flow` (the shares after each layer) and :func:`geolens.attribute`.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import Tensor


def non_finite_weights(model, limit: int = 3) -> list[str]:
    """The names of the model's first ``limit`` parameters holding NaN or inf, each with its count."""
    out = []
    for key, p in getattr(model, "named_parameters", lambda: [])():
        if p.is_floating_point():
            n = int((~torch.isfinite(p.detach())).sum())
            if n:
                out.append(f"{key.replace('._original_component', '')} ({n} of {p.numel()} values)")
                if len(out) == limit:
                    break
    return out


def check_finite(
    x: Tensor, *, what: str, dims: Iterable[str], model=None, layer: int | None = None, cause: str | None = None
) -> Tensor:
    """``x`` if every value is finite; else a one-line ValueError naming ``what``, where the first
    NaN or inf is (``dims``: the name of each axis, e.g. ``("batch", "head", "query", "key")``),
    how many there are, and, given the ``model``, which of its weights hold NaN or inf (the usual
    cause; else ``cause``, when given), instead of scores that are NaN without a word.

    >>> check_finite(torch.tensor([[1.0, float("nan")]]), what="scores of 'm'", dims=("query", "key"))
    Traceback (most recent call last):
    ...
    ValueError: scores of 'm' hold NaN at query 0, key 1: a score must be a finite number
    """
    bad = ~torch.isfinite(x)
    if not bool(bad.any()):
        return x
    where = [int(i) for i in bad.nonzero()[0].tolist()]
    kind = "NaN" if bool(torch.isnan(x[tuple(where)])) else "inf"
    place = ", ".join(f"{d} {i}" for d, i in zip(dims, where))
    if layer is not None:
        place = f"layer {layer}, {place}"
    more = int(bad.sum()) - 1
    text = f"{what} hold {kind} at {place}" + (f" (and {more} more NaN or inf)" if more else "")
    weights = non_finite_weights(model) if model is not None else []
    if weights:
        cause = f"the model's weights hold NaN or inf: {', '.join(weights)}"
    raise ValueError(f"{text}: {cause or 'a score must be a finite number'}")
