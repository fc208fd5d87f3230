"""Result folders (geolens.run_folder) and the command line's handling of interrupts and write errors.

- every command writes under geolens-runs/<command>/… by default: a clone's ``git status`` stays clean;
- a folder holding results is refused without --overwrite (one line, exit 2), replaced with it;
- INCOMPLETE first, manifest.json last; readers refuse incomplete or damaged folders;
- SIGINT/SIGTERM at several points: nothing left, or a folder marked incomplete, exit 130/143,
  one line, no traceback; an interrupt once the results are complete exits 0;
- a full disk (ENOSPC) is one line naming the path, and the last checkpoint stays intact.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import make_tiny

from geolens import run_folder
from geolens.cli import main
from geolens.run_folder import INCOMPLETE, MANIFEST, folder_state, require_complete

pytestmark = pytest.mark.tl_agnostic  # folders, signals, write errors: run on TL 2.x in .venvs/min

ROOT = Path(__file__).resolve().parents[1]


def write_corpus(path: Path, seed: int = 0, n_docs: int = 8) -> str:
    rng = np.random.default_rng(seed)
    words = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "far", "away", "news", "today"]
    path.write_text("\n\n".join(" ".join(rng.choice(words, 60)) + "." for _ in range(n_docs)), encoding="utf-8")
    return str(path)


def run_cli(argv, capsys):
    capsys.readouterr()
    rc = main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    progress = ("it/s]", "s/it]", "%|")  # tqdm bars share stderr
    return rc, [
        line for line in err.replace("\r", "\n").splitlines() if line.strip() and not any(p in line for p in progress)
    ]


@pytest.fixture
def tiny_everywhere(monkeypatch):
    """Every model a command loads is the tiny GQA model (commands that take only real names)."""
    import geolens.models

    model = make_tiny("gqa")
    monkeypatch.setattr(geolens.models, "load_model", lambda name, **kw: model)
    return model


# --- the folder itself ------------------------------------------------------------------------------


def test_default_folder_is_under_geolens_runs_and_never_reused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = run_folder.default_folder("taxonomy")
    assert first.parts[:2] == ("geolens-runs", "taxonomy") and len(first.name) == len("20261205-101010")
    first.mkdir(parents=True)
    second = run_folder.default_folder("taxonomy")
    assert second != first and second.name.startswith(first.name)
    assert run_folder.default_folder("taxonomy", "mine") == Path("geolens-runs/taxonomy/mine")


@pytest.fixture(autouse=True)
def _no_open_folders():
    run_folder.forget_all()
    yield
    run_folder.forget_all()


def test_complete_writes_a_manifest_of_every_file_and_removes_the_marker(tmp_path):
    folder = run_folder.open_run_folder(tmp_path / "out", command="test")
    assert (folder.path / INCOMPLETE).is_file() and folder_state(folder.path) == "incomplete"
    (folder.path / "a.csv").write_text("x\n1\n")
    (folder.path / "sub").mkdir()
    (folder.path / "sub" / "b.json").write_text("{}")
    run_folder.complete_all()
    manifest = json.loads((folder.path / MANIFEST).read_text())
    assert sorted(manifest["files"]) == ["a.csv", "sub/b.json"] and manifest["command"] == "geolens test"
    assert manifest["files"]["a.csv"]["bytes"] == 4
    assert not (folder.path / INCOMPLETE).exists() and folder_state(folder.path, contents=True) == "complete"
    assert require_complete(folder.path) == folder.path
    # every run records the commit it ran from (one that exists) and whether the tree was clean
    import subprocess

    assert manifest["working_tree"] in ("clean", "dirty")
    root = run_folder.__file__.rsplit("/geolens/", 1)[0]
    check = subprocess.run(["git", "-C", root, "cat-file", "-e", f"{manifest['run_commit']}^{{commit}}"])
    assert check.returncode == 0


def test_readers_refuse_incomplete_and_damaged_folders(tmp_path):
    folder = run_folder.open_run_folder(tmp_path / "out", command="test")
    (folder.path / "a.csv").write_text("1")
    run_folder.leave_all()
    with pytest.raises(run_folder.IncompleteResults, match="incomplete") as err:
        require_complete(folder.path)
    assert "\n" not in str(err.value)
    (folder.path / INCOMPLETE).unlink()
    folder = run_folder.open_run_folder(tmp_path / "out", command="test", overwrite=True)
    (folder.path / "a.csv").write_text("1")
    run_folder.complete_all()
    (folder.path / "a.csv").write_text("2")  # same size, other content
    with pytest.raises(run_folder.IncompleteResults, match="a.csv was altered"):
        require_complete(folder.path)


def test_overwrite_removes_the_previous_runs_files_only(tmp_path):
    out = tmp_path / "out"
    run_folder.open_run_folder(out, command="test")
    (out / "old.csv").write_text("old")
    run_folder.complete_all()
    (out / "notes.txt").write_text("the user's own file")  # not part of the run
    run_folder.open_run_folder(out, command="test", overwrite=True)
    assert not (out / "old.csv").exists() and (out / "notes.txt").exists()
    (out / "new.csv").write_text("new")
    run_folder.complete_all()
    assert sorted(json.loads((out / MANIFEST).read_text())["files"]) == ["new.csv"]  # not the user's file
    run_folder.forget_all()
    run_folder.open_run_folder(out, command="test", overwrite=True)
    run_folder.complete_all()
    assert (out / "notes.txt").read_text() == "the user's own file" and not (out / "new.csv").exists()


def test_overwrite_keeps_the_previous_results_until_the_new_run_writes(tmp_path):
    """An --overwrite run that stops before writing (a usage error after opening, an early
    interrupt) puts the previous complete results back, as they were."""
    out = tmp_path / "out"
    run_folder.open_run_folder(out, command="test")
    (out / "a.csv").write_text("a")
    (out / "sub").mkdir()
    (out / "sub" / "b.csv").write_text("b")
    run_folder.complete_all()
    run_folder.forget_all()
    manifest = (out / MANIFEST).read_bytes()
    run_folder.open_run_folder(out, command="test", overwrite=True)
    assert not (out / "a.csv").exists() and folder_state(out) == "incomplete"  # moved aside meanwhile
    assert run_folder.leave_all() == ["nothing written; the previous results are kept"]
    assert (out / MANIFEST).read_bytes() == manifest and require_complete(out) == out
    assert sorted(p.name for p in out.iterdir()) == ["a.csv", MANIFEST, "sub"]


def test_a_run_that_writes_nothing_leaves_an_existing_folder_as_it_was(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    run_folder.open_run_folder(empty, command="test")
    assert run_folder.leave_all() == ["nothing written"] and list(empty.iterdir()) == []
    run_folder.forget_all()
    multi = tmp_path / "multi"  # a report over two models makes a sub-folder per model first
    run_folder.open_run_folder(multi, command="report")
    (multi / "model-a").mkdir()
    (multi / "model-b").mkdir()
    assert run_folder.leave_all() == ["nothing written"] and not multi.exists()


def test_a_folder_inside_an_incomplete_run_is_refused(tmp_path):
    out = tmp_path / "multi"
    run_folder.open_run_folder(out, command="report")
    (out / "model-a").mkdir()
    (out / "model-a" / "report.json").write_text("{}")
    run_folder.leave_all()
    with pytest.raises(run_folder.IncompleteResults, match="inside"):
        require_complete(out / "model-a")


def test_overwrite_of_an_interrupted_run_keeps_files_added_after_it(tmp_path):
    out = tmp_path / "out"
    run_folder.open_run_folder(out, command="test")
    (out / "partial.csv").write_text("p")
    run_folder.leave_all()
    run_folder.forget_all()
    (out / "notes.txt").write_text("added by the user after the interrupt")
    run_folder.open_run_folder(out, command="test", overwrite=True)
    (out / "new.csv").write_text("n")
    run_folder.complete_all()
    assert (out / "notes.txt").exists() and not (out / "partial.csv").exists()
    assert sorted(json.loads((out / MANIFEST).read_text())["files"]) == ["new.csv"]


def test_open_folders_are_per_thread(tmp_path):
    import threading

    run_folder.open_run_folder(tmp_path / "main", command="test")
    seen = []
    thread = threading.Thread(target=lambda: seen.append(run_folder.open_folders()))
    thread.start()
    thread.join()
    assert seen == [[]] and len(run_folder.open_folders()) == 1


@pytest.mark.parametrize("interrupted", [False, True])
def test_overwrite_never_deletes_files_geolens_did_not_write(tmp_path, interrupted):
    """--out pointed at a folder of someone else's files (a home folder, a project root)."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    (out / "data").mkdir()
    (out / "data" / "x.csv").write_text("1,2")
    run_folder.forget_all()
    run_folder.open_run_folder(out, command="test", overwrite=True)
    (out / "result.csv").write_text("r")
    (out / "data" / "x.csv").write_text("3,4")  # a file the run rewrote is the run's
    run_folder.leave_all() if interrupted else run_folder.complete_all()
    run_folder.forget_all()
    if not interrupted:
        assert sorted(json.loads((out / MANIFEST).read_text())["files"]) == ["data/x.csv", "result.csv"]
    run_folder.open_run_folder(out, command="test", overwrite=True)  # replaces the run's files only
    run_folder.complete_all()
    run_folder.forget_all()
    assert (out / "thesis.tex").read_text() == "years of work" and not (out / "result.csv").exists()
    assert not [p for p in out.iterdir() if p.name.startswith(run_folder.STASH_PREFIX)]


