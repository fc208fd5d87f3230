"""run_corpus: batching does not change the numbers, only the needed hooks are cached, sharding."""

from __future__ import annotations

from functools import partial

import pandas as pd
import pytest
import torch
from conftest import make_tiny, random_corpus

from geolens.data import n_batches
from geolens.runner import run_corpus, shard_bounds
from geolens.sinks.norm_curve import NormCurve
from geolens.streaming import CorpusAnalysis

corpus_tokens = partial(random_corpus, n=11, seq=14, seed=0)  # this file's corpus; keywords override


def norm_curve(model, **kwargs) -> NormCurve:
    """A real corpus analysis (sink rate binned with ‖o_i^h‖ as payload) over every layer and head."""
    return NormCurve(model.cfg.n_layers, model.cfg.n_heads, **kwargs)


@pytest.fixture(scope="module")
def gqa():
    return make_tiny("gqa")


def test_batch_size_does_not_change_results(gqa):
    tokens = corpus_tokens()
    with torch.no_grad():
        _, cache = gqa.run_with_cache(tokens)
    whole = norm_curve(gqa)
    whole.update(gqa, cache, tokens)
    for bs in (1, 4, 11, 50):
        [a] = run_corpus(gqa, tokens, [norm_curve(gqa)], batch_size=bs, progress=False)
        assert torch.equal(a.per_head.counts, whole.per_head.counts)
        torch.testing.assert_close(a.per_head.payload_sum, whole.per_head.payload_sum, rtol=1e-6, atol=1e-9)
        torch.testing.assert_close(a.per_head.payload_sq, whole.per_head.payload_sq, rtol=1e-5, atol=1e-9)
        assert torch.equal(a.per_layer.counts, whole.per_layer.counts)
        assert torch.equal(
            a.per_head.counts.sum(-1), torch.full((2, 4), 11.0 * 13, dtype=torch.float64)
        )  # queries 1..13


class _Recorder(CorpusAnalysis):
    def __init__(self, names):
        self.names = names
        self.seen = []
        self.rows = 0

    def hook_names(self, model):
        return self.names

    def update(self, model, cache, tokens):
        self.seen.append(sorted(cache.keys()))
        self.rows += tokens.shape[0]

    def result(self):
        return self.rows


def test_only_requested_hooks_are_cached_and_every_row_seen_once(gqa):
    a = _Recorder(["blocks.0.attn.hook_pattern"])
    b = _Recorder(["blocks.1.attn.hook_v", "blocks.0.attn.hook_pattern"])
    run_corpus(gqa, corpus_tokens(), [a, b], batch_size=3, progress=False)
    expected = sorted({"blocks.0.attn.hook_pattern", "blocks.1.attn.hook_v"})
    assert a.seen == [expected] * 4 and b.seen == a.seen
    assert a.rows == b.rows == 11


def test_shard_bounds_partition_whole_batches():
    for n, bs, world in [(11, 3, 2), (8, 4, 3), (100, 8, 4), (5, 8, 2), (0, 2, 2)]:
        bounds = [shard_bounds(n, bs, r, world) for r in range(world)]
        assert bounds[0][0] == 0 and bounds[-1][1] == n
        for (a0, a1), (b0, _) in zip(bounds, bounds[1:]):
            assert a1 == b0 and a0 <= a1
        starts = [lo for lo, hi in bounds if hi > lo]
        assert all(s % bs == 0 for s in starts)  # whole batches: the same batches as one process
        sizes = [n_batches(hi - lo, bs) for lo, hi in bounds]
        assert max(sizes) - min(sizes) <= 1 and sum(sizes) == n_batches(n, bs)
    with pytest.raises(ValueError, match="rank"):
        shard_bounds(10, 2, 2, 2)


def test_bad_inputs_raise_clear_errors(gqa):
    a = norm_curve(gqa)
    with pytest.raises(ValueError, match="batch_size"):
        run_corpus(gqa, corpus_tokens(), [a], batch_size=0)
    with pytest.raises(ValueError, match="checkpoint_every"):
        run_corpus(gqa, corpus_tokens(), [a], checkpoint_every=0)
    with pytest.raises(ValueError, match=r"\[n_sequences, seq_len\]"):
        run_corpus(gqa, corpus_tokens()[0], [a])
    with pytest.raises(TypeError, match="CorpusAnalysis protocol"):
        run_corpus(gqa, corpus_tokens(), [object()])


def test_numpy_memmap_tokens(gqa, tmp_path):
    """Corpora larger than memory: tokens may be a numpy memmap read batch by batch."""
    import numpy as np

    tokens = corpus_tokens()
    mm = np.lib.format.open_memmap(tmp_path / "tokens.npy", mode="w+", dtype=np.int64, shape=tuple(tokens.shape))
    mm[:] = tokens.numpy()
    mm.flush()
    ro = np.load(tmp_path / "tokens.npy", mmap_mode="r")
    [a] = run_corpus(gqa, ro, [norm_curve(gqa)], batch_size=4, progress=False)
    [b] = run_corpus(gqa, tokens, [norm_curve(gqa)], batch_size=4, progress=False)
    assert torch.equal(a.per_head.counts, b.per_head.counts) and torch.equal(
        a.per_head.payload_sum, b.per_head.payload_sum
    )


def test_forward_stops_after_the_last_layer_read_with_identical_results():
    from geolens.runner import stop_layer

    model = make_tiny("gqa", n_layers=3)
    early = norm_curve(model, layers=[0, 1])
    assert stop_layer(model, early.hook_names(model)) == 2
    assert stop_layer(model, norm_curve(model).hook_names(model)) is None  # needs the last layer
    assert stop_layer(model, ["blocks.0.attn.hook_v", "ln_final.hook_normalized"]) is None  # not a block hook
    assert stop_layer(model, []) is None
    tokens = corpus_tokens(n=5, seq=12)
    [a] = run_corpus(model, tokens, [early], batch_size=2, progress=False)
    [b] = run_corpus(model, tokens, [norm_curve(model, layers=[0, 1])], batch_size=2, progress=False, stop_early=False)
    pd.testing.assert_frame_equal(a.result(min_count=1).curves, b.result(min_count=1).curves, check_exact=True)
    assert int(a.per_head.counts[:2].sum()) == 2 * 4 * 5 * 11  # layers 0-1 read: 4 heads, 5 rows, queries 1..11
