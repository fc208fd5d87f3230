"""Adding one layer's statistics into ``[layer, ...]``-shaped accumulators.

Analyses update layer by layer (one layer's tensors in memory at a time). Each helper builds a
temporary accumulator for the slice, places its state at ``index`` of a zero-count accumulator of
the full shape, and merges that, so only the public ``update``/``merge`` of
:mod:`geolens.streaming` define the arithmetic (entries with zero count are left unchanged).
"""

from __future__ import annotations

from geolens.streaming import Histogram, Moments


def moments_add_at(acc: Moments, index, x, dim=0) -> None:
    """``acc[index]`` ← ``acc[index]`` merged with the samples of ``x`` along ``dim``."""
    part = Moments(tuple(acc.mean[index].shape)).update(x, dim=dim)
    full = Moments(tuple(acc.mean.shape))
    full.count[index], full.mean[index], full.m2[index] = part.count, part.mean, part.m2
    acc.merge(full)


def add_moments_at(acc: Moments, index, part: Moments) -> None:
    """``acc[index]`` ← ``acc[index]`` merged with the accumulator ``part`` (shape of the slice)."""
    full = Moments(tuple(acc.mean.shape))
    full.count[index], full.mean[index], full.m2[index] = part.count, part.mean, part.m2
    acc.merge(full)


def histogram_add_at(acc: Histogram, index, values, payload=None, dim=0) -> None:
    """``acc[index]`` ← ``acc[index]`` plus the counts (and payload sums) of ``values``."""
    shape = tuple(acc.counts[index].shape[:-1])
    part = Histogram(acc.edges, shape).update(values, payload, dim=dim)
    full = Histogram(acc.edges, tuple(acc.counts.shape[:-1]))
    full.counts[index], full.payload_sum[index], full.payload_sq[index] = part.counts, part.payload_sum, part.payload_sq
    acc.merge(full)