def test_a_usage_error_after_opening_leaves_nothing(tmp_path, capsys):
    out = tmp_path / "a" / "b"
    rc, err = run_cli(
        ["taxonomy", "--model", "tiny-gqa", "--corpora", str(tmp_path / "missing.txt"), "--out", str(out)], capsys
    )
    assert rc == 2 and len(err) == 1 and not (tmp_path / "a").exists()


# --- every command, with its default output folder, in a clone ----------------------------------------


@pytest.mark.bridge_only
def test_every_command_with_its_defaults_leaves_a_clone_clean(tmp_path, monkeypatch, capsys, tiny_everywhere):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--shared", str(ROOT), str(clone)], check=True, timeout=120)
    corpus = write_corpus(tmp_path / "corpus.txt")
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps(dict(prompt="the cat sat on the", choices=["mat", "dog"], answer=0)) + "\n")
    monkeypatch.chdir(clone)
    small = ["--n-sequences", "2", "--seq-len", "16"]
    commands = {
        "analyze": ["analyze", "the cat sat on the mat"],
        "cache": ["cache", "path"],
        "taxonomy": ["taxonomy", "--model", "tiny-gqa", "--corpora", corpus, *small, "--prefix-lengths", "8"],
        "selection": ["selection", "--model", "tiny-gqa", "--corpora", corpus, *small, "--nstar-sequences", "0"],
        "sinks": [
            "sinks",
            "--corpus",
            corpus,
            *small,
            "--drift-sequences",
            "0",
            "--controls-sequences",
            "0",
            "--min-count",
            "1",
        ],
        "pruning": ["pruning", "--corpus", corpus, *small],
        "faithfulness": ["faithfulness", "--corpus", corpus, *small, "--fractions", "0.5", "--n-boot", "20"],
        "mc": ["mc", "--tasks", str(questions), "--n-boot", "20"],
        "flow": ["flow", "the cat sat", "--model", "tiny-gqa", "--name", "default"],  # writes only with --out / --name
        "report": [
            "report",
            "--model",
            "tiny-gqa",
            "--quick",
            "--corpus",
            corpus,
            "--n-sequences",
            "2",
            "--seq-len",
            "16",
            "--no-progress",
        ],
    }
    from geolens.cli import build_parser

    registered = set(build_parser()._subparsers._group_actions[0].choices)
    assert registered == set(commands), registered ^ set(commands)  # a new command is added here too
    commands["pruning"] += ["--seeds", "0", "--retention", "0.5", "--ref-sequences", "2", "--scan-sequences", "0"]
    for name, argv in commands.items():
        rc, err = run_cli(argv, capsys)
        assert rc == 0, (name, err)
    status = subprocess.run(
        ["git", "status", "--porcelain", "--ignored=no"], cwd=clone, capture_output=True, text=True, check=True
    )
    assert status.stdout == "", status.stdout
    runs = sorted(p.relative_to(clone / "geolens-runs").parts[0] for p in (clone / "geolens-runs").glob("*/*"))
    assert runs == sorted(set(commands) - {"analyze", "cache"})
    for folder in (clone / "geolens-runs").glob("*/*"):
        assert require_complete(folder) == folder  # each one complete, with its manifest
    # the same folder again, without --overwrite: one line, exit 2, nothing changed
    target = ["--name", "again"]
    assert run_cli(commands["taxonomy"] + target, capsys)[0] == 0
    before = (clone / "geolens-runs/taxonomy/again" / MANIFEST).read_bytes()
    rc, err = run_cli(commands["taxonomy"] + target, capsys)
    assert rc == 2 and len(err) == 1 and "--overwrite" in err[0] and "already holds the complete results" in err[0]
    assert (clone / "geolens-runs/taxonomy/again" / MANIFEST).read_bytes() == before
    assert run_cli(commands["taxonomy"] + target + ["--overwrite"], capsys)[0] == 0


