"""Fault injection, fast tier (tiny models): what the user sees when something goes wrong.

Each test injects one fault and checks the guarantee of docs/reliability.md: one line on stderr,
exit 1 (I/O) or 2 (usage), no traceback, a folder that never looks complete, and numbers that are
either right or refused. Every subprocess has a bounded timeout, so nothing hangs on a busy machine.

- kill -9 of a run: the folder stays incomplete, its lock is stale and the next run takes it over;
  the rerun's files equal an uninterrupted run's (resuming a SIGKILLed checkpointed run is
  ``test_checkpoint.py::test_sigkilled_run_resumes_to_identical_numbers``);
- two writers on one folder (two real processes): the second is refused, naming the holder;
- a file-size limit (``ulimit -f``) while saving a result or a figure; a full disk and a denied
  write while saving a figure;
- damaged JSON and gzip files read back; ``GEOLENS_CACHE`` naming a file;
- a text longer than the context; a padded batch without its mask; a cache of another model;
  a bfloat16 model in ``per_term_effects``;
- a hostile folder (issue #46): a symlinked lock, marker or stash, manifest and marker entries
  outside the folder or behind a link, a link leading out, ``..`` as a model's or a run's folder
  name, a symlinked model folder in ``geolens cache clear`` (real processes, real links, the
  victim file checked unchanged);
- what the API cannot compute right (issue #46): pads before the first real token without a mask,
  float / empty / out-of-vocabulary token ids, a metric of the wrong shape or returning numpy,
  NaN in the weights or the scores, the HF backend's ``to_tokens(truncate=True)`` warning.
"""

from __future__ import annotations

import errno
import gzip
import json
import os
import re
import resource
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from geolens import run_folder
from geolens.cli import main
from geolens.files import UnsafePath
from geolens.run_folder import INCOMPLETE, LOCK, MANIFEST, folder_state

pytestmark = pytest.mark.tl_agnostic  # faults of files and processes: run on TL 2.x in .venvs/min (scripts/test.sh)

TIMEOUT = 180  # seconds any subprocess may take (a busy 2-core machine)
PROGRESS = ("it/s]", "s/it]", "%|")  # tqdm bars share stderr


@pytest.fixture(autouse=True)
def _no_open_folders():
    run_folder.forget_all()
    yield
    run_folder.forget_all()


def write_corpus(path: Path, seed: int = 0, n_docs: int = 8) -> str:
    rng = np.random.default_rng(seed)
    words = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "far", "away", "news", "today"]
    path.write_text("\n\n".join(" ".join(rng.choice(words, 60)) + "." for _ in range(n_docs)), encoding="utf-8")
    return str(path)


def taxonomy(tmp_path: Path, out: Path, *extra: str) -> list[str]:
    corpus = write_corpus(tmp_path / "c.txt")
    return [
        "taxonomy",
        "--model",
        "tiny-gqa",
        "--corpora",
        corpus,
        "--n-sequences",
        "2",
        "--seq-len",
        "16",
        "--prefix-lengths",
        "8",
        "--out",
        str(out),
        *extra,
    ]


def lines_of(err: str) -> list[str]:
    return [
        line for line in err.replace("\r", "\n").splitlines() if line.strip() and not any(p in line for p in PROGRESS)
    ]


def run_cli(argv, capsys) -> tuple[int, list[str], str]:
    """``geolens.cli.main(argv)`` in-process: (exit code, stderr lines without progress bars, stdout)."""
    capsys.readouterr()
    rc = main(argv)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err, captured.err
    return rc, lines_of(captured.err), captured.out


def one_line(rc: int, err: list[str], code: int, prog: str, *needles: str) -> str:
    assert rc == code, (rc, err)
    assert len(err) == 1, err
    assert err[0].startswith(f"geolens {prog}: error: "), err[0]
    for needle in needles:
        assert needle in err[0], (needle, err[0])
    return err[0]


def results(folder: Path) -> dict[str, object]:
    """A folder's result files (what its manifest lists); a JSON file without its timings."""
    listed = json.loads((folder / MANIFEST).read_text())["files"]
    out = {}
    for rel in sorted(listed):
        if rel.endswith(".json"):  # the folder's own path and the timings aside
            out[rel] = _untimed(json.loads((folder / rel).read_text().replace(str(folder), "<out>")))
        else:
            out[rel] = (folder / rel).read_bytes()
    return out


def _untimed(value):
    if isinstance(value, dict):
        skip = ("command", "out", "overwrite", "started", "completed")  # how it was run, not what it found
        return {k: _untimed(v) for k, v in value.items() if "seconds" not in k and k not in skip}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    return value


def child(script: str, *, cwd: Path, preexec_fn=None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env=env,
        preexec_fn=preexec_fn,
    )


