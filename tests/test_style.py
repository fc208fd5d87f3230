"""Style: ``ruff format --check`` and ``ruff check`` pass on the code (pyproject.toml's [tool.ruff]),
and ``# fmt: skip`` stays rare (only where a table reads better)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TREES = ["geolens", "tests", "benchmarks", "scripts"]


def _ruff() -> list[str]:
    exe = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(exe).exists():
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    return [exe]


def test_ruff_format_check():
    r = subprocess.run([*_ruff(), "format", "--check", *TREES], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, "ruff format would change:\n" + r.stdout + r.stderr


def test_ruff_check():
    r = subprocess.run(
        [*_ruff(), "check", "--output-format", "concise", *TREES], cwd=ROOT, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_at_most_20_fmt_skip_markers():
    n = sum(p.read_text().count("# fmt: skip") for tree in TREES for p in (ROOT / tree).rglob("*.py"))
    assert n <= 20, f"{n} '# fmt: skip' markers (at most 20: only where a table reads better)"