# --- interrupts ---------------------------------------------------------------------------------------


def _interrupt_at(monkeypatch, target: str, attribute: str, *, after_calls: int = 0, signum=signal.SIGINT):
    """Make ``target.attribute`` raise the CLI's Interrupted (as the signal handler does) on call ``after_calls + 1``."""
    import importlib

    from geolens.cli import Interrupted

    module = importlib.import_module(target)
    real = getattr(module, attribute)
    calls = {"n": 0}

    def wrapper(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > after_calls:
            raise Interrupted(signum)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, attribute, wrapper)


def _taxonomy(tmp_path, out):
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
    ]


@pytest.mark.parametrize(
    "where, state, code",
    [
        (("geolens.models", "load_model", 0, signal.SIGINT), "absent", 130),  # during the model load
        (("geolens.pipelines", "write_tables", 1, signal.SIGINT), "incomplete", 130),  # after some tables
        (("geolens.pipelines", "write_tables", 1, signal.SIGTERM), "incomplete", 143),
        (("geolens.viz.taxonomy", "save_regime_grid_html", 0, signal.SIGINT), "incomplete", 130),  # near the end
    ],
)
def test_interrupt_leaves_nothing_or_an_incomplete_folder(tmp_path, monkeypatch, capsys, where, state, code):
    module, attribute, after, signum = where
    _interrupt_at(monkeypatch, module, attribute, after_calls=after, signum=signum)
    if module == "geolens.pipelines":
        import geolens.commands.taxonomy  # noqa: F401 - imports write_tables at call time from geolens.pipelines
    out = tmp_path / "runs" / "tax"
    rc, err = run_cli(_taxonomy(tmp_path, out), capsys)
    assert rc == code and len(err) == 1 and "Traceback" not in " ".join(err)
    assert err[0].startswith("geolens taxonomy: interrupted; ")
    assert folder_state(out) == state
    if state == "absent":
        assert "nothing written" in err[0] and not (tmp_path / "runs").exists()
    else:
        assert f"partial results in {out} (incomplete" in err[0]
        with pytest.raises(run_folder.IncompleteResults):
            require_complete(out)