def wait_for_line(proc: subprocess.Popen, expected: str) -> None:
    line = proc.stdout.readline()
    if line.strip() != expected:
        proc.kill()
        _, err = proc.communicate(timeout=TIMEOUT)
        pytest.fail(f"the child did not say {expected!r}: {line!r} {err[-2000:]}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.communicate(timeout=TIMEOUT)


HOLDER = """
import sys, time
from geolens.run_folder import open_run_folder
folder = open_run_folder(sys.argv[1] if len(sys.argv) > 1 else {out!r}, command="taxonomy")
print("held", flush=True)
time.sleep({seconds})
"""


# --- kill -9 and concurrent writers -------------------------------------------------------------------


def test_kill_9_then_rerun_equals_an_uninterrupted_run(tmp_path, capsys):
    """SIGKILL a command that is writing: the folder stays incomplete (its lock stale); a rerun with
    --overwrite takes the lock over and its files equal an uninterrupted run's, byte for byte."""
    out, fresh = tmp_path / "killed", tmp_path / "fresh"
    script = f"""
    import sys, time, geolens.pipelines as p
    real = p.write_tables
    def slow(*a, **k):
        real(*a, **k); print("wrote", flush=True); time.sleep(120)
    p.write_tables = slow
    from geolens.cli import main
    sys.exit(main({taxonomy(tmp_path, out)!r}))
    """
    proc = child(script, cwd=tmp_path)
    try:
        wait_for_line(proc, "wrote")
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=TIMEOUT) == -signal.SIGKILL
    finally:
        stop(proc)
    assert folder_state(out) == "incomplete" and (out / LOCK).is_file()  # a stale lock: its process is gone
    assert json.loads((out / LOCK).read_text())["pid"] == proc.pid
    rc, err, _ = run_cli(taxonomy(tmp_path, out), capsys)
    one_line(rc, err, 2, "taxonomy", "partial results of an interrupted run", "--overwrite")
    rc, err, _ = run_cli(taxonomy(tmp_path, out, "--overwrite"), capsys)
    assert rc == 0, err
    rc, err, _ = run_cli(taxonomy(tmp_path, fresh), capsys)
    assert rc == 0, err
    assert folder_state(out, contents=True) == "complete" and not (out / LOCK).exists()
    assert results(out) == results(fresh) and results(out)


@pytest.mark.parametrize("options", [[], ["--overwrite"]])
def test_a_second_writer_is_refused_naming_the_process_that_holds_the_folder(tmp_path, capsys, options):
    out = tmp_path / "out"
    proc = child(HOLDER.format(out=str(out), seconds=120), cwd=tmp_path)
    try:
        wait_for_line(proc, "held")
        rc, err, _ = run_cli(taxonomy(tmp_path, out, *options), capsys)
        one_line(rc, err, 2, "taxonomy", str(out), "in use", f"process {proc.pid}", "geolens taxonomy")
        with pytest.raises(run_folder.FolderInUse, match=f"process {proc.pid}"):
            run_folder.open_run_folder(out, command="faithfulness", resume=True)
        rc, err, _ = run_cli(["flow", "the cat sat", "--model", "tiny-gqa", "--out", str(out), "--overwrite"], capsys)
        one_line(rc, err, 2, "flow", str(out), f"process {proc.pid}")
        assert sorted(p.name for p in out.iterdir()) == [LOCK, INCOMPLETE]  # nothing of the refused runs
    finally:
        stop(proc)
    rc, err, _ = run_cli(taxonomy(tmp_path, out, "--overwrite"), capsys)  # the holder is gone: taken over
    assert rc == 0, err
    assert folder_state(out, contents=True) == "complete"
    assert LOCK not in json.loads((out / MANIFEST).read_text())["files"] and not (out / LOCK).exists()


def test_two_processes_racing_for_one_folder_give_one_writer(tmp_path):
    """Two real processes open the same new folder at once: exactly one holds it, the other is refused."""
    out = tmp_path / "race"
    script = f"""
    import sys, time
    from geolens.run_folder import FolderInUse, open_run_folder
    try:
        open_run_folder({str(out)!r}, command="taxonomy")
    except FolderInUse as err:
        print("refused", err, flush=True)
        sys.exit(2)
    print("held", flush=True)
    time.sleep(5)
    """
    procs = [child(script, cwd=tmp_path) for _ in range(2)]
    try:
        outs = [p.communicate(timeout=TIMEOUT) for p in procs]
    finally:
        for p in procs:
            stop(p)
    codes = sorted(p.returncode for p in procs)
    said = sorted(o[0].split()[0] for o in outs if o[0].strip())
    # the second either met the lock (refused) or, starting after the first ended, took it over
    assert said in (["held", "refused"], ["held", "held"]), outs
    if said == ["held", "refused"]:
        assert codes == [0, 2]


# --- file-size limit, full disk, denied writes ---------------------------------------------------------


def _limit_file_size(limit: int):
    def apply():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


