"""Result folders that say when they are complete: the output side of every ``geolens`` command.

A command's results go into one folder, ``--out`` or, by default,
``./geolens-runs/<command>/<YYYYmmdd-HHMMSS>`` (``--name NAME`` instead of the time stamp). The
folder moves through three states, each visible on disk:

- **incomplete** — a file ``INCOMPLETE`` is written first, before any result, saying which
  command is writing there. A run that is interrupted, killed or fails leaves it in place, so
  the folder says it is incomplete; :func:`require_complete` (used by the readers: ``geolens
  report --compare``, and by anyone loading saved results) refuses such a folder, or any folder
  inside one, in one line. ``geolens faithfulness --replot`` may replot an incomplete run (the
  runs that resume are read while under way), but not while a live process holds the folder
  (replotting writes into it: see the lock below); the folder then stays incomplete.
- **complete** — at the end, ``manifest.json`` lists every file with its size and SHA-256, then
  ``INCOMPLETE`` is removed. A folder with a manifest whose files are missing or altered is
  refused like an incomplete one.
- **absent** — a run stopped before it wrote anything (a usage error, an interrupt during the
  model load) removes the folder and the parents it created: nothing is left behind.

A folder that already holds results is never written into unless the user says so:
``--overwrite`` replaces them, ``--resume`` continues them in place for the commands that
resume. Either way the folder is marked incomplete until the new run ends, so it is never a
silent mix of two runs. ``--overwrite`` first moves the previous run's own files (those its
manifest lists, or those an interrupted run recorded as written) into a hidden
``.geolens-previous-<pid>`` folder: a run that ends without writing anything (a usage error, an
early interrupt) moves them back, a run that completes deletes them. Files that no geolens run
wrote are never moved or deleted.

One writer at a time (:mod:`geolens.folder_lock`): an open folder holds an OS lock (``fcntl.flock``) on a file ``.geolens-lock``
inside it, which names the process (pid, command, start time) and is removed when the run ends. A
second :func:`open_run_folder` on a folder in use (any command, with or without ``--overwrite`` or
``--resume``) raises :class:`FolderInUse`, a :class:`~geolens.errors.UsageError` naming the folder
and the process holding it. The kernel drops the lock of a process that dies (even of ``kill -9``):
its lock file is then stale and the next run takes it over. Where the file system has no
``flock`` (some network mounts), the pid in the file decides: a live process other than this one
holds the folder, a dead one does not. The lock file is never a result: manifests, ``--overwrite``
and the folder states ignore it.

Nothing outside the folder is touched (:mod:`geolens.files`): the lock and the marker are opened
without following symbolic links, a folder whose lock, marker or manifest is a link, or with a link
at its top leading outside it, is refused; every file the manifest or the marker lists is checked
to lie inside the folder and not behind a link before ``--overwrite`` moves anything (else one
line, nothing moved); a symbolic link is never a result (never listed, moved or deleted); a
``--name`` must be a plain name. Each refusal is a :class:`~geolens.files.UnsafePath` (a
``UsageError``: exit 2).

The command line (:func:`geolens.cli.main`) drives this: a command opens its folder with
:func:`open_run_folder` after validating its arguments; ``main`` completes every folder opened
when the command returns, and on an interrupt or an error reports what was left.
"""

from __future__ import annotations

import contextvars
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from geolens._version import __version__
from geolens.errors import UsageError
from geolens.files import (
    UnsafePath,
    check_name,
    create_writable_folder,
    file_sha256,
    inside,
    links_out_of,
    refuse_link,
    remove_created,
    write_text_nofollow,
)
from geolens.folder_lock import LOCK, FolderLock
from geolens.folder_lock import FolderInUse as FolderInUse  # re-exported: run_folder.FolderInUse

MANIFEST = "manifest.json"
INCOMPLETE = "INCOMPLETE"
DEFAULT_ROOT = Path("geolens-runs")

