"""Streaming accumulators against numpy on the concatenated data."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from geolens.streaming import CorpusAnalysis, Histogram, Moments, Sum


def _shards(seed=0, sizes=(7, 1, 13, 4), shape=(3, 2)):
    g = np.random.default_rng(seed)
    return [g.normal(2.0, 3.0, size=(n,) + shape) * (1 + 10 * g.random()) for n in sizes]


def test_moments_one_pass_matches_numpy():
    data = np.concatenate(_shards())
    m = Moments((3, 2)).update(torch.from_numpy(data), dim=0)
    np.testing.assert_allclose(m.mean.numpy(), data.mean(0), rtol=1e-13)
    np.testing.assert_allclose(m.var.numpy(), data.var(0, ddof=1), rtol=1e-12)
    np.testing.assert_allclose(m.sem.numpy(), data.std(0, ddof=1) / np.sqrt(len(data)), rtol=1e-12)
    assert torch.equal(m.count, torch.full((3, 2), float(len(data)), dtype=torch.float64))


def test_welford_merge_of_shards_equals_one_pass():
    shards = _shards()
    one = Moments((3, 2)).update(torch.from_numpy(np.concatenate(shards)), dim=0)
    sequential = Moments((3, 2))
    for s in shards:
        sequential.update(torch.from_numpy(s), dim=0)
    parts = [Moments((3, 2)).update(torch.from_numpy(s), dim=0) for s in shards]
    tree = parts[0].merge(parts[1]).merge(parts[2].merge(parts[3]))
    for m in (sequential, tree):
        assert torch.equal(m.count, one.count)
        torch.testing.assert_close(m.mean, one.mean, rtol=1e-13, atol=0)
        torch.testing.assert_close(m.m2, one.m2, rtol=1e-12, atol=0)


def test_moments_merge_with_empty_is_identity():
    m = Moments((2,)).update(torch.tensor([[1.0, 2.0], [3.0, 5.0]]))
    before = m.state_dict()
    m.merge(Moments((2,)))
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    empty = Moments((2,)).merge(m)
    assert torch.equal(empty.mean, m.mean) and torch.equal(empty.m2, m.m2)


def test_moments_ignore_nan_per_element():
    data = np.random.default_rng(1).normal(size=(20, 4))
    data[np.random.default_rng(2).random((20, 4)) < 0.3] = np.nan
    data[:, 3] = np.nan  # an element with no sample at all
    data[1:, 2] = np.nan  # one sample only: variance undefined
    a = Moments((4,)).update(torch.from_numpy(data[:9])).merge(Moments((4,)).update(torch.from_numpy(data[9:])))
    counts = (~np.isnan(data)).sum(0)
    np.testing.assert_array_equal(a.count.numpy(), counts)
    np.testing.assert_allclose(a.mean.numpy()[:3], np.nanmean(data[:, :3], 0), rtol=1e-12)
    np.testing.assert_allclose(a.var.numpy()[:2], np.nanvar(data[:, :2], 0, ddof=1), rtol=1e-12)
    assert torch.isnan(a.var[2:]).all() and a.mean[3] == 0 and not torch.isnan(a.mean).any()


def test_moments_reduce_over_several_dims():
    x = torch.randn(5, 3, 6, dtype=torch.float64)
    m = Moments((3,)).update(x, dim=(0, 2))
    flat = x.permute(1, 0, 2).reshape(3, -1)
    torch.testing.assert_close(m.mean, flat.mean(1))
    torch.testing.assert_close(m.var, flat.var(1))


def test_histogram_matches_numpy_histogram_and_payload():
    g = np.random.default_rng(3)
    values = g.random((50, 2, 3)) * 1.2 - 0.1  # some outside [0, 1]
    values[0, 0, 0] = 1.0  # the right edge belongs to the last bin
    values[1, 0, 0] = 0.0
    values[2, 1, 1] = np.nan
    payload = g.normal(size=values.shape)
    edges = np.linspace(0, 1, 6)
    h = Histogram(edges, (2, 3))
    for part in np.array_split(np.arange(50), 3):
        h.update(torch.from_numpy(values[part]), torch.from_numpy(payload[part]), dim=0)
    for i in range(2):
        for j in range(3):
            v, p = values[:, i, j], payload[:, i, j]
            ok = ~np.isnan(v)
            counts, _ = np.histogram(v[ok], bins=edges)
            np.testing.assert_array_equal(h.counts[i, j].numpy(), counts)
            idx = np.clip(np.searchsorted(edges, v, side="right") - 1, 0, 4)
            inside = ok & (v >= 0) & (v <= 1)
            for b in range(5):
                sel = p[inside & (idx == b)]
                if len(sel) > 1:
                    np.testing.assert_allclose(h.payload_mean[i, j, b].item(), sel.mean(), rtol=1e-12)
                    np.testing.assert_allclose(
                        h.payload_sem[i, j, b].item(), sel.std(ddof=1) / np.sqrt(len(sel)), rtol=1e-9
                    )
                elif len(sel) == 0:
                    assert torch.isnan(h.payload_mean[i, j, b])


def test_histogram_merge_equals_concatenation_and_rejects_other_edges():
    x = torch.rand(40, 3, dtype=torch.float64)
    whole = Histogram(torch.linspace(0, 1, 5), (3,)).update(x)
    merged = (
        Histogram(torch.linspace(0, 1, 5), (3,))
        .update(x[:11])
        .merge(Histogram(torch.linspace(0, 1, 5), (3,)).update(x[11:]))
    )
    assert torch.equal(whole.counts, merged.counts)
    with pytest.raises(ValueError, match="different bin edges"):
        whole.merge(Histogram(torch.linspace(0, 1, 6), (3,)))


def test_sum_exact_for_integers():
    s = Sum((), dtype=torch.int64)
    for n in (2**40, 3, 2**40):
        s.update(n)
    assert int(s.total) == 2**41 + 3
    f = Sum((2,)).update(torch.ones(4, 2), dim=0).merge(Sum((2,)).update(torch.ones(3, 2), dim=0))
    assert torch.equal(f.total, torch.tensor([7.0, 7.0], dtype=torch.float64))


class _Nested(CorpusAnalysis):
    """Accumulators inside lists and dicts, plus configuration attributes."""

    def __init__(self):
        self.per_layer = [Moments((2,)), Moments((2,))]
        self.named = {"a": Sum((2,)), "b": Histogram([0.0, 0.5, 1.0], (2,))}
        self.label = "config"
        self.layers = (0, 1)

    def feed(self, x):
        for m in self.per_layer:
            m.update(x)
        self.named["a"].update(x, dim=0)
        self.named["b"].update(x)
        return self


def test_state_dict_round_trips_nested_accumulators_through_weights_only_load():
    x = torch.rand(6, 2, dtype=torch.float64)
    a = _Nested().feed(x)
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    b = _Nested().load_state_dict(torch.load(buf, weights_only=True))
    assert torch.equal(b.per_layer[1].mean, a.per_layer[1].mean)
    assert torch.equal(b.named["b"].counts, a.named["b"].counts)
    assert b.label == "config" and b.layers == (0, 1)
    a.feed(x)  # the loaded state is a copy, not shared
    assert not torch.equal(b.named["a"].total, a.named["a"].total)


def test_default_merge_merges_every_accumulator():
    x, y = torch.rand(5, 2, dtype=torch.float64), torch.rand(8, 2, dtype=torch.float64)
    merged = _Nested().feed(x).merge(_Nested().feed(y))
    whole = _Nested().feed(torch.cat([x, y]))
    torch.testing.assert_close(merged.per_layer[0].mean, whole.per_layer[0].mean, rtol=1e-14, atol=0)
    torch.testing.assert_close(merged.named["a"].total, whole.named["a"].total, rtol=1e-14, atol=0)
    assert torch.equal(merged.named["b"].counts, whole.named["b"].counts)

    class Other(CorpusAnalysis):
        pass

    with pytest.raises(TypeError, match="cannot merge Other into _Nested"):
        merged.merge(Other())
