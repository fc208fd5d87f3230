"""Resumable runs: atomic checkpoints, and a SIGKILLed run resumes to identical numbers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from functools import partial
from pathlib import Path

import pytest
import torch
from conftest import make_tiny, random_corpus

from geolens.checkpoint import atomic_torch_save, load_checkpoint
from geolens.runner import run_corpus
from geolens.sinks.norm_curve import NormCurve
from geolens.streaming import CorpusAnalysis, Moments

REPO = Path(__file__).resolve().parents[1]


corpus_tokens = partial(random_corpus, n=23, seq=14, seed=1)  # this file's corpus; keywords override


def assert_identical(a: dict, b: dict):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k].nan_to_num(-7.0), b[k].nan_to_num(-7.0)), k


def norm_curve(model, **kwargs) -> NormCurve:
    """A real corpus analysis (sink rate binned with ‖o_i^h‖ as payload) over every layer and head."""
    return NormCurve(model.cfg.n_layers, model.cfg.n_heads, **kwargs)


def histograms(a: NormCurve) -> dict:
    """Every number a NormCurve accumulates."""
    return {
        f"{scope}.{k}": getattr(getattr(a, scope), k)
        for scope in ("per_head", "per_layer")
        for k in ("counts", "payload_sum", "payload_sq")
    } | {"out_of_window": a.out_of_window.total}


@pytest.fixture(scope="module")
def gqa():
    return make_tiny("gqa")


class _Interrupt(Exception):
    pass


class _Crashing(NormCurve):
    """Raises when ``limit`` updates are done, as a KeyboardInterrupt / crash would.

    ``calls`` is part of the state (it is saved and restored), ``limit`` is not (class attribute).
    """

    limit = 7

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = 0

    def update(self, model, cache, tokens):
        if self.calls == self.limit:
            raise _Interrupt
        self.calls += 1
        super().update(model, cache, tokens)


class _Random(CorpusAnalysis):
    """Draws from the global torch generator in ``update`` (like a random-ranking control)."""

    def __init__(self):
        self.draws = Moments((3,))

    def hook_names(self, model):
        return []

    def update(self, model, cache, tokens):
        self.draws.update(torch.rand(tokens.shape[0], 3))

    def result(self):
        return self.draws.mean


def test_interrupted_run_resumes_to_identical_numbers(gqa, tmp_path, monkeypatch):
    tokens = corpus_tokens()
    torch.manual_seed(5)
    ref = run_corpus(gqa, tokens, [norm_curve(gqa), _Random()], batch_size=2, progress=False)
    path = tmp_path / "run.pt"
    torch.manual_seed(5)
    crashing = _Crashing(2, 4)
    with pytest.raises(_Interrupt):
        run_corpus(
            gqa, tokens, [crashing, _Random()], batch_size=2, progress=False, checkpoint=path, checkpoint_every=3
        )
    assert load_checkpoint(path)["next_batch"] == 6  # the last multiple of 3 before the crash
    torch.manual_seed(123)  # the checkpoint restores the generator, not the seed
    monkeypatch.setattr(_Crashing, "limit", 10**9)
    resumed = _Crashing(2, 4)
    run_corpus(gqa, tokens, [resumed, _Random()], batch_size=2, progress=False, checkpoint=path, checkpoint_every=3)
    assert resumed.calls == 12  # 6 restored from the checkpoint + the 6 remaining batches
    out = run_corpus(
        gqa, tokens, [resumed, _Random()], batch_size=2, progress=False, checkpoint=path
    )  # complete: no-op
    assert_identical(histograms(out[0]), histograms(ref[0]))
    assert torch.equal(out[1].result(), ref[1].result())
    assert load_checkpoint(path)["next_batch"] == 12


def test_checkpoint_of_another_run_is_refused(gqa, tmp_path):
    path = tmp_path / "run.pt"
    tokens = corpus_tokens(n=6)
    run_corpus(gqa, tokens, [norm_curve(gqa)], batch_size=2, progress=False, checkpoint=path)
    with pytest.raises(ValueError, match="tokens_sha256"):
        run_corpus(gqa, corpus_tokens(n=6, seed=9), [norm_curve(gqa)], batch_size=2, progress=False, checkpoint=path)
    with pytest.raises(ValueError, match="batch_size"):
        run_corpus(gqa, tokens, [norm_curve(gqa)], batch_size=3, progress=False, checkpoint=path)
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="junk.pt"):
        run_corpus(gqa, tokens, [norm_curve(gqa)], batch_size=2, progress=False, checkpoint=tmp_path / "junk.pt")


def test_failed_rename_keeps_previous_file_and_leaves_no_temp(tmp_path, monkeypatch):
    path = tmp_path / "state.pt"
    atomic_torch_save({"version": 1}, path)

    def boom(src, dst):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="simulated"):
        atomic_torch_save({"version": 2, "big": torch.zeros(10_000)}, path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=True) == {"version": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.pt"]


CRASH_BEFORE_RENAME = """
import os, signal, sys, torch
from geolens.checkpoint import atomic_torch_save
path = sys.argv[1]
atomic_torch_save({"version": 1, "x": torch.arange(5)}, path)
def die(*args):  # the process dies after the temp file is written, before the rename
    os.kill(os.getpid(), signal.SIGKILL)