@pytest.mark.parametrize("what", ["result", "figure"])
def test_file_size_limit_is_one_line_and_exit_1(tmp_path, what):
    """``ulimit -f``: the write fails with EFBIG (SIGXFSZ is ignored by the command line) instead of
    the process being killed by the signal; one line, exit 1, the folder marked incomplete."""
    out = tmp_path / "out"
    figure = """
    import geolens.pipelines as p
    from geolens.viz.common import PlotView, new_figure
    real = p.write_tables
    def with_figure(folder, *a, **k):
        fig = new_figure(figsize=(8, 8))
        fig.add_subplot().imshow(__import__("numpy").random.default_rng(0).random((200, 200)))
        PlotView(fig).save(folder / "figure.png")
        real(folder, *a, **k)
    p.write_tables = with_figure
    """
    script = f"""
    import sys
    {textwrap.dedent(figure).strip().replace(chr(10), chr(10) + "    ") if what == "figure" else ""}
    from geolens.cli import main
    sys.exit(main({taxonomy(tmp_path, out)!r}))
    """
    proc = child(script, cwd=tmp_path, preexec_fn=_limit_file_size(600))
    try:
        _, err = proc.communicate(timeout=TIMEOUT)
    finally:
        stop(proc)
    lines = lines_of(err)
    assert proc.returncode == 1, (proc.returncode, err[-3000:])
    assert "Traceback" not in err and len(lines) == 1, err[-3000:]
    assert lines[0].startswith("geolens taxonomy: error: ") and "File too large" in lines[0] and "ulimit -f" in lines[0]
    assert str(out) in lines[0] and folder_state(out) in ("incomplete", "absent")  # never complete


@pytest.mark.parametrize(
    "code, advice",
    [(errno.ENOSPC, "free some disk space"), (errno.EACCES, "check the permissions"), (errno.EFBIG, "ulimit -f")],
)
def test_figure_write_errors_are_one_line(tmp_path, capsys, monkeypatch, code, advice):
    """matplotlib's savefig failing (full disk, denied, file-size limit): one line, exit 1, incomplete."""
    from matplotlib.figure import Figure

    import geolens.pipelines
    from geolens.viz.common import PlotView, new_figure

    def savefig(self, fname, *args, **kwargs):
        raise OSError(code, os.strerror(code), str(fname))

    monkeypatch.setattr(Figure, "savefig", savefig)
    real = geolens.pipelines.write_tables

    def with_figure(folder, *args, **kwargs):
        real(folder, *args, **kwargs)
        PlotView(new_figure()).save(folder / "figure.png")

    monkeypatch.setattr(geolens.pipelines, "write_tables", with_figure)
    out = tmp_path / "out"
    rc, err, _ = run_cli(taxonomy(tmp_path, out), capsys)
    one_line(rc, err, 1, "taxonomy", str(out / "figure.png"), os.strerror(code), advice, "(incomplete)")
    assert folder_state(out) == "incomplete"