State = Literal["absent", "empty", "complete", "incomplete", "damaged", "unmarked"]

STASH_PREFIX = ".geolens-previous-"

# the folders opened by the running command, in order (per thread and task: cli.main may run in several)
_OPEN: contextvars.ContextVar[list | None] = contextvars.ContextVar("geolens_open_run_folders", default=None)


def _open_list() -> list:
    folders = _OPEN.get()
    if folders is None:
        folders = []
        _OPEN.set(folders)
    return folders


class IncompleteResults(ValueError):
    """A results folder that is incomplete or damaged (one-line message naming it)."""


def _files(folder: Path) -> list[Path]:
    def ours(p: Path) -> bool:
        top = p.relative_to(folder).parts[0]
        return top not in (MANIFEST, INCOMPLETE, LOCK) and not top.startswith(STASH_PREFIX)

    # a symbolic link is never a result: geolens makes none, and never moves or deletes one
    return sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink() and ours(p))


def _marker_data(folder: Path) -> dict:
    """The JSON line an ``INCOMPLETE`` marker ends with (``{}`` when unreadable)."""
    try:
        data = json.loads((folder / INCOMPLETE).read_text(encoding="utf-8").strip().splitlines()[-1])
    except (OSError, ValueError, IndexError):
        return {}
    return data if isinstance(data, dict) else {}


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    if not folder.is_dir():
        return {}
    out = {}
    for p in _files(folder):
        st = p.stat()
        out[str(p.relative_to(folder))] = (st.st_size, st.st_mtime_ns)
    return out


