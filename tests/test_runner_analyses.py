"""The sink and taxonomy corpus analyses run through the resumable and data-parallel runner.

For each analysis of :mod:`geolens.sinks` and :mod:`geolens.taxonomy`: an interrupted,
checkpointed run resumes to a state identical to an uninterrupted run, and the merge of
per-rank shard states equals the single-process state (counts exactly, float64 moments up to
merge rounding).
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
from conftest import make_tiny, random_corpus

from geolens.distributed import analysis_factory, merge_states
from geolens.runner import run_corpus, shard_bounds
from geolens.streaming import CorpusAnalysis

SPECS = ["sink-geometry", "norm-curve", "token-types", "taxonomy"]


corpus_tokens = partial(random_corpus, n=13, seq=12, seed=4)  # this file's corpus; keywords override


def tensors(state, prefix=""):
    """Flatten a state_dict into {path: tensor} (numbers as 0-d tensors)."""
    out = {}
    if isinstance(state, dict):
        for k, v in state.items():
            out.update(tensors(v, f"{prefix}/{k}"))
    elif isinstance(state, (list, tuple)):
        for i, v in enumerate(state):
            out.update(tensors(v, f"{prefix}/{i}"))
    elif isinstance(state, torch.Tensor):
        out[prefix] = state
    elif isinstance(state, (int, float)) and not isinstance(state, bool):
        out[prefix] = torch.tensor(state)
    return out


class _Bomb(CorpusAnalysis):
    """Raises at the ``limit``-th update (class attribute: not part of the saved state)."""

    limit = 4

    def __init__(self):
        self.calls = 0

    def hook_names(self, model):
        return []

    def update(self, model, cache, tokens):
        if self.calls == self.limit:
            raise KeyboardInterrupt
        self.calls += 1

    def result(self):
        return self.calls


@pytest.fixture(scope="module")
def gqa():
    return make_tiny("gqa")


@pytest.mark.parametrize("spec", SPECS)
def test_killed_and_resumed_run_gives_identical_state(gqa, tmp_path, monkeypatch, spec):
    make = analysis_factory(spec)
    tokens = corpus_tokens()
    [ref] = run_corpus(gqa, tokens, [make(gqa)], batch_size=2, progress=False)
    path = tmp_path / "ckpt.pt"
    with pytest.raises(KeyboardInterrupt):
        run_corpus(gqa, tokens, [make(gqa), _Bomb()], batch_size=2, progress=False, checkpoint=path, checkpoint_every=2)
    monkeypatch.setattr(_Bomb, "limit", 10**9)
    resumed, bomb = run_corpus(gqa, tokens, [make(gqa), _Bomb()], batch_size=2, progress=False, checkpoint=path)
    assert bomb.calls == 7  # 4 restored from the checkpoint + 3 remaining batches
    a, b = tensors(resumed.state_dict()), tensors(ref.state_dict())
    assert a.keys() == b.keys() and a
    for k in a:
        assert torch.equal(a[k].nan_to_num(-7.0), b[k].nan_to_num(-7.0)), k
    result = resumed.result()  # the result of the resumed state can be computed
    assert result is not None


@pytest.mark.parametrize("spec", SPECS)
def test_merged_shards_equal_single_process(gqa, spec):
    make = analysis_factory(spec)
    tokens = corpus_tokens()
    [single] = run_corpus(gqa, tokens, [make(gqa)], batch_size=3, progress=False)
    states = []
    for rank in range(2):
        lo, hi = shard_bounds(tokens.shape[0], 3, rank, 2)
        [part] = run_corpus(gqa, tokens[lo:hi], [make(gqa)], batch_size=3, progress=False)
        states.append([part.state_dict()])
    [merged] = merge_states([make(gqa)], states)
    a, b = tensors(merged.state_dict()), tensors(single.state_dict())
    assert a.keys() == b.keys() and a
    for k in a:
        if a[k].is_floating_point():
            torch.testing.assert_close(a[k], b[k], rtol=1e-9, atol=1e-12, equal_nan=True, msg=k)
        else:
            assert torch.equal(a[k], b[k]), k