# --- damaged files read back ------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["json", "gzip_not_gzip", "gzip_truncated", "input_json"])
def test_damaged_result_files_are_one_line_naming_the_file(tmp_path, capsys, monkeypatch, damage):
    """A result file read back during a run (a resume's progress, a summary) that is damaged: one
    line naming the file, exit 1, the folder left incomplete."""
    import geolens.pipelines

    out = tmp_path / "out"
    real = geolens.pipelines.write_tables

    def read_back(folder, *args, **kwargs):
        real(folder, *args, **kwargs)
        if damage in ("json", "input_json"):  # a result of the run, or a file of the user's
            path = (folder if damage == "json" else tmp_path) / "progress.json"
            path.write_text('{"done": [1, 2')
            json.loads(path.read_text())
        else:
            path = folder / "rows.csv.gz"
            blob = gzip.compress(b"a,b\n" * 1000)
            path.write_bytes(b"not gzip at all" if damage == "gzip_not_gzip" else blob[: len(blob) // 2])
            with gzip.open(path, "rb") as f:
                f.read()

    monkeypatch.setattr(geolens.pipelines, "write_tables", read_back)
    rc, err, _ = run_cli(taxonomy(tmp_path, out), capsys)
    path = (
        tmp_path / "progress.json"
        if damage == "input_json"
        else out / ("progress.json" if damage == "json" else "rows.csv.gz")
    )
    kind = {"gzip_not_gzip": "BadGzipFile", "gzip_truncated": "EOFError"}.get(damage, "JSONDecodeError")
    advice = "check or replace that file" if damage == "input_json" else "delete it, or rerun with --overwrite"
    one_line(rc, err, 1, "taxonomy", f"cannot read {path}:", kind, "damaged or truncated", advice, "(incomplete)")
    assert folder_state(out) == "incomplete"


def test_unreadable_result_file_is_one_line_naming_it(tmp_path, capsys, monkeypatch):
    """A result file read back that cannot be read (permissions): ``cannot read FILE``, not ``cannot write``."""
    import geolens.pipelines

    out = tmp_path / "out"
    real = geolens.pipelines.write_tables
    real_read = Path.read_text

    def read_text(self, *args, **kwargs):
        if self.name == "progress.json":
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real_read(self, *args, **kwargs)

    def read_back(folder, *args, **kwargs):
        real(folder, *args, **kwargs)
        (folder / "progress.json").write_text("{}")
        (folder / "progress.json").read_text()

    monkeypatch.setattr(Path, "read_text", read_text)
    monkeypatch.setattr(geolens.pipelines, "write_tables", read_back)
    rc, err, _ = run_cli(taxonomy(tmp_path, out), capsys)
    one_line(rc, err, 1, "taxonomy", f"cannot read {out / 'progress.json'}: Permission denied", "make it readable")
    assert folder_state(out) == "incomplete"


def test_geolens_cache_naming_a_file_is_one_line(tmp_path, capsys, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    monkeypatch.setenv("GEOLENS_CACHE", str(blocker))
    for argv in (["cache", "verify"], ["cache", "path"]):
        rc, err, _ = run_cli(argv, capsys)
        one_line(rc, err, 1, "cache", f"GEOLENS_CACHE={blocker} is a file, not a folder")
    from geolens.model_cache import CacheError, models_dir

    with pytest.raises(CacheError, match="is a file, not a folder") as caught:
        models_dir()
    assert "Errno" not in str(caught.value)


# --- inputs and caches the API cannot compute right ----------------------------------------------------------

LONG = "the cat sat on the mat. " * 10  # 241 tokens of the tiny character tokenizer; n_ctx = 128


def test_over_long_text_is_refused_in_one_line_or_truncated_on_request(tmp_path, capsys):
    rc, err, _ = run_cli(["flow", LONG, "--model", "tiny-gqa"], capsys)
    one_line(rc, err, 2, "flow", "241 tokens long", "context of 128 tokens", "--truncate")
    out = tmp_path / "flow"
    rc, err, stdout = run_cli(["flow", LONG, "--model", "tiny-gqa", "--truncate", "--out", str(out)], capsys)
    assert rc == 0, err
    assert "note: the text is 241 tokens long: truncated to the model's context, its first 128 tokens" in stdout
    record = json.loads((out / "flow.json").read_text())
    assert record["truncated"] is True and record["n_text_tokens"] == 241 and len(record["tokens"]) == 128


@pytest.mark.bridge_only  # builds the TL 4.x tiny bridge
def test_over_long_text_in_analyze(capsys, monkeypatch):
    import geolens.models
    from geolens.testing import tiny_bridge

    model = tiny_bridge("gqa")
    monkeypatch.setattr(geolens.models, "load_model", lambda *a, **k: model)
    rc, err, _ = run_cli(["analyze", LONG], capsys)
    one_line(rc, err, 2, "analyze", "241 tokens long", "context of 128 tokens", "--truncate")
    rc, err, stdout = run_cli(["analyze", LONG, "--truncate"], capsys)
    assert rc == 0 and "truncated to the model's context" in stdout and "128 tokens incl. BOS" in stdout


@pytest.mark.bridge_only  # builds the TL 4.x tiny bridge
def test_over_long_text_in_the_python_api():
    from geolens.hf.tiny import tiny_family
    from geolens.testing import tiny_bridge, tiny_tokenizer
    from geolens.validation import text_tokens

    bridge = tiny_bridge("gqa")
    with pytest.raises(ValueError, match="241 tokens long .* context of 128 tokens: .* truncate=True"):
        text_tokens(bridge, LONG)
    with pytest.warns(UserWarning, match="241 tokens long: truncated"):
        assert tuple(text_tokens(bridge, LONG, truncate=True).shape) == (1, 128)
    import geolens.hf

    hf = geolens.hf.prepare(tiny_family("qwen3"), tokenizer=tiny_tokenizer())
    with pytest.raises(ValueError, match="241 tokens long .* context of 128 tokens"):
        hf.to_tokens(LONG)
    with pytest.warns(UserWarning, match="241 tokens long: truncated to the model's context, its first 128"):
        assert tuple(hf.to_tokens(LONG, truncate=True).shape) == (1, 128)  # before: cut without a word


@pytest.mark.bridge_only  # builds the TL 4.x tiny bridge
def test_over_long_multiple_choice_prompt_is_refused_not_cut():
    from geolens.errors import UsageError
    from geolens.multiple_choice import Question, prompt_and_choice_ids
    from geolens.testing import tiny_bridge

    model = tiny_bridge("gqa")
    prompt, choices = prompt_and_choice_ids(model, Question("the cat sat on the", ("mat", "dog"), 0))
    assert len(prompt) == 19 and [len(c) for c in choices] == [4, 4]
    with pytest.raises(UsageError, match="245 tokens .* context of 128 tokens; shorten it"):
        prompt_and_choice_ids(model, Question(LONG, ("mat", "dog"), 0))


@pytest.mark.bridge_only  # builds the TL 4.x tiny bridge
def test_padded_batch_without_its_mask_is_refused():
    import geolens
    from geolens.flow import contribution_flow, flow_names_filter
    from geolens.testing import tiny_bridge

    model = tiny_bridge("gqa")
    tokens = model.to_tokens(["the cat", "a dog sat here"])  # right-padded with the pad id
    with pytest.raises(ValueError, match="looks padded .* attention_mask"):
        geolens.run_with_cache(model, tokens)
    mask = (tokens != model.tokenizer.pad_token_id).long()
    mask[:, 0] = 1
    _, cache = geolens.run_with_cache(model, tokens, attention_mask=mask, names_filter=geolens.names_filter(model))
    _, cache = geolens.run_with_cache(model, tokens[1:], names_filter=flow_names_filter(model))
    with pytest.raises(ValueError, match="looks padded"):
        contribution_flow(model, cache, tokens=torch.cat([tokens[1:], tokens[:1]]))


@pytest.mark.bridge_only  # builds the TL 4.x tiny bridge
def test_a_cache_of_another_model_is_refused():
    import geolens
    from geolens.testing import tiny_bridge

    model, twin, other = tiny_bridge("gqa"), tiny_bridge("gqa"), tiny_bridge("gqa", seed=1)
    tokens = model.to_tokens("the cat sat on the mat")
    _, cache = geolens.run_with_cache(model, tokens, names_filter=geolens.names_filter(model))
    reference = geolens.contribution_weights(model, cache, layer=0)
    assert torch.equal(geolens.contribution_weights(twin, cache, layer=0), reference)  # same weights: fine
    with pytest.raises(ValueError, match="the cache was made by another model: its weights fingerprint") as err:
        geolens.contribution_weights(other, cache, layer=0)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="another model"):
        geolens.attention_metrics(other, cache, layer=1)
    bf16 = tiny_bridge("gqa").to(torch.bfloat16)
    with pytest.raises(ValueError, match="made by a model in torch.float32, this model is torch.bfloat16"):
        geolens.contribution_weights(bf16, cache, layer=0)
    # the limit, documented: TransformerLens' own run_with_cache stamps nothing, so this goes unseen
    _, unstamped = model.run_with_cache(tokens, names_filter=geolens.names_filter(model))
    geolens.contribution_weights(other, unstamped, layer=0)


def test_a_cache_of_another_model_on_the_hf_backend():
    import geolens
    from geolens.hf import prepare
    from geolens.hf.tiny import tiny_family

    model, other = prepare(tiny_family("gpt2")), prepare(tiny_family("gpt2", seed=1))
    _, cache = geolens.run_with_cache(
        model, torch.tensor([[0, 5, 9, 4, 7, 8]]), names_filter=geolens.names_filter(model)
    )
    assert isinstance(cache, dict) and cache.geolens_stamp.fingerprint == geolens.validation.weights_fingerprint(model)
    with pytest.raises(ValueError, match="another model"):
        geolens.contribution_weights(other, cache, layer=1)


def test_per_term_effects_blames_bfloat16_rounding_not_the_kv_cache():
    from geolens.per_term import _check_reference

    clean = torch.tensor([1.0, 2.0, 3.0])
    row = clean + torch.tensor([0.0, 0.05, 0.0])  # off by a bfloat16 ulp, far beyond float32's tolerance
    with pytest.raises(RuntimeError, match="runs in bfloat16, whose rounding .* need a float32 model"):
        _check_reference(row, clean, 0, 5, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="KV cache or positions"):
        _check_reference(row, clean, 0, 5, dtype=torch.float32)
    _check_reference(clean, clean, 0, 5, dtype=torch.bfloat16)


def test_lock_file_is_never_a_result(tmp_path):
    out = tmp_path / "out"
    folder = run_folder.open_run_folder(out, command="test")
    assert (out / LOCK).is_file() and json.loads((out / LOCK).read_text())["pid"] == os.getpid()
    (out / "a.csv").write_text("1")
    assert folder.written() == ["a.csv"]
    run_folder.complete_all()
    assert sorted(json.loads((out / MANIFEST).read_text())["files"]) == ["a.csv"] and not (out / LOCK).exists()
    run_folder.forget_all()
    stale = tmp_path / "stale"  # a folder holding only a stale lock (its run was killed at once)
    stale.mkdir()
    (stale / LOCK).write_text(json.dumps({"pid": 999999999, "command": "geolens test"}))
    assert folder_state(stale) == "empty"
    run_folder.open_run_folder(stale, command="test")  # no --overwrite needed: it holds no results
    assert run_folder.leave_all() == ["nothing written"] and list(stale.iterdir()) == []


def test_stale_lock_without_flock_is_recognised_from_its_pid(tmp_path, monkeypatch):
    """On a file system without flock the pid decides: a dead process's lock is taken over, a live
    one's refused."""
    import fcntl

    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    out = tmp_path / "out"
    out.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=TIMEOUT)
    (out / LOCK).write_text(json.dumps({"pid": dead.pid, "command": "geolens sinks", "started": time.time()}))
    run_folder.open_run_folder(out, command="test")
    run_folder.leave_all()
    (out / LOCK).write_text(json.dumps({"pid": os.getppid(), "command": "geolens sinks", "started": time.time()}))
    with pytest.raises(run_folder.FolderInUse, match=f"process {os.getppid()} \\(geolens sinks"):
        run_folder.open_run_folder(out, command="test")


# --- a hostile folder: nothing outside it is touched, no symbolic link is followed (issue #46) ---------


def geolens_process(*args: str, cwd: Path, env: dict | None = None) -> tuple[int, list[str]]:
    """``python -m geolens ARGS`` in a real process: (exit code, stderr lines without progress bars)."""
    proc = subprocess.run(
        [sys.executable, "-m", "geolens", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", **(env or {})},
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc.returncode, lines_of(proc.stderr)


def flow_process(out: Path, *extra: str) -> tuple[int, list[str]]:
    return geolens_process("flow", "--model", "tiny-gqa", "the cat", "--out", str(out), *extra, cwd=out.parent)


def finished_folder(out: Path) -> None:
    """A complete result folder (one file and its manifest), written in-process."""
    run_folder.forget_all()
    run_folder.open_run_folder(out, command="flow")
    (out / "flow.json").write_text("{}")
    run_folder.complete_all()
    run_folder.forget_all()


@pytest.mark.parametrize("name", [LOCK, INCOMPLETE])
def test_a_symlinked_lock_or_marker_is_refused_and_never_written_through(tmp_path, name):
    """Before: `.geolens-lock` → victim.txt: exit 0 and victim.txt held the lock's JSON (a symlinked
    INCOMPLETE likewise with --overwrite)."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "R1"
    out.mkdir()
    (out / name).symlink_to(victim)
    rc, err = flow_process(out, *(["--overwrite"] if name == INCOMPLETE else []))
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith(f"geolens flow: error: --out {out}: {out / name} is a symbolic link (to {victim})"), err
    assert victim.read_text() == "precious" and (out / name).is_symlink()
    assert sorted(p.name for p in out.iterdir()) == [name]  # nothing written


@pytest.mark.parametrize("entry", ["../parent_victim.txt", "sub/link/precious.txt"])
def test_overwrite_never_moves_a_manifest_entry_outside_the_folder(tmp_path, entry):
    """Before: `--overwrite` moved `../parent_victim.txt`, or `link/precious.txt` through a symlinked
    folder, into its stash and deleted it."""
    out = tmp_path / "R"
    finished_folder(out)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious.txt").write_text("precious")
    (tmp_path / "parent_victim.txt").write_text("parent")
    (out / "sub").mkdir()
    (out / "sub" / "link").symlink_to(elsewhere)  # below the folder's top: not refused as a link leading out
    manifest = json.loads((out / MANIFEST).read_text())
    manifest["files"][entry] = {"bytes": 8, "sha256": "0" * 64}
    (out / MANIFEST).write_text(json.dumps(manifest))
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    rc, err = flow_process(out, "--overwrite")
    assert rc == 2 and len(err) == 1, err
    why = "points outside" if entry.startswith("..") else "lies behind a symbolic link"
    assert f"manifest.json entry '{entry}' {why}" in err[0] and err[0].endswith("nothing was changed"), err
    assert (elsewhere / "precious.txt").read_text() == "precious"
    assert (tmp_path / "parent_victim.txt").read_text() == "parent"
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == before  # nothing moved, no stash


def test_overwrite_never_moves_a_marker_entry_outside_the_folder(tmp_path):
    """An interrupted run's INCOMPLETE listing `../victim.txt` as written (before: moved and deleted)."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "R"
    out.mkdir()
    (out / "flow.json").write_text("{}")
    (out / INCOMPLETE).write_text("geolens flow started\n" + json.dumps({"written": ["../victim.txt"], "started": 0}))
    rc, err = flow_process(out, "--overwrite")
    assert rc == 2 and len(err) == 1, err
    assert "INCOMPLETE entry '../victim.txt' points outside" in err[0], err
    assert victim.read_text() == "precious" and (out / "flow.json").read_text() == "{}"


def test_a_link_at_the_top_of_the_folder_leading_out_is_refused(tmp_path):
    """`flow.json` → a file elsewhere: a writer opening it by name would write there."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "R"
    out.mkdir()
    (out / "flow.json").symlink_to(victim)
    rc, err = flow_process(out, "--overwrite")
    assert rc == 2 and len(err) == 1, err
    assert f"flow.json is a symbolic link to {victim}, outside the folder" in err[0], err
    assert victim.read_text() == "precious"


def test_a_model_name_leading_out_of_the_folder_is_refused_before_the_model_loads(tmp_path):
    """Before: `geolens report --model .. --model tiny-gqa --out R2` wrote report.html and report.json
    into the parent folder (`_safe("..") == ".."`); `..` is a checkpoint folder here (config.json)."""
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "report.html").write_text("mine")
    work = tmp_path / "work"
    work.mkdir()
    corpus = write_corpus(tmp_path / "c.txt")  # a file: the offline corpora need gensim, absent from some venvs
    rc, err = geolens_process(
        "report", "--model", "..", "--model", "tiny-gqa", "--corpus", corpus, "--out", "R2", "--quick", cwd=work
    )
    assert rc == 2 and len(err) == 1, err
    assert err[0] == (
        "geolens report: error: --model ..: its sub-folder '..' cannot name a file or folder inside the results: "
        "'..' is the folder above; give its folder by another path (../NAME)"
    )
    assert (tmp_path / "report.html").read_text() == "mine" and not (tmp_path / "report.json").exists()
    assert list(work.iterdir()) == []  # the folder opened for the run is removed again


@pytest.mark.parametrize("name", ["", ".", "..", "/abs", "a/b", "a\0b"])
def test_names_from_user_input_are_plain_names(name):
    from geolens.errors import UsageError
    from geolens.files import UnsafePath, check_name

    with pytest.raises(UnsafePath, match=f"^--name {re.escape(repr(name))} cannot name a file or folder") as err:
        check_name(name, what="--name")
    assert isinstance(err.value, UsageError) and "\n" not in str(err.value)
    assert check_name("run-1.b", what="--name") == "run-1.b"


def test_a_dotdot_run_name_is_refused_in_a_real_process(tmp_path):
    rc, err = geolens_process("flow", "--model", "tiny-gqa", "the cat", "--name", "..", cwd=tmp_path)
    assert rc == 2 and err == [
        "geolens flow: error: --name '..' cannot name a file or folder inside the results: '..' is the folder "
        "above; use a plain name such as 'run1'"
    ]
    assert not (tmp_path / "geolens-runs" / "flow.json").exists()


def test_cache_clear_on_a_symlinked_model_folder_is_one_line_and_keeps_its_target(tmp_path):
    """Before: an 18-line traceback (`Cannot call rmtree on a symbolic link`)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "model.safetensors").write_text("weights")
    models = tmp_path / "cache" / "models"
    models.mkdir(parents=True)
    (models / "smollm2-135m-f32").symlink_to(elsewhere)
    rc, err = geolens_process("cache", "clear", cwd=tmp_path, env={"GEOLENS_CACHE": str(tmp_path / "cache")})
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith(f"geolens cache: error: {models / 'smollm2-135m-f32'} is a symbolic link (to {elsewhere})")
    assert (elsewhere / "model.safetensors").read_text() == "weights" and (models / "smollm2-135m-f32").is_symlink()


def test_a_symlinked_stash_is_refused_before_anything_moves(tmp_path):
    """The hidden `.geolens-previous-<pid>` folder, put there as a link (its pid guessed)."""
    out = tmp_path / "R"
    finished_folder(out)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (out / f"{run_folder.STASH_PREFIX}{os.getpid()}").symlink_to(out / "sub", target_is_directory=True)
    (out / "sub").mkdir()
    with pytest.raises(UnsafePath, match="is a symbolic link"):
        run_folder.open_run_folder(out, command="flow", overwrite=True)
    run_folder.leave_all()
    assert (out / "flow.json").read_text() == "{}" and list((out / "sub").iterdir()) == []


# --- the API refuses what it cannot compute right (issue #46) ----------------------------------------


def _hf_tiny():
    import geolens.hf
    from geolens.hf.tiny import tiny_family
    from geolens.testing import tiny_tokenizer

    return geolens.hf.prepare(tiny_family("llama"), tokenizer=tiny_tokenizer())  # bos 0, eos 1, pad 2


@pytest.mark.parametrize("case", ["equally_left_padded", "one_row_padded", "pads_before_bos"])
def test_pads_before_the_first_real_token_are_refused_without_a_mask(case):
    """Before: refused only when the rows' pad runs differed; the logits were then off (0.018)."""
    import geolens
    from geolens.sinks.norm_curve import NormCurve

    model = _hf_tiny()
    tokens = {
        "equally_left_padded": torch.tensor([[2, 2, 0, 4, 5, 6], [2, 2, 0, 7, 8, 9]]),
        "one_row_padded": torch.tensor([[2, 2, 0, 4, 5, 6]]),
        "pads_before_bos": torch.tensor([[2, 0, 4, 5, 6], [2, 0, 7, 8, 9]]),
    }[case]
    for call in (
        lambda: geolens.run_with_cache(model, tokens),
        lambda: geolens.run_corpus(model, tokens, [NormCurve(model.cfg.n_layers, model.cfg.n_heads)], progress=False),
    ):
        with pytest.raises(
            ValueError, match=r"^the batch looks padded \(rows \[0.*start with pad tokens, id 2.*attention_mask="
        ) as err:
            call()
        assert "\n" not in str(err.value)
    mask = (tokens != 2).long()
    logits, _ = geolens.run_with_cache(model, tokens, attention_mask=mask)
    alone, _ = geolens.run_with_cache(model, tokens[:1, mask[0].bool()])
    torch.testing.assert_close(logits[0, mask[0].bool()], alone[0], atol=1e-5, rtol=1e-5)
    geolens.run_with_cache(model, torch.tensor([[0, 4, 5, 2, 2]]))  # equal right padding stays allowed (causal)


@pytest.mark.parametrize(
    "case, error, message",
    [
        ("float", TypeError, "tokens must hold integer token ids, got a torch.float32 Tensor"),
        ("empty", ValueError, "tokens is empty (shape (1, 0))"),
        ("outside", IndexError, "tokens holds the id 64 at [0, 2], outside the model's vocabulary of 64 ids (0…63)"),
        ("negative", IndexError, "tokens holds the id -1 at [0, 1], outside the model's vocabulary"),
    ],
)
@pytest.mark.parametrize("entry", ["run_with_cache", "run_corpus"])
def test_token_tensors_must_be_integer_non_empty_and_inside_the_vocabulary(case, error, message, entry):
    """Before: `The size of tensor a (32) must match …`, `cannot reshape tensor of 0 elements …`,
    `index out of range in self`, from deep inside torch."""
    import geolens
    from geolens.sinks.norm_curve import NormCurve

    model = _hf_tiny()
    tokens = {
        "float": torch.tensor([[0.0, 4.0, 5.0]]),
        "empty": torch.zeros(1, 0, dtype=torch.long),
        "outside": torch.tensor([[0, 4, 64]]),
        "negative": torch.tensor([[0, -1, 3]]),
    }[case]
    with pytest.raises(error) as err:
        if entry == "run_with_cache":
            geolens.run_with_cache(model, tokens)
        else:
            geolens.run_corpus(model, tokens, [NormCurve(model.cfg.n_layers, model.cfg.n_heads)], progress=False)
    assert str(err.value).startswith(message) and "\n" not in str(err.value), str(err.value)


@pytest.mark.bridge_only  # attribute and evaluate_attribution on the TL 4.x tiny bridge
@pytest.mark.parametrize("shape", ["b_h_q", "b_h_q_1", "per_sequence"])
def test_a_metric_of_the_wrong_shape_is_refused_in_one_line(shape):
    """Before: `[b, h, q, 1]` was scored by evaluate_attribution and plotted by attribute as if it
    ranked tokens; `[b, h, q]` ended in a torch traceback."""
    import geolens
    from geolens.metrics import unregister_metric
    from geolens.testing import tiny_bridge

    fn = {
        "b_h_q": lambda x: x.alpha.sum(-1),
        "b_h_q_1": lambda x: x.alpha.sum(-1, keepdim=True),
        "per_sequence": lambda x: torch.ones(len(x.layers), x.heads, x.tokens.shape[1]),
    }[shape]
    geolens.register_metric("wrong_shape", label="wrong", fn=fn, per_layer=shape != "per_sequence")
    try:
        model = tiny_bridge("gqa")
        calls = [lambda: geolens.attribute(model, "the cat sat", "wrong_shape", layer=1)]
        if shape != "per_sequence":  # evaluate_attribution takes term-level (per-layer) metrics only
            calls.append(lambda: geolens.evaluate_attribution("wrong_shape", model, ["the cat sat on the mat."]))
        for call in calls:
            with pytest.raises(
                ValueError, match=r"^metric 'wrong_shape' returned scores of shape \[.*\]: expected \["
            ) as err:
                call()
            assert "\n" not in str(err.value)
    finally:
        unregister_metric("wrong_shape")


@pytest.mark.bridge_only  # attribute and evaluate_attribution on the TL 4.x tiny bridge
def test_a_metric_returning_numpy_is_converted():
    """Before: `_sum() got an unexpected keyword argument 'keepdim'` (attribute) and
    `'numpy.ndarray' object has no attribute 'double'` (evaluate_attribution)."""
    import geolens
    from geolens.metrics import unregister_metric
    from geolens.testing import tiny_bridge

    geolens.register_metric("as_numpy", label="numpy", fn=lambda x: (x.alpha * x.value_norm).detach().cpu().numpy())
    try:
        model = tiny_bridge("gqa")
        for kwargs in (dict(layer=1), dict(layer=1, head=2)):
            mine = geolens.attribute(model, "the cat sat", "as_numpy", **kwargs)
            reference = geolens.attribute(model, "the cat sat", "value_weighted", **kwargs)
            torch.testing.assert_close(mine.scores, reference.scores)
        texts = ["the cat sat on the mat.", "a dog ran far away!"]
        mine = geolens.evaluate_attribution("as_numpy", model, texts, n_boot=20)
        reference = geolens.evaluate_attribution("value_weighted", model, texts, n_boot=20)
        assert mine.partial == pytest.approx(reference.partial, abs=1e-9)
    finally:
        unregister_metric("as_numpy")


@pytest.mark.bridge_only  # attribute on the TL 4.x tiny bridge
def test_nan_in_the_weights_or_the_scores_is_named_not_returned():
    """Before: all-NaN scores, without a word."""
    import geolens
    from geolens.metrics import unregister_metric
    from geolens.testing import tiny_bridge

    model = tiny_bridge("gqa")
    geolens.register_metric("gives_nan", label="nan", fn=lambda x: x.alpha * float("nan"))
    try:
        with pytest.raises(ValueError, match=r"^the scores of metric 'gives_nan' hold NaN at layer 1, batch 0, head 0"):
            geolens.attribute(model, "the cat sat", "gives_nan", layer=1)
    finally:
        unregister_metric("gives_nan")
    with torch.no_grad():
        next(p for name, p in model.named_parameters() if "q_proj" in name).data[0, 0] = float("nan")
    for method, where in (("alti", "layer 0, batch 0"), ("attention_rollout", "layer 0, batch 0")):
        with pytest.raises(
            ValueError, match=rf"^the shares of contribution_flow\('{method}'\) hold NaN at {where}"
        ) as err:
            geolens.attribute(model, "the cat sat", method)
        assert "the model's weights hold NaN or inf: model.layers.0.self_attn.q_proj.weight (1 of" in str(err.value)
        assert "\n" not in str(err.value)
    with pytest.raises(
        ValueError, match=r"^the scores of metric 'contribution' hold NaN at layer 1, .*attention weights"
    ):
        geolens.attribute(model, "the cat sat", "contribution", layer=1)


def test_hf_to_tokens_warns_when_it_truncates():
    """Before: `to_tokens(truncate=True)` of the HF-native backend cut the text without a word."""
    model = _hf_tiny()
    with pytest.warns(UserWarning, match="241 tokens long: truncated to the model's context, its first 128 tokens"):
        assert tuple(model.to_tokens(LONG, truncate=True).shape) == (1, 128)
