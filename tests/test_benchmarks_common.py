"""benchmarks/_common.py's busy processes: started for the block, running inside it, and killed
after it, also when the block raises; the commit of a folder outside git is "unknown"."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from _common import busy_processes, commit  # noqa: E402


def test_busy_processes_run_in_the_block_and_are_killed_after_it_even_when_it_raises():
    with busy_processes(2) as procs:
        assert len(procs) == 2 and all(p.poll() is None for p in procs)
    assert all(p.poll() is not None for p in procs)
    with pytest.raises(RuntimeError), busy_processes(1) as raised:
        raise RuntimeError("inside")
    assert raised[0].poll() is not None
    with busy_processes(0) as none:
        assert none == []


def test_commit_outside_git_is_unknown(tmp_path):
    assert commit(tmp_path) == "unknown"
    root = Path(__file__).resolve().parents[1]
    if (root / ".git").exists():  # a clone: its HEAD, short hex
        assert all(c in "0123456789abcdef" for c in commit(root)) and len(commit(root)) >= 7
