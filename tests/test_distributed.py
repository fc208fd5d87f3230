"""Data-parallel corpus runs: 2 gloo processes on CPU give the single-process numbers."""

from __future__ import annotations

import os
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import torch
from conftest import make_tiny, random_corpus

from geolens.checkpoint import load_checkpoint
from geolens.data import n_batches
from geolens.distributed import analysis_factory, merge_states, rank_checkpoint, run_corpus_distributed
from geolens.runner import run_corpus, shard_bounds
from geolens.sinks.norm_curve import NormCurve

REPO = Path(__file__).resolve().parents[1]


corpus_tokens = partial(random_corpus, n=21, seq=14, seed=2)  # this file's corpus; keywords override


def norm_curve(model) -> NormCurve:
    """A real corpus analysis (sink rate binned with ‖o_i^h‖ as payload) over every layer and head."""
    return NormCurve(model.cfg.n_layers, model.cfg.n_heads)


def assert_merged_equals_single(merged: NormCurve, single: NormCurve):
    """Counts exactly; per-bin sums of ‖o‖ and ‖o‖² up to float64 merge rounding."""
    for hist in ("per_head", "per_layer"):
        a, b = getattr(merged, hist), getattr(single, hist)
        assert torch.equal(a.counts, b.counts), hist
        assert a.counts.sum() > 0
        for k in ("payload_sum", "payload_sq"):
            torch.testing.assert_close(getattr(a, k), getattr(b, k), rtol=1e-12, atol=1e-15, msg=f"{hist}.{k}")
    assert torch.equal(merged.out_of_window.total, single.out_of_window.total)


def test_merging_simulated_rank_states_equals_one_process():
    model = make_tiny("gqa")
    tokens = corpus_tokens()
    [single] = run_corpus(model, tokens, [norm_curve(model)], batch_size=4, progress=False)
    world = 3
    states = []
    for rank in range(world):
        lo, hi = shard_bounds(tokens.shape[0], 4, rank, world)
        [a] = run_corpus(model, tokens[lo:hi], [norm_curve(model)], batch_size=4, progress=False)
        states.append([a.state_dict()])
    [merged] = merge_states([norm_curve(model)], states)
    assert_merged_equals_single(merged, single)
    # no process group: run_corpus_distributed is run_corpus
    [alone] = run_corpus_distributed(model, tokens, [norm_curve(model)], batch_size=4, progress=False)
    assert torch.equal(alone.per_head.payload_sum, single.per_head.payload_sum)


def flat_tensors(state, prefix=""):
    """{path: tensor} of every tensor in a nested state_dict."""
    if isinstance(state, dict):
        return {k2: v2 for k, v in state.items() for k2, v2 in flat_tensors(v, f"{prefix}/{k}").items()}
    if isinstance(state, (list, tuple)):
        return {k2: v2 for i, v in enumerate(state) for k2, v2 in flat_tensors(v, f"{prefix}/{i}").items()}
    return {prefix: state} if isinstance(state, torch.Tensor) else {}


def _launch(args, tmp_path, timeout=150):
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, *args], cwd=tmp_path, env=env, timeout=timeout, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_two_gloo_processes_equal_one_process(tmp_path):
    tokens = corpus_tokens()
    torch.save(tokens, tmp_path / "tokens.pt")
    analyses = ["norm-curve", "sink-geometry", "taxonomy"]
    common = ["--model", "tiny-gqa", "--tokens", "tokens.pt", "--batch-size", "4", "--no-progress"]
    common += [arg for spec in analyses for arg in ("--analysis", spec)]
    # torchrun --standalone picks a free port itself (rendezvous on localhost:0)
    _launch(
        [
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "geolens.distributed",
            *common,
            "--backend",
            "gloo",
            "--checkpoint-dir",
            "ckpt",
            "--out",
            "two.pt",
        ],
        tmp_path,
    )
    two = torch.load(tmp_path / "two.pt", weights_only=True)
    assert two["timing"]["world_size"] == 2 and two["analyses"] == ["NormCurve", "SinkGeometry", "TaxonomyAnalysis"]
    # the single-process reference, in this process with one thread like each rank (OMP_NUM_THREADS=1)
    model = make_tiny("gqa")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        single = run_corpus(
            model, tokens, [analysis_factory(spec)(model) for spec in analyses], batch_size=4, progress=False
        )
    finally:
        torch.set_num_threads(threads)
    assert_merged_equals_single(norm_curve(model).load_state_dict(two["states"][0]), single[0])
    for k, spec in enumerate(analyses[1:], start=1):  # sink geometry and taxonomy states
        a, b = flat_tensors(two["states"][k]), flat_tensors(single[k].state_dict())
        assert a.keys() == b.keys() and a, spec
        for name in a:
            if a[name].is_floating_point():
                torch.testing.assert_close(
                    a[name], b[name], rtol=1e-9, atol=1e-12, equal_nan=True, msg=f"{spec} {name}"
                )
            else:
                assert torch.equal(a[name], b[name]), f"{spec} {name}"
        analysis_factory(spec)(model).load_state_dict(two["states"][k]).result()  # the merged state gives a result
    # each rank checkpointed its own shard: together they cover every batch once
    done = [load_checkpoint(rank_checkpoint(tmp_path / "ckpt", r, 2))["next_batch"] for r in range(2)]
    assert sum(done) == n_batches(tokens.shape[0], 4) and min(done) >= 1


@pytest.mark.bridge_only
@pytest.mark.parametrize("device_map", ["auto", {"": "cpu"}])
def test_load_model_device_map_goes_through_accelerate(tmp_path, device_map):
    """device_map is handed to TransformerBridge.boot_transformers (only CPU targets here)."""
    pytest.importorskip("accelerate")
    from geolens.models import load_model
    from geolens.testing import tiny_hf_model, tiny_tokenizer

    tiny_hf_model("gqa").save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    plain = load_model(str(tmp_path))
    mapped = load_model(str(tmp_path), device_map=device_map)
    tokens = corpus_tokens(n=2, seq=10)
    with torch.no_grad():
        assert torch.equal(mapped(tokens), plain(tokens))
    [a] = run_corpus(mapped, tokens, [norm_curve(mapped)], batch_size=1, progress=False)
    [b] = run_corpus(plain, tokens, [norm_curve(plain)], batch_size=1, progress=False)
    assert torch.equal(a.per_head.counts, b.per_head.counts) and torch.equal(
        a.per_head.payload_sum, b.per_head.payload_sum
    )