os.{hook} = die
atomic_torch_save({"version": 2, "x": torch.zeros(2_000_000)}, path)
"""


@pytest.mark.parametrize("hook", ["replace", "fsync"])
def test_process_killed_between_write_and_rename_never_leaves_a_half_file(tmp_path, hook):
    path = tmp_path / "state.pt"
    proc = subprocess.run(
        [sys.executable, "-c", CRASH_BEFORE_RENAME.replace("{hook}", hook), str(path)], cwd=REPO, timeout=120
    )
    assert proc.returncode == -signal.SIGKILL
    state = torch.load(path, weights_only=True)
    assert state["version"] == 1 and torch.equal(state["x"], torch.arange(5))
    leftovers = [p for p in tmp_path.iterdir() if p.name != "state.pt"]
    assert leftovers and all(p.name.startswith(".state.pt.") and p.name.endswith(".tmp") for p in leftovers)
    atomic_torch_save({"version": 3}, path)  # a later save still works next to the stale temp file
    assert torch.load(path, weights_only=True) == {"version": 3}


CHILD = """
import sys, time, torch
from geolens.models import load_model
from geolens.runner import run_corpus
from geolens.sinks.norm_curve import NormCurve

tokens_path, ckpt, out, delay = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
calls = 0

class SlowNormCurve(NormCurve):
    def update(self, model, cache, tokens):
        global calls
        calls += 1
        super().update(model, cache, tokens)
        time.sleep(delay)

model = load_model("tiny-gqa")
tokens = torch.load(tokens_path, weights_only=True)
[a] = run_corpus(model, tokens, [SlowNormCurve(model.cfg.n_layers, model.cfg.n_heads)], batch_size=2, progress=False,
                 checkpoint=ckpt, checkpoint_every=2)
