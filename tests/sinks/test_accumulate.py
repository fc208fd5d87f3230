"""Adding one layer's statistics into ``[layer, ...]`` accumulators (geolens.sinks._accumulate):
after several additions at different layers, each layer's count, mean, M2 and histogram equal
plain float64 sums over the samples that went into that layer, and the other layers stay
untouched."""

from __future__ import annotations

import torch

from geolens.sinks._accumulate import add_moments_at, histogram_add_at, moments_add_at
from geolens.streaming import Histogram, Moments


def _naive_moments(samples: list[torch.Tensor]):
    """count, mean, M2 = Σ (x − mean)² over the rows of the concatenated samples, float64."""
    x = torch.cat(samples).double()
    mean = x.sum(0) / x.shape[0]
    return x.shape[0], mean, ((x - mean) ** 2).sum(0)


def test_moments_add_at_equals_the_moments_of_each_layers_samples():
    g = torch.Generator().manual_seed(0)
    acc = Moments((3, 4))  # [layer, head]
    seen = {0: [], 2: []}
    for layer, n in [(0, 5), (2, 3), (0, 7), (2, 1)]:
        x = torch.randn(n, 4, generator=g) * 3 + layer
        moments_add_at(acc, layer, x, dim=0)
        seen[layer].append(x)
    for layer, samples in seen.items():
        n, mean, m2 = _naive_moments(samples)
        assert torch.all(acc.count[layer] == n)
        torch.testing.assert_close(acc.mean[layer], mean, rtol=0, atol=1e-12)
        torch.testing.assert_close(acc.m2[layer], m2, rtol=1e-12, atol=1e-12)
    assert torch.all(acc.count[1] == 0) and torch.all(acc.mean[1] == 0) and torch.all(acc.m2[1] == 0)


def test_moments_add_at_reduces_over_the_given_dim():
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(1))  # [head, sample]
    along_1, along_0 = Moments((2, 4)), Moments((2, 4))
    moments_add_at(along_1, 1, x, dim=1)
    moments_add_at(along_0, 1, x.T, dim=0)
    _, mean, m2 = _naive_moments([x.T])
    torch.testing.assert_close(along_1.mean[1], mean, rtol=0, atol=1e-12)
    torch.testing.assert_close(along_1.m2[1], m2, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(along_1.mean, along_0.mean, rtol=0, atol=0)


def test_add_moments_at_merges_a_slice_accumulator_at_an_index():
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(5, 3, generator=g), torch.randn(9, 3, generator=g) + 2
    acc = Moments((2, 2, 3))  # [layer, token type, variable]
    moments_add_at(acc, (1, 0), a, dim=0)
    add_moments_at(acc, (1, 0), Moments((3,)).update(b, dim=0))
    n, mean, m2 = _naive_moments([a, b])
    assert torch.all(acc.count[1, 0] == n)
    torch.testing.assert_close(acc.mean[1, 0], mean, rtol=0, atol=1e-12)
    torch.testing.assert_close(acc.m2[1, 0], m2, rtol=1e-12, atol=1e-12)
    untouched = torch.ones(2, 2, dtype=torch.bool)
    untouched[1, 0] = False
    assert torch.all(acc.count[untouched] == 0)


def test_histogram_add_at_counts_and_sums_payloads_per_bin():
    edges = torch.tensor([0.0, 0.25, 0.5, 1.0])
    g = torch.Generator().manual_seed(3)
    acc = Histogram(edges, (2, 3))  # [layer, head]
    rows = []
    for _ in range(2):
        values, payload = torch.rand(10, 3, generator=g), torch.randn(10, 3, generator=g)
        values[0, 0] = 1.0  # the right edge belongs to the last bin
        values[1, 1] = 1.5  # outside every bin: not counted
        histogram_add_at(acc, 1, values, payload, dim=0)
        rows.append((values, payload))
    counts = torch.zeros(3, 3, dtype=torch.float64)
    sums, squares = torch.zeros_like(counts), torch.zeros_like(counts)
    for values, payload in rows:
        for i in range(values.shape[0]):
            for h in range(3):
                x, p = float(values[i, h]), float(payload[i, h])
                k = next((k for k in range(3) if edges[k] <= x < edges[k + 1] or (k == 2 and x == 1.0)), None)
                if k is not None:
                    counts[h, k] += 1
                    sums[h, k] += p
                    squares[h, k] += p * p
    assert torch.equal(acc.counts[1], counts)
    torch.testing.assert_close(acc.payload_sum[1], sums, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(acc.payload_sq[1], squares, rtol=1e-12, atol=1e-12)
    assert counts.sum() == 2 * (10 * 3 - 1)
    assert torch.all(acc.counts[0] == 0) and torch.all(acc.payload_sum[0] == 0)
