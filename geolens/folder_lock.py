"""The lock of an output folder: one writer at a time (:func:`geolens.run_folder.open_run_folder`).

An open folder holds an OS lock (``fcntl.flock``) on a file ``.geolens-lock`` inside it, which
names the process (pid, command, start time) and is removed when the run ends. A second opener
(any command, with or without ``--overwrite`` or ``--resume``) gets :class:`FolderInUse`, a
:class:`~geolens.errors.UsageError` naming the folder and the process holding it. The kernel drops
the lock of a process that dies (even of ``kill -9``): its lock file is then stale and the next
run takes it over. Where the file system has no ``flock`` (some network mounts), the pid in the
file decides: a live process other than this one holds the folder, a dead one does not. The lock
file is opened with ``O_NOFOLLOW``: a symbolic link named ``.geolens-lock`` is refused in one line
(:class:`geolens.files.UnsafePath`), and what it names is never written.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from geolens.errors import UsageError
from geolens.files import UnsafePath, open_nofollow

LOCK = ".geolens-lock"


class FolderInUse(UsageError):
    """An output folder another running process writes into (one line naming the folder and that process)."""


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _lock_holder(path: Path) -> dict:
    """What a lock file says of its process (``{}`` when unreadable)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _describe_holder(holder: dict) -> str:
    pid = holder.get("pid", "?")
    command = holder.get("command") or "geolens"
    started = holder.get("started")
    when = f", since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(started))}" if started else ""
    return f"process {pid} ({command}{when})"


class FolderLock:
    """The lock of one output folder: ``fcntl.flock`` on ``<folder>/.geolens-lock`` (module docstring)."""

    def __init__(self, folder: Path, command: str, option: str = "--out"):
        self.path = folder / LOCK
        self.fd: int | None = None
        self._acquire(command, option)

    def _refuse(self, option: str, holder: dict) -> None:
        raise FolderInUse(
            f"{option} {self.path.parent} is in use by another geolens run: {_describe_holder(holder)}; "
            "wait for it to end or choose another folder"
        )

    def _acquire(self, command: str, option: str) -> None:
        import fcntl

        for _ in range(20):  # the file may be replaced between open and flock: retry on the new one
            try:  # never through a link: a symlinked lock file is refused, its target untouched
                fd = open_nofollow(self.path, os.O_RDWR | os.O_CREAT, what="the lock of its output folder")
            except UnsafePath as err:
                raise UnsafePath(f"{option} {self.path.parent}: {err}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                self._refuse(option, _lock_holder(self.path))
            except OSError:  # no flock on this file system: the pid in the file decides
                holder = _lock_holder(self.path)
                pid = int(holder.get("pid", 0) or 0)
                if pid != os.getpid() and _pid_alive(pid):
                    os.close(fd)
                    self._refuse(option, holder)
            try:
                same = os.fstat(fd).st_ino == os.lstat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # the previous holder removed it meanwhile: lock the current file
                os.close(fd)
                continue
            self.fd = fd
            record = {
                "pid": os.getpid(),
                "command": f"geolens {command}",
                "argv": sys.argv,
                "started": time.time(),
            }
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
            return
        raise OSError(f"cannot take the lock {self.path}: it keeps being replaced")

    def release(self) -> None:
        """Remove the lock file, then unlock (idempotent)."""
        if self.fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        except OSError:
            pass
        try:
            os.close(self.fd)  # closing the last descriptor releases the flock
        finally:
            self.fd = None
