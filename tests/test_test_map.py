"""Tests that mirror the code: every module of geolens/ has a test file named after it
(``test_<module>.py``, under ``tests/<area>/`` for a subpackage's module or anywhere in tests/ while
the flat files move), or a row of CONTRIBUTING.md's test map naming the test files that cover it.
A module with neither fails here, and so does a map row that names a missing test file or a module
that no longer exists (or that now has a file of its own)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "geolens"
SKIP = {"__init__.py", "__main__.py", "_version.py"}  # package markers and the version string


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p.name not in SKIP)


def named_test(module: Path) -> Path | None:
    name = f"test_{module.stem.lstrip('_')}.py"
    found = sorted((ROOT / "tests").rglob(name))
    return found[0] if found else None


def mapped_rows() -> dict[str, list[str]]:
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    section = text.split("### Test map", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(geolens/[\w/]+\.py)` \| (.+?) \|$", section, flags=re.M)
    return {module: re.findall(r"`(tests/[\w/]+\.py)`", cells) for module, cells in rows}


def test_every_module_has_a_test_file_or_a_map_row():
    mapped = mapped_rows()
    missing = [
        str(m.relative_to(ROOT)) for m in modules() if named_test(m) is None and str(m.relative_to(ROOT)) not in mapped
    ]
    assert not missing, f"no test_<module>.py and no row in CONTRIBUTING.md's test map: {missing}"


def test_map_rows_name_real_test_files_and_modules_without_one():
    for module, files in mapped_rows().items():
        path = ROOT / module
        assert path.is_file(), f"test map: {module} does not exist"
        assert named_test(path) is None, f"test map: {module} has {named_test(path)}: drop its row"
        assert files, f"test map: {module} names no test file"
        for f in files:
            assert (ROOT / f).is_file(), f"test map: {module} → {f} does not exist"