state = {f"{s}.{k}": getattr(getattr(a, s), k) for s in ("per_head", "per_layer") for k in ("counts", "payload_sum", "payload_sq")}
torch.save({"result": {**state, "out_of_window": a.out_of_window.total}, "calls": calls}, out)
"""


def test_sigkilled_run_resumes_to_identical_numbers(tmp_path):
    """Start a checkpointed run, SIGKILL it after its first checkpoint, rerun, compare."""
    tokens = corpus_tokens(n=24)  # 12 batches of 2, a checkpoint every 2 batches
    torch.save(tokens, tmp_path / "tokens.pt")
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(CHILD))

    def child(ckpt, out, delay):
        cmd = [
            sys.executable,
            str(script),
            str(tmp_path / "tokens.pt"),
            str(tmp_path / ckpt),
            str(tmp_path / out),
            str(delay),
        ]
        return subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})

    proc = child("killed.pt", "killed-out.pt", 0.4)
    deadline = time.monotonic() + 120
    while not (tmp_path / "killed.pt").exists():
        assert proc.poll() is None, "the child ended before writing a checkpoint"
        assert time.monotonic() < deadline, "no checkpoint after 120 s"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    assert not (tmp_path / "killed-out.pt").exists()
    done_before = load_checkpoint(tmp_path / "killed.pt")["next_batch"]
    assert 2 <= done_before < 12

    resumed = child("killed.pt", "killed-out.pt", 0.0)
    uninterrupted = child("fresh.pt", "fresh-out.pt", 0.0)
    assert resumed.wait(timeout=180) == 0 and uninterrupted.wait(timeout=180) == 0
    a = torch.load(tmp_path / "killed-out.pt", weights_only=True)
    b = torch.load(tmp_path / "fresh-out.pt", weights_only=True)
    assert a["calls"] == 12 - done_before and b["calls"] == 12  # the rerun really resumed
    assert_identical(a["result"], b["result"])


@pytest.mark.slow
def test_smollm2_resumed_run_is_identical(smollm2, smollm2_tokens, tmp_path, monkeypatch):
    """Real model: the first 3 layers' sink-rate histograms, interrupted after 2 of 4 batches and resumed."""
    [ref] = run_corpus(smollm2, smollm2_tokens, [norm_curve(smollm2, layers=[0, 1, 2])], batch_size=1, progress=False)
    monkeypatch.setattr(_Crashing, "limit", 2)
    crashing = _Crashing(smollm2.cfg.n_layers, smollm2.cfg.n_heads, layers=[0, 1, 2])
    path = tmp_path / "smollm2.pt"
    with pytest.raises(_Interrupt):
        run_corpus(smollm2, smollm2_tokens, [crashing], batch_size=1, progress=False, checkpoint=path)
    assert load_checkpoint(path)["next_batch"] == 2
    monkeypatch.setattr(_Crashing, "limit", 10**9)
    resumed = _Crashing(smollm2.cfg.n_layers, smollm2.cfg.n_heads, layers=[0, 1, 2])
    run_corpus(smollm2, smollm2_tokens, [resumed], batch_size=1, progress=False, checkpoint=path)
    assert resumed.calls == 4
    assert_identical(histograms(resumed), histograms(ref))
    counts = ref.per_head.counts.sum(-1)
    assert (
        torch.equal(counts[:3], torch.full((3, 9), 4.0 * 63, dtype=torch.float64)) and not counts[3:].any()
    )  # queries 1..63 of 4 rows


# --- fingerprints of the model and of the analyses' arguments; checkpoint safety -------------------