def manifest_problems(folder: Path, *, contents: bool = True) -> list[str]:
    """What is wrong with a folder's manifest and the files it lists (empty: sound)."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        files = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return [f"{MANIFEST} is unreadable"]
    problems = []
    for rel, info in files.items():
        try:
            path = inside(folder, rel, what=f"{MANIFEST} entry")
        except UnsafePath:
            problems.append(f"{rel} lies outside the folder or behind a symbolic link")
            continue
        if not path.is_file():
            problems.append(f"{rel} is missing")
        elif path.stat().st_size != info.get("bytes"):
            problems.append(f"{rel} changed size")
        elif contents and file_sha256(path) != info.get("sha256"):
            problems.append(f"{rel} was altered")
    return problems


def folder_state(folder: str | os.PathLike, *, contents: bool = False) -> State:
    """``absent``, ``empty``, ``incomplete`` (marker), ``complete`` (sound manifest), ``damaged``
    (a manifest whose files are missing or changed) or ``unmarked`` (files, no marker, no manifest:
    results of geolens 0.1 or someone else's folder)."""
    folder = Path(folder)
    if not folder.exists():
        return "absent"
    if not folder.is_dir() or not any(p.name != LOCK for p in folder.iterdir()):
        return "empty" if folder.is_dir() else "unmarked"
    if (folder / INCOMPLETE).exists():
        return "incomplete"
    if (folder / MANIFEST).exists():
        return "damaged" if manifest_problems(folder, contents=contents) else "complete"
    return "unmarked"


def require_complete(folder: str | os.PathLike, *, what: str = "results") -> Path:
    """``folder`` if it holds complete results (or results written before manifests existed);
    else :class:`IncompleteResults` in one line.

    >>> require_complete("no/such/folder")
    Traceback (most recent call last):
    ...
    geolens.run_folder.IncompleteResults: no/such/folder does not exist
    """
    folder = Path(folder)
    state = folder_state(folder, contents=True)
    if state == "absent":
        raise IncompleteResults(f"{folder} does not exist")
    for parent in list(folder.resolve().parents)[:3]:  # a sub-folder of a run (a model's report)
        if (parent / INCOMPLETE).is_file():
            raise IncompleteResults(
                f"{folder} is inside {parent}, which holds incomplete {what}; rerun the command with --overwrite"
            )
    if state == "incomplete":
        note = (folder / INCOMPLETE).read_text(encoding="utf-8", errors="replace").splitlines()[:1]
        raise IncompleteResults(
            f"{folder} holds incomplete {what} ({note[0] if note else 'interrupted run'}); rerun the command with --overwrite (or --resume)"
        )
    if state == "damaged":
        raise IncompleteResults(
            f"{folder} holds damaged {what} ({'; '.join(manifest_problems(folder)[:3])}); rerun the command with --overwrite"
        )
    return folder


@dataclass
class RunFolder:
    """One command's output folder while the command runs (see the module docstring)."""

    path: Path
    command: str
    resume: bool = False
    created: list[Path] = field(default_factory=list)  # folders this run created (outermost last)
    state: Literal["open", "complete", "left"] = "open"
    was_complete: bool = True  # False when replotting a folder that was incomplete
    foreign: tuple[str, ...] = ()  # files that were there before and are not geolens results
    had_marker: bool = False  # the folder was already marked incomplete (resumed or replotted)
    _old_marker: str | None = None
    _stash: Path | None = None
    _before: dict = field(default_factory=dict)
    _lock: FolderLock | None = None

    def release(self) -> None:
        """Give up the folder's lock (done when the run completes or is left)."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def _mark(self) -> None:
        if self.had_marker:
            self._old_marker = (self.path / INCOMPLETE).read_text(encoding="utf-8", errors="replace")
        text = (
            f"geolens {self.command} started writing here at {time.strftime('%Y-%m-%d %H:%M:%S')} (pid {os.getpid()}) "
            "and has not finished: the files in this folder are incomplete.\n"
            "An interrupted or failed run leaves this file; a finished run replaces it with manifest.json.\n"
            + json.dumps({"foreign": list(self.foreign), "started": time.time()})
            + "\n"
        )
        write_text_nofollow(self.path / INCOMPLETE, text, what="the marker of an incomplete run")

    def _stash_previous(self, files: list[str]) -> None:
        """Move the previous run's ``files`` (and its manifest) aside, into a hidden folder."""
        self._stash = self.path / f"{STASH_PREFIX}{os.getpid()}"
        refuse_link(self._stash, what="the previous run's files while it is replaced")
        sources = [inside(self.path, rel, what="a file of the previous run") for rel in [*files, MANIFEST]]
        for rel, src in zip([*files, MANIFEST], sources):
            if src.is_file():
                dst = self._stash / rel
                dst.parent.mkdir(parents=True, exist_ok=True)
                os.replace(src, dst)

    def _restore_previous(self) -> bool:
        if self._stash is None or not self._stash.is_dir():
            return False
        kept = False
        for src in sorted(p for p in self._stash.rglob("*") if p.is_file() and not p.is_symlink()):
            try:
                dst = inside(self.path, str(src.relative_to(self._stash)), what="a file of the previous run")
            except UnsafePath:  # a link put in its way meanwhile: the file stays in the stash
                kept = True
                continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, dst)
        if not kept:
            shutil.rmtree(self._stash, ignore_errors=True)
        return True

    def _drop_previous(self) -> None:
        if self._stash is not None:
            shutil.rmtree(self._stash, ignore_errors=True)

    def _results(self) -> list[Path]:
        """The files of this run: everything in the folder but what was there before and is not a
        geolens result (a folder of unknown origin keeps its own files out of the manifest)."""
        if not self.foreign:
            return _files(self.path)
        now = _snapshot(self.path)
        foreign = set(self.foreign)
        return [self.path / rel for rel in sorted(now) if rel not in foreign or now[rel] != self._before.get(rel)]

    def written(self) -> list[str]:
        """The files created or changed since the folder was opened (the marker aside)."""
        now = _snapshot(self.path)
        return sorted(rel for rel, stamp in now.items() if self._before.get(rel) != stamp)

    def complete(self) -> Path:
        """Write the manifest (every file, size and SHA-256), then remove the marker."""
        if self.state != "open":
            return self.path
        if not self.was_complete:  # a replot of an incomplete run: still incomplete
            self.state = "left"
            return self.path
        files = {
            str(p.relative_to(self.path)): {"bytes": p.stat().st_size, "sha256": file_sha256(p)}
            for p in self._results()
        }
        from geolens.preregistration import source_state  # the commit and tree state of every run

        manifest = {
            "command": f"geolens {self.command}",
            "geolens": __version__,
            "completed": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "files": files,
            **source_state(),
        }
        from geolens.checkpoint import atomic_write_bytes

        atomic_write_bytes(self.path / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
        self.state = "complete"  # the manifest is there: complete, whatever happens next
        (self.path / INCOMPLETE).unlink(missing_ok=True)
        self._drop_previous()
        self.release()
        return self.path

    def _remove_empty_folders(self) -> None:
        """The empty folders this run made inside its folder (a model's sub-folder), then the
        folders it created for it."""
        for sub in sorted(
            (p for p in self.path.rglob("*") if p.is_dir() and not p.name.startswith(STASH_PREFIX)),
            key=lambda p: len(p.parts),
            reverse=True,
        ):
            try:
                sub.rmdir()
            except OSError:
                pass
        for folder in self.created:
            try:
                folder.rmdir()
            except OSError:
                break

    def leave(self) -> str:
        """Stop without completing. Nothing written: the previous results are put back and the folder
        is as it was (or gone, if this run made it). Something written: the folder stays marked
        incomplete, its marker listing what this run wrote. Returns what is left, for the user.
        The folder's lock is released either way."""
        try:
            return self._leave()
        finally:
            self.release()

    def _leave(self) -> str:
        if self.state == "complete":
            return f"results in {self.path}"
        if self.state == "left":
            return (
                f"partial results in {self.path} (incomplete)"
                if (self.path / INCOMPLETE).exists()
                else "nothing written"
            )
        if not self.path.is_dir():
            self.state = "left"
            return "nothing written"
        written = self.written()
        if written:
            self._drop_previous()  # partial new results replace them: never a mix of two runs
            data = _marker_data(self.path)
            data["written"] = sorted(set(data.get("written", [])) | set(written))
            head = (self.path / INCOMPLETE).read_text(encoding="utf-8").strip().splitlines()[:-1]
            write_text_nofollow(
                self.path / INCOMPLETE,
                "\n".join(head + [json.dumps(data)]) + "\n",
                what="the marker of an incomplete run",
            )
            self.state = "left"
            return f"partial results in {self.path} (incomplete{'; --resume continues them' if self.resume else ''})"
        kept = self._restore_previous()
        if self.had_marker and self._old_marker is not None:
            write_text_nofollow(self.path / INCOMPLETE, self._old_marker, what="the marker of an incomplete run")
        else:
            (self.path / INCOMPLETE).unlink(missing_ok=True)
        self.release()  # its file goes first: the folders it made can then be removed
        self._remove_empty_folders()
        self.state = "left"
        return "nothing written; the previous results are kept" if kept else "nothing written"


def default_folder(command: str, name: str | None = None, root: Path = DEFAULT_ROOT) -> Path:
    """``geolens-runs/<command>/<name or time stamp>`` (a suffix ``-2``, ``-3`` … if taken)."""
    base = root / command / (name or time.strftime("%Y%m%d-%H%M%S"))
    path, n = base, 1
    while name is None and path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def _describe(folder: Path, state: State) -> str:
    if state == "complete":
        try:
            command = json.loads((folder / MANIFEST).read_text(encoding="utf-8")).get("command", "geolens")
        except (OSError, ValueError):
            command = "geolens"
        return f"the complete results of `{command}`"
    if state == "incomplete":
        return "the partial results of an interrupted run"
    if state == "damaged":
        return "results whose files changed since they were written"
    names = sorted(p.name for p in folder.iterdir() if p.name != LOCK)
    shown = ", ".join(names[:3]) + (", …" if len(names) > 3 else "")
    return f"{len(names)} {'file or folder' if len(names) == 1 else 'files or folders'} ({shown})"


def _foreign_files(folder: Path, state: State) -> tuple[str, ...]:
    """Files in ``folder`` that no geolens run wrote: all of an unmarked folder's files, and those an
    interrupted run recorded as there before it (never deleted by ``--overwrite``)."""
    if state == "unmarked":
        return tuple(sorted(_snapshot(folder)))
    if state in ("complete", "damaged"):
        try:
            listed = set(json.loads((folder / MANIFEST).read_text(encoding="utf-8")).get("files", {}))
        except (OSError, ValueError, AttributeError):
            return tuple(sorted(_snapshot(folder)))
        return tuple(sorted(set(_snapshot(folder)) - listed))
    if state == "incomplete":
        data = _marker_data(folder)
        if "written" in data:  # everything but what the interrupted run wrote
            return tuple(sorted(set(_snapshot(folder)) - set(data["written"])))
        if "foreign" in data:
            return tuple(data["foreign"])
        return tuple(sorted(_snapshot(folder)))  # an unreadable marker: delete nothing
    return ()


def _previous_run_files(folder: Path, state: State, foreign: tuple[str, ...]) -> list[str]:
    """What ``--overwrite`` replaces: the files the previous run wrote (listed by its manifest, or
    by the marker of an interrupted run). A run killed before it could list them: its files are
    those changed since it started, and not among those it found there."""
    if state in ("complete", "damaged"):
        try:
            return sorted(json.loads((folder / MANIFEST).read_text(encoding="utf-8")).get("files", {}))
        except (OSError, ValueError, AttributeError):
            return []
    if state == "incomplete":
        data = _marker_data(folder)
        if "written" in data:
            return sorted(data["written"])
        started, keep = float(data.get("started", float("inf"))), set(foreign)
        return sorted(
            rel for rel, (_, mtime) in _snapshot(folder).items() if rel not in keep and mtime / 1e9 >= started
        )
    return []


def open_run_folder(
    out: str | os.PathLike | None,
    *,
    command: str,
    name: str | None = None,
    overwrite: bool = False,
    resume: bool = False,
    resumable: bool = False,
    replot: bool = False,
    option: str = "--out",
) -> RunFolder:
    """Validate and open a command's output folder (marked incomplete until the command ends).

    Raises :class:`geolens.errors.UsageError` (one line, exit 2) for a file in the
    way, a folder holding results without ``--overwrite``/``--resume``, a folder that cannot be
    written, or (:class:`FolderInUse`) a folder another live process writes into, whatever the
    options; in those cases nothing is created. The folder is locked until the run completes or is
    left (:meth:`RunFolder.complete`, :meth:`RunFolder.leave`).
    """
    if out is not None and name is not None:
        raise UsageError("give --out or --name, not both (--name picks a folder under geolens-runs/<command>/)")
    if name is not None:
        check_name(name, what="--name")
    path = Path(out) if out is not None else default_folder(command, name)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{option} {path}: is an existing file, not a folder")
    lock = None
    if path.is_dir():  # a folder in use is refused first, whatever it holds and whatever the options
        try:
            lock = FolderLock(path, command, option)
        except OSError as err:
            raise UsageError(
                f"{option} {path}: cannot write there ({err.strerror or type(err).__name__}); choose another --out"
            ) from err
    try:
        folder = _open_locked(path, lock, command, overwrite, resume, resumable, replot, option)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    return folder


def _refuse_links(path: Path, state: State, option: str) -> None:
    """Refuse (one line, :class:`~geolens.files.UnsafePath`) a folder whose marker or manifest is a
    symbolic link, with a link at its top that leads outside it, or whose marker lists a file
    outside it or behind a link: geolens would write, move or delete through them."""
    if state == "absent":
        return
    try:
        refuse_link(path / INCOMPLETE, what="the marker of an incomplete run")
        refuse_link(path / MANIFEST, what="the manifest of its results")
        if state == "incomplete":
            data = _marker_data(path)
            for key in ("written", "foreign"):
                entries = data.get(key, [])
                for rel in entries if isinstance(entries, list) else [entries]:
                    inside(path, rel, what=f"{INCOMPLETE} entry")
    except UnsafePath as err:
        raise UnsafePath(f"{option} {path}: {err}") from None
    leading_out = links_out_of(path)
    if leading_out:
        name, target = leading_out[0]
        raise UnsafePath(
            f"{option} {path}: {name} is a symbolic link to {target}, outside the folder; geolens never writes "
            "through a link that leads out of its output folder: remove the link, or choose another --out"
        )


def _open_locked(path, lock, command, overwrite, resume, resumable, replot, option, created=None) -> RunFolder:
    if lock is None:  # absent when open_run_folder looked: create and lock it before judging what it holds,
        # so that a run that created it meanwhile is met at its lock, never judged by its half-written state
        created = create_writable_folder(path, option)
        try:
            lock = FolderLock(path, command, option)
            return _open_locked(path, lock, command, overwrite, resume, resumable, replot, option, created)
        except BaseException:
            if lock is not None:
                lock.release()
            remove_created(created)
            raise
    state = folder_state(path)
    _refuse_links(path, state, option)
    if replot or resume:
        if state in ("absent", "empty"):
            raise UsageError(
                f"{'--replot' if replot else '--resume'}: {path} holds no results to {'replot' if replot else 'continue'}"
            )
    elif state not in ("absent", "empty"):
        if not overwrite:
            hint = (
                "pass --overwrite to replace them"
                + (", or --resume to continue them" if resumable else "")
                + ", or choose another --out"
            )
            raise UsageError(f"{option} {path} already holds {_describe(path, state)}; {hint}")
    if created is None:  # the folder existed when open_run_folder looked: check that it takes files
        create_writable_folder(path, option)
        created = []
    foreign = _foreign_files(path, state)
    folder = RunFolder(
        path,
        command,
        resume=resume,
        created=created,
        foreign=foreign,
        had_marker=state == "incomplete",
        was_complete=state not in ("incomplete", "damaged") or not replot,
        _lock=lock,
    )
    previous = _previous_run_files(path, state, foreign) if overwrite and not (resume or replot) else []
    for rel in previous:  # each one inside the folder, not behind a link: else nothing is moved
        try:
            inside(path, rel, what=f"{MANIFEST if state in ('complete', 'damaged') else INCOMPLETE} entry")
        except UnsafePath as err:
            raise UnsafePath(f"{option} {path}: {err}") from None
    _open_list().append(folder)  # from here on an interrupt leaves or restores it
    folder._mark()
    if previous or (overwrite and state in ("complete", "damaged")):
        folder._stash_previous(previous)
    folder._before = _snapshot(path)
    return folder


def open_folders() -> list[RunFolder]:
    """The folders opened by the running command."""
    return list(_open_list())


def complete_all() -> list[Path]:
    """Complete every open folder (the command returned normally). They stay listed by
    :func:`open_folders` (with ``state == "complete"``) until :func:`forget_all`."""
    return [f.complete() for f in _open_list()]


def leave_all() -> list[str]:
    """Leave every open folder as it is (incomplete) or remove it if untouched; what is left, per folder."""
    return [f.leave() for f in _open_list()]


def forget_all() -> None:
    """Forget the folders of the command that ended (the command line calls it before and after each
    command), releasing the lock of any still held."""
    for folder in _OPEN.get() or ():
        folder.release()
    _OPEN.set([])
