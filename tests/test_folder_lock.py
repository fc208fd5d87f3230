"""The lock of an output folder (geolens.folder_lock), in one process: the lock file names this
process and its command, a second opener of the same folder is refused in one line naming the
folder and the holder, release removes the file (twice is harmless) and frees the folder, and a
lock file that cannot be read describes an unknown holder. Locks held by other processes, killed
holders and file systems without flock: tests/test_faults.py."""

from __future__ import annotations

import json
import os
import time

import pytest

from geolens.errors import UsageError
from geolens.folder_lock import LOCK, FolderInUse, FolderLock, _describe_holder, _lock_holder


def test_the_lock_file_names_this_process_and_its_command(tmp_path):
    lock = FolderLock(tmp_path, "sinks")
    try:
        record = json.loads((tmp_path / LOCK).read_text(encoding="utf-8"))
        assert record["pid"] == os.getpid() and record["command"] == "geolens sinks"
        assert abs(record["started"] - time.time()) < 60 and isinstance(record["argv"], list)
    finally:
        lock.release()


def test_a_second_opener_is_refused_until_the_first_releases(tmp_path):
    first = FolderLock(tmp_path, "taxonomy")
    try:
        with pytest.raises(FolderInUse) as err:  # its own open file: flock refuses it like another process
            FolderLock(tmp_path, "flow", option="--dir")
        message = str(err.value)
        assert isinstance(err.value, UsageError) and "\n" not in message
        assert message.startswith(
            f"--dir {tmp_path} is in use by another geolens run: process {os.getpid()} (geolens taxonomy, since "
        )
        assert message.endswith("; wait for it to end or choose another folder")
    finally:
        first.release()
    assert not (tmp_path / LOCK).exists()
    first.release()  # idempotent
    second = FolderLock(tmp_path, "flow")  # the folder is free again
    second.release()


def test_an_unreadable_lock_file_describes_an_unknown_holder(tmp_path):
    path = tmp_path / LOCK
    path.write_text("{not json", encoding="utf-8")
    assert _lock_holder(path) == {} and _lock_holder(tmp_path / "missing") == {}
    path.write_text("[1, 2]", encoding="utf-8")
    assert _lock_holder(path) == {}
    assert _describe_holder({}) == "process ? (geolens)"
    started = time.mktime((2026, 12, 6, 2, 40, 14, 0, 0, -1))
    assert _describe_holder({"pid": 1234, "command": "geolens sinks", "started": started}) == (
        "process 1234 (geolens sinks, since 2026-12-06 02:40:14)"
    )