def test_interrupt_during_an_overwrite_never_mixes_two_runs(tmp_path, monkeypatch, capsys):
    out = tmp_path / "tax"
    argv = _taxonomy(tmp_path, out)
    assert run_cli(argv, capsys)[0] == 0
    _interrupt_at(monkeypatch, "geolens.pipelines", "write_tables", after_calls=1)
    rc, err = run_cli(argv + ["--overwrite"], capsys)
    assert rc == 130 and folder_state(out) == "incomplete" and not (out / MANIFEST).exists()


def test_interrupt_once_the_results_are_complete_exits_0(tmp_path, monkeypatch, capsys):
    real = run_folder.complete_all

    def complete_then_interrupt():
        real()
        from geolens.cli import Interrupted

        raise Interrupted(signal.SIGINT)

    monkeypatch.setattr(run_folder, "complete_all", complete_then_interrupt)
    out = tmp_path / "tax"
    rc, err = run_cli(_taxonomy(tmp_path, out), capsys)
    assert rc == 0 and len(err) == 1 and "after the results were complete" in err[0]
    assert folder_state(out, contents=True) == "complete"


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_real_signal_to_a_running_command(tmp_path, signum, code):
    """A real signal to a command that is writing: one line, exit 130/143, the folder marked incomplete."""
    out = tmp_path / "tax"
    script = (
        "import sys, time, geolens.pipelines as p\n"
        "real = p.write_tables\n"
        "def slow(*a, **k):\n"
        "    real(*a, **k); print('wrote', flush=True); time.sleep(60)\n"
        "p.write_tables = slow\n"
        "from geolens.cli import main\n"
        f"sys.exit(main({_taxonomy(tmp_path, out)!r}))\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path
    )
    try:
        line = proc.stdout.readline()
        assert line.strip() == "wrote", (line, proc.stderr.read() if proc.poll() is not None else "")
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = [
        l
        for l in err.replace("\r", "\n").splitlines()
        if l.strip() and not any(p in l for p in ("it/s]", "s/it]", "%|"))
    ]
    assert proc.returncode == code, err
    assert "Traceback" not in err and lines == [
        f"geolens taxonomy: interrupted; partial results in {out} (incomplete)"
    ], err
    assert folder_state(out) == "incomplete"


