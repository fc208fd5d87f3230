"""Result folders that say when they are complete: the output side of every ``geolens`` command.

A command's results go into one folder, ``--out`` or, by default,
``./geolens-runs/<command>/<YYYYmmdd-HHMMSS>`` (``--name NAME`` instead of the time stamp). The
folder moves through three states, each visible on disk:

- **incomplete** — a file ``INCOMPLETE`` is written first, before any result, saying which
  command is writing there. A run that is interrupted, killed or fails leaves it in place, so
  the folder says it is incomplete; :func:`require_complete` (used by every reader: ``geolens
  report --compare``, ``geolens faithfulness --replot``) refuses such a folder in one line.
- **complete** — at the end, ``manifest.json`` lists every file with its size and SHA-256, then
  ``INCOMPLETE`` is removed. A folder with a manifest whose files are missing or altered is
  refused like an incomplete one.
- **absent** — a run stopped before it wrote anything (a usage error, an interrupt during the
  model load) removes the folder and the parents it created: nothing is left behind.

A folder that already holds results is never written into unless the user says so:
``--overwrite`` replaces them (the files of the previous run, listed by its manifest or, for an
incomplete run, everything in the folder), ``--resume`` continues them in place for the
commands that resume. Either way the folder is marked incomplete until the new run ends, so it
is never a silent mix of two runs.

The command line (:func:`geolens.cli.main`) drives this: a command opens its folder with
:func:`open_run_folder` after validating its arguments; ``main`` completes every folder opened
when the command returns, and on an interrupt or an error reports what was left.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

MANIFEST = "manifest.json"
INCOMPLETE = "INCOMPLETE"
DEFAULT_ROOT = Path("geolens-runs")

State = Literal["absent", "empty", "complete", "incomplete", "damaged", "unmarked"]

_OPEN: list["RunFolder"] = []  # folders opened by the running command, in order


class IncompleteResults(ValueError):
    """A results folder that is incomplete or damaged (one-line message naming it)."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.relative_to(folder).parts[0] not in (MANIFEST, INCOMPLETE))


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
        path = folder / rel
        if not path.is_file():
            problems.append(f"{rel} is missing")
        elif path.stat().st_size != info.get("bytes"):
            problems.append(f"{rel} changed size")
        elif contents and _sha256(path) != info.get("sha256"):
            problems.append(f"{rel} was altered")
    return problems


def folder_state(folder: str | os.PathLike, *, contents: bool = False) -> State:
    """``absent``, ``empty``, ``incomplete`` (marker), ``complete`` (sound manifest), ``damaged``
    (a manifest whose files are missing or changed) or ``unmarked`` (files, no marker, no manifest:
    results of geolens 0.1 or someone else's folder)."""
    folder = Path(folder)
    if not folder.exists():
        return "absent"
    if not folder.is_dir() or not any(folder.iterdir()):
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
    if state == "incomplete":
        note = (folder / INCOMPLETE).read_text(encoding="utf-8", errors="replace").splitlines()[:1]
        raise IncompleteResults(f"{folder} holds incomplete {what} ({note[0] if note else 'interrupted run'}); rerun the command with --overwrite (or --resume)")
    if state == "damaged":
        raise IncompleteResults(f"{folder} holds damaged {what} ({'; '.join(manifest_problems(folder)[:3])}); rerun the command with --overwrite")
    return folder


