"""Tests that mirror the code: every module of geolens/ has a test file named after it in the tests/
folder that mirrors its place (``tests/test_<module>.py`` for a root module,
``tests/<area>/…/test_<module>.py`` for a module of the subpackage ``geolens/<area>/``), or a row of
CONTRIBUTING.md's test map naming the test files that cover it. A test file of another area does
not count (tests/adapter/test_cache.py is not the test of geolens/commands/cache.py). A module with
neither fails here, and so does a map row that names a missing test file or a module that no longer
exists (or that now has a file of its own)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "geolens"
SKIP = {"__init__.py", "__main__.py", "_version.py"}  # package markers and the version string


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p.name not in SKIP)


def named_test(module: Path) -> Path | None:
    """``tests/test_<module>.py`` of a root module; the first ``test_<module>.py`` under
    ``tests/<area>/`` of a module of ``geolens/<area>/`` (None when there is none)."""
    name = f"test_{module.stem.lstrip('_')}.py"
    parts = module.relative_to(PACKAGE).parts
    if len(parts) == 1:
        path = ROOT / "tests" / name
        return path if path.is_file() else None
    found = sorted((ROOT / "tests" / parts[0]).rglob(name))
    return found[0] if found else None


def test_a_test_file_counts_only_in_the_area_of_its_module():
    assert named_test(PACKAGE / "adapter" / "cache.py") == ROOT / "tests" / "adapter" / "test_cache.py"
    assert named_test(PACKAGE / "commands" / "cache.py") == ROOT / "tests" / "commands" / "test_cache.py"
    assert named_test(PACKAGE / "geometry.py") == ROOT / "tests" / "test_geometry.py"
    assert named_test(PACKAGE / "sinks" / "geometry.py") == ROOT / "tests" / "sinks" / "test_geometry.py"
    assert (
        named_test(PACKAGE / "report" / "sections" / "flow.py")
        == ROOT / "tests" / "report" / "sections" / "test_flow.py"
    )


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