# --- write errors -------------------------------------------------------------------------------------


def test_full_disk_while_writing_results_is_one_line(tmp_path, monkeypatch, capsys):
    import geolens.pipelines

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "tax" / "heads_c.csv"))

    monkeypatch.setattr(geolens.pipelines, "write_tables", full)
    out = tmp_path / "tax"
    rc, err = run_cli(_taxonomy(tmp_path, out), capsys)
    assert rc == 1 and len(err) == 1 and "Traceback" not in err[0]
    assert (
        "No space left on device" in err[0] and str(out / "heads_c.csv") in err[0] and "free some disk space" in err[0]
    )


def test_full_disk_while_writing_a_checkpoint_keeps_the_last_one(tmp_path, monkeypatch):
    """run_corpus(..., checkpoint=): an ENOSPC write fails with one line; the saved checkpoint
    is intact and a resume from it gives the uninterrupted run's numbers."""
    from geolens import checkpoint as ckpt
    from geolens.runner import run_corpus
    from geolens.sinks.norm_curve import NormCurve

    model = make_tiny("gqa")
    torch.manual_seed(0)
    tokens = torch.randint(1, model.cfg.d_vocab, (6, 12))
    tokens[:, 0] = 0
    whole = run_corpus(model, tokens, [NormCurve(2, 4)], batch_size=2, progress=False)[0].state_dict()
    path = tmp_path / "run.ckpt"
    real_fdopen = os.fdopen
    calls = {"n": 0}

    class Full:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

    def fdopen(fd, mode="r", *args, **kwargs):
        f = real_fdopen(fd, mode, *args, **kwargs)
        calls["n"] += 1
        return Full(f) if calls["n"] == 2 else f  # the second checkpoint write hits a full disk

    monkeypatch.setattr(ckpt.os, "fdopen", fdopen)
    with pytest.raises(ckpt.WriteError) as err:
        run_corpus(model, tokens, [NormCurve(2, 4)], batch_size=2, checkpoint=path, checkpoint_every=1, progress=False)
    assert err.value.errno == errno.ENOSPC and "\n" not in str(err.value)
    assert str(path) in str(err.value) and "saved before is intact" in str(err.value)
    assert [p.name for p in tmp_path.iterdir()] == ["run.ckpt"]  # no temporary file left
    assert ckpt.load_checkpoint(path)["next_batch"] == 1
    monkeypatch.setattr(ckpt.os, "fdopen", real_fdopen)
    resumed = run_corpus(
        model, tokens, [NormCurve(2, 4)], batch_size=2, checkpoint=path, checkpoint_every=1, progress=False
    )[0]
    got = resumed.state_dict()
    assert got.keys() == whole.keys()
    for key in ("per_head", "per_layer", "out_of_window"):
        assert got[key]["__acc__"].keys() == whole[key]["__acc__"].keys()
        for name, value in got[key]["__acc__"].items():
            assert torch.equal(value, whole[key]["__acc__"][name]), (key, name)