class _Counting(NormCurve):
    """Counts its updates, so a test can assert that no batch ran."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = 0

    def update(self, model, cache, tokens):
        self.calls += 1
        super().update(model, cache, tokens)


def test_checkpoint_of_another_model_is_refused(gqa, tmp_path):
    """Same architecture, other weights (another seed): the weight checksum names the difference."""
    path = tmp_path / "run.pt"
    tokens = corpus_tokens(n=4)
    run_corpus(gqa, tokens, [norm_curve(gqa)], batch_size=2, progress=False, checkpoint=path)
    other = make_tiny("gqa", seed=1)
    resumed = _Counting(2, 4)
    with pytest.raises(ValueError, match=r"model\.weights_sha256"):
        run_corpus(other, tokens, [resumed], batch_size=2, progress=False, checkpoint=path)
    deeper = make_tiny("gqa", n_layers=3)
    with pytest.raises(ValueError, match=r"model\.n_layers: checkpoint 2, this run 3"):
        run_corpus(deeper, tokens, [norm_curve(deeper, layers=[0, 1])], batch_size=2, progress=False, checkpoint=path)
    assert resumed.calls == 0


def test_checkpoint_with_other_analysis_arguments_is_refused_and_keeps_the_configuration(gqa, tmp_path):
    path = tmp_path / "run.pt"
    tokens = corpus_tokens(n=4)
    run_corpus(gqa, tokens, [norm_curve(gqa, layers=[0])], batch_size=2, progress=False, checkpoint=path)
    other = norm_curve(gqa, layers=[1])
    with pytest.raises(ValueError, match=r"analyses\[0\]\.args\.layers"):
        run_corpus(gqa, tokens, [other], batch_size=2, progress=False, checkpoint=path)
    assert other.layers == [1] and other.per_head.counts.sum() == 0
    bins = norm_curve(gqa, layers=[0], n_bins=4)
    with pytest.raises(ValueError, match=r"analyses\[0\]\.args\.n_bins"):
        run_corpus(gqa, tokens, [bins], batch_size=2, progress=False, checkpoint=path)
    # the same arguments resume (the run is complete: nothing left to do, same numbers)
    [same] = run_corpus(gqa, tokens, [norm_curve(gqa, layers=[0])], batch_size=2, progress=False, checkpoint=path)
    [ref] = run_corpus(gqa, tokens, [norm_curve(gqa, layers=[0])], batch_size=2, progress=False)
    assert_identical(histograms(same), histograms(ref))


def test_load_state_dict_and_merge_never_replace_the_configuration():
    from geolens.taxonomy import TaxonomyAnalysis

    a, b = NormCurve(2, 4, layers=[0]), NormCurve(2, 4, layers=[1])
    with pytest.raises(ValueError, match=r"layers\[0\]=1 there, 0 here"):
        a.load_state_dict(b.state_dict())
    assert a.layers == [0]
    with pytest.raises(ValueError, match="layers"):
        a.merge(b)
    assert a.config() == {"n_layers": 2, "n_heads": 4, "n_bins": 20, "layers": [0]}
    t = TaxonomyAnalysis(2, 4, space="projected")
    with pytest.raises(ValueError, match="space"):
        t.load_state_dict(TaxonomyAnalysis(2, 4).state_dict())
    assert t.space == "projected"
    a.load_state_dict(NormCurve(2, 4, layers=[0]).state_dict())  # same arguments: fine


def test_subclass_load_state_dict_overrides_are_checked_too():
    from geolens.selection.regime import RegimeAnalysis

    r = RegimeAnalysis(2, 4, 16, space="projected")
    with pytest.raises(ValueError, match="seq_len=12 there, 16 here"):
        r.load_state_dict(RegimeAnalysis(2, 4, 12, space="projected").state_dict())
    assert r.seq_len == 16 and r.config()["seq_len"] == 16


def test_garbage_checkpoint_is_refused_without_suggesting_trusted(gqa, tmp_path):
    import random

    path = tmp_path / "garbage.pt"
    path.write_bytes(random.Random(0).randbytes(4096))
    for call in (
        lambda: load_checkpoint(path),
        lambda: run_corpus(gqa, corpus_tokens(n=4), [norm_curve(gqa)], batch_size=2, progress=False, checkpoint=path),
    ):
        with pytest.raises(ValueError) as err:
            call()
        message = str(err.value)
        assert "garbage.pt" in message and "not a readable geolens checkpoint" in message
        assert "trusted" not in message and "weights_only" not in message


def test_checkpoint_folder_that_cannot_be_written_fails_before_the_first_batch(gqa, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    analysis = _Counting(2, 4)
    with pytest.raises(ValueError, match="not writable"):
        run_corpus(gqa, corpus_tokens(n=4), [analysis], batch_size=2, progress=False, checkpoint=blocker / "run.pt")
    assert analysis.calls == 0
    with pytest.raises(ValueError, match="is a folder"):
        run_corpus(gqa, corpus_tokens(n=4), [analysis], batch_size=2, progress=False, checkpoint=tmp_path)
    assert analysis.calls == 0


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc (read-only even for root)")
def test_read_only_checkpoint_folder_fails_before_the_first_batch(gqa):
    analysis = _Counting(2, 4)
    with pytest.raises(ValueError, match="checkpoint folder /proc is not writable"):
        run_corpus(gqa, corpus_tokens(n=4), [analysis], batch_size=2, progress=False, checkpoint="/proc/geolens-run.pt")
    assert analysis.calls == 0


def test_overridden_merge_refuses_shards_built_with_other_arguments():
    from geolens.selection.analysis import SelectionAnalysis

    a = SelectionAnalysis(2, 4, [1, 2], n_random=4)
    with pytest.raises(ValueError, match="n_random=8 there, 4 here"):
        a.merge(SelectionAnalysis(2, 4, [1, 2], n_random=8))
    a.merge(SelectionAnalysis(2, 4, [1, 2], n_random=4))


# ---------------------------------------------------------------------------------------------
# Bound to content and to the weights (issue #46): no digest, other weights, another geolens version


def test_a_checkpoint_without_its_digest_is_refused_not_trusted_as_legacy(gqa, tmp_path):
    path = tmp_path / "run.pt"
    tokens = corpus_tokens(n=4)
    run_corpus(gqa, tokens, [_Counting(2, 4)], batch_size=2, progress=False, checkpoint=path)
    saved = torch.load(path, weights_only=True)
    assert len(saved["digest"]) == 64 and saved["writer"]["weights_fingerprint"]
    atomic_torch_save({k: v for k, v in saved.items() if k != "digest"}, path)  # edited states, digest dropped
    resumed = _Counting(2, 4)
    with pytest.raises(ValueError, match=r"run\.pt: it has no digest of its batch index and states") as err:
        run_corpus(gqa, tokens, [resumed], batch_size=2, progress=False, checkpoint=path)
    assert "\n" not in str(err.value) and "delete it" in str(err.value) and resumed.calls == 0


def test_a_checkpoint_of_other_weights_under_the_same_architecture_is_refused(gqa, tmp_path):
    """New weights where the old model was (here: the unembedding moved, which the config and the
    W_O / W_E checksum of the settings do not see): the weights fingerprint names them."""
    path = tmp_path / "run.pt"
    tokens = corpus_tokens(n=4)
    run_corpus(gqa, tokens, [_Counting(2, 4)], batch_size=2, progress=False, checkpoint=path)
    other = make_tiny("gqa")
    with torch.no_grad():
        list(other.parameters())[-1].add_(0.5)
    resumed = _Counting(2, 4)
    with pytest.raises(ValueError, match="it was written by a model with other weights") as err:
        run_corpus(other, tokens, [resumed], batch_size=2, progress=False, checkpoint=path)
    assert "\n" not in str(err.value) and resumed.calls == 0
    saved = torch.load(path, weights_only=True)
    atomic_torch_save({k: v for k, v in saved.items() if k != "writer"}, path)  # a record naming no weights
    with pytest.raises(ValueError, match="does not record the weights of the model that wrote it"):
        run_corpus(gqa, tokens, [_Counting(2, 4)], batch_size=2, progress=False, checkpoint=path)


def test_a_resume_under_another_geolens_version_goes_on_and_says_so(gqa, tmp_path, monkeypatch):
    import geolens

    path = tmp_path / "run.pt"
    tokens = corpus_tokens(n=6)
    monkeypatch.setattr(_Crashing, "limit", 1)
    with pytest.raises(_Interrupt):
        run_corpus(gqa, tokens, [_Crashing(2, 4)], batch_size=2, progress=False, checkpoint=path)
    saved = torch.load(path, weights_only=True)
    assert saved["next_batch"] == 1 and saved["writer"]["geolens_version"] == geolens.__version__
    atomic_torch_save(dict(saved, writer=dict(saved["writer"], geolens_version="0.0.1")), path)
    monkeypatch.setattr(_Crashing, "limit", 10**9)
    with pytest.warns(UserWarning, match=rf"across geolens versions \(0\.0\.1 → {geolens.__version__}\)"):
        [done] = run_corpus(gqa, tokens, [_Crashing(2, 4)], batch_size=2, progress=False, checkpoint=path)
    assert done.calls == 3
    writer = torch.load(path, weights_only=True)["writer"]
    assert writer["geolens_version"] == geolens.__version__
    assert writer["resumed_across_versions"] == [f"0.0.1 → {geolens.__version__}"]