@dataclass
class RunFolder:
    """One command's output folder while the command runs (see the module docstring)."""

    path: Path
    command: str
    resume: bool = False
    created: list[Path] = field(default_factory=list)  # folders this run created (outermost last)
    state: Literal["open", "complete", "left"] = "open"
    was_complete: bool = True  # False when resuming or replotting a folder that was incomplete
    foreign: tuple[str, ...] = ()  # files that were there before and are not geolens results
    _before: dict = field(default_factory=dict)

    def _mark(self) -> None:
        text = (
            f"geolens {self.command} started writing here at {time.strftime('%Y-%m-%d %H:%M:%S')} (pid {os.getpid()}) "
            "and has not finished: the files in this folder are incomplete.\n"
            "An interrupted or failed run leaves this file; a finished run replaces it with manifest.json.\n"
            + json.dumps({"foreign": list(self.foreign)})
            + "\n"
        )
        (self.path / INCOMPLETE).write_text(text, encoding="utf-8")
        self._before = _snapshot(self.path)

    def _results(self) -> list[Path]:
        """The files of this run: everything in the folder but what was there before and is not a
        geolens result (a folder of unknown origin keeps its own files out of the manifest)."""
        if not self.foreign:
            return _files(self.path)
        now = _snapshot(self.path)
        foreign = set(self.foreign)
        return [self.path / rel for rel in sorted(now) if rel not in foreign or now[rel] != self._before.get(rel)]

    def wrote_anything(self) -> bool:
        """Whether any file changed since the folder was opened (the marker aside)."""
        return _snapshot(self.path) != self._before

    def complete(self) -> Path:
        """Write the manifest (every file, size and SHA-256), then remove the marker."""
        if self.state != "open":
            return self.path
        if not self.was_complete:  # a replot of an incomplete run: still incomplete
            self.state = "left"
            return self.path
        from geolens import __version__

        files = {str(p.relative_to(self.path)): {"bytes": p.stat().st_size, "sha256": _sha256(p)} for p in self._results()}
        manifest = {"command": f"geolens {self.command}", "geolens": __version__, "completed": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "files": files}
        from geolens.checkpoint import atomic_write_bytes

        atomic_write_bytes(self.path / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
        (self.path / INCOMPLETE).unlink(missing_ok=True)
        self.state = "complete"
        return self.path

    def leave(self) -> str:
        """Stop without completing: remove the folder if nothing was written, else keep it marked
        incomplete. Returns what is left, for the user (``nothing written`` / ``partial results …``)."""
        if self.state != "open":
            return f"results in {self.path}" if self.state == "complete" else f"partial results in {self.path} (incomplete)"
        self.state = "left"
        if self.path.is_dir() and self.wrote_anything():
            return f"partial results in {self.path} (incomplete{'; --resume continues them' if self.resume else ''})"
        if not self.path.is_dir():
            return "nothing written"
        if self.created:  # nothing of ours in it: remove the folders this run created
            (self.path / INCOMPLETE).unlink(missing_ok=True)
            for folder in self.created:
                try:
                    folder.rmdir()
                except OSError:
                    break
        elif self.was_complete and (self.path / MANIFEST).exists():
            (self.path / INCOMPLETE).unlink(missing_ok=True)  # the previous complete results, untouched
        return "nothing written"


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
    names = sorted(p.name for p in folder.iterdir())
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
        try:
            last = (folder / INCOMPLETE).read_text(encoding="utf-8").strip().splitlines()[-1]
            return tuple(json.loads(last).get("foreign", []))
        except (OSError, ValueError, IndexError, AttributeError):
            return tuple(sorted(_snapshot(folder)))  # an unreadable marker: delete nothing
    return ()


def _clear_previous(folder: Path, state: State, foreign: tuple[str, ...]) -> None:
    """``--overwrite``: remove the previous run's files (listed by its manifest; for an interrupted
    run, every file but those it found there); files of unknown origin are never removed."""
    if state in ("complete", "damaged"):
        try:
            listed = json.loads((folder / MANIFEST).read_text(encoding="utf-8")).get("files", {})
        except (OSError, ValueError):
            listed = {}
        for rel in listed:
            (folder / rel).unlink(missing_ok=True)
        (folder / MANIFEST).unlink(missing_ok=True)
    elif state == "incomplete":
        keep = set(foreign)
        for rel in _snapshot(folder):
            if rel not in keep:
                (folder / rel).unlink(missing_ok=True)
        for sub in sorted((p for p in folder.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            try:
                sub.rmdir()  # only the folders left empty
            except OSError:
                pass


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

    Raises :class:`geolens.commands._options.UsageError` (one line, exit 2) for a file in the
    way, a folder holding results without ``--overwrite``/``--resume``, or a folder that cannot be
    written; in those cases nothing is created.
    """
    from geolens.commands._options import UsageError

    if out is not None and name is not None:
        raise UsageError("give --out or --name, not both (--name picks a folder under geolens-runs/<command>/)")
    if name is not None and (not name.strip() or Path(name).name != name or name in (".", "..")):
        raise UsageError(f"--name {name!r}: expected a plain folder name (no slash)")
    path = Path(out) if out is not None else default_folder(command, name)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{option} {path}: is an existing file, not a folder")
    state = folder_state(path)
    if replot or resume:
        if state in ("absent", "empty"):
            raise UsageError(f"{'--replot' if replot else '--resume'}: {path} holds no results to {'replot' if replot else 'continue'}")
    elif state not in ("absent", "empty"):
        if not overwrite:
            hint = "pass --overwrite to replace them" + (", or --resume to continue them" if resumable else "") + ", or choose another --out"
            raise UsageError(f"{option} {path} already holds {_describe(path, state)}; {hint}")
    created = []
    probe = path
    while not probe.exists():
        created.append(probe)
        probe = probe.parent
    try:
        path.mkdir(parents=True, exist_ok=True)
        test = path / f".geolens-probe-{os.getpid()}"
        test.write_bytes(b"")
        test.unlink()
    except OSError as err:
        for folder in created:
            try:
                folder.rmdir()
            except OSError:
                break
        raise UsageError(f"{option} {path}: cannot write there ({err.strerror or type(err).__name__}); choose another --out") from err
    foreign = _foreign_files(path, state)
    if overwrite and not (resume or replot):
        _clear_previous(path, state, foreign)
    folder = RunFolder(path, command, resume=resume, created=created, was_complete=state not in ("incomplete", "damaged") or not replot, foreign=foreign)
    folder._mark()
    _OPEN.append(folder)
    return folder


def open_folders() -> list[RunFolder]:
    """The folders opened by the running command."""
    return list(_OPEN)


def complete_all() -> list[Path]:
    """Complete every open folder (the command returned normally). They stay listed by
    :func:`open_folders` (with ``state == "complete"``) until :func:`forget_all`."""
    return [f.complete() for f in _OPEN]


def leave_all() -> list[str]:
    """Leave every open folder as it is (incomplete) or remove it if untouched; what is left, per folder."""
    return [f.leave() for f in _OPEN]


def forget_all() -> None:
    """Forget the folders of the command that ended (the command line calls it before and after each command)."""
    _OPEN.clear()