def test_checkpoint_files_follow_the_umask(tmp_path):
    from geolens.checkpoint import atomic_write_bytes

    old = os.umask(0o022)
    try:
        atomic_write_bytes(tmp_path / "x.bin", b"data")
    finally:
        os.umask(old)
    assert (tmp_path / "x.bin").stat().st_mode & 0o777 == 0o644


def test_unwritable_output_folder_is_one_line_before_the_model_loads(tmp_path, capsys, monkeypatch):
    import geolens.models

    monkeypatch.setattr(geolens.models, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    blocker = tmp_path / "file"
    blocker.write_text("x")
    rc, err = run_cli(_taxonomy(tmp_path, blocker / "out"), capsys)
    assert rc == 2 and len(err) == 1 and "cannot write there" in err[0]


def test_cache_verify_reports_damage(tmp_path, monkeypatch, capsys):
    from test_model_cache import NAME, _save_tiny

    from geolens import models

    monkeypatch.setitem(models.MODELS, NAME, models.ModelSpec(NAME, "tiny", gguf=lambda w: w, convert=_save_tiny))
    monkeypatch.setenv("GEOLENS_CACHE", str(tmp_path))
    folder = models.converted_checkpoint(NAME)
    assert main(["cache", "verify"]) == 0 and f"{NAME}: ok" in capsys.readouterr().out
    (folder / "config.json").write_text("{}")
    assert main(["cache", "verify", NAME]) == 1 and "DAMAGED" in capsys.readouterr().out
    assert main(["cache", "path"]) == 0 and capsys.readouterr().out.strip() == str(tmp_path)
    assert main(["cache", "clear"]) == 0 and not folder.exists()


def test_a_folder_created_by_another_run_after_the_first_look_is_met_at_its_lock(tmp_path):
    """The race of two runs starting on one new folder: the second looked while the folder was still
    absent, the first then created, locked and marked it. The second is refused as "in use" (its
    lock), never told that the folder holds an interrupted run; and it leaves nothing behind."""
    from geolens.folder_lock import FolderInUse
    from geolens.run_folder import _open_locked, open_run_folder

    out = tmp_path / "race"
    first = open_run_folder(str(out), command="taxonomy")  # created, locked, marked incomplete
    try:
        before = sorted(p.name for p in out.iterdir())
        with pytest.raises(FolderInUse, match="in use by another geolens run"):
            _open_locked(out, None, "taxonomy", False, False, False, False, "--out")  # absent when it looked
        assert sorted(p.name for p in out.iterdir()) == before
    finally:
        first.release()
