"""docs/api.md lists every geolens function and class that a tutorial or a docs page uses, and each
entry carries a runnable ``>>>`` example.

What counts as used: the code cells of ``tutorials/*.ipynb`` (``docs/tutorials/`` is an identical
copy, checked here) and the Python code blocks (```` ```python ````, ```` ```py ````,
```` ```pycon ````) of ``docs/*.md`` and ``README.md``. In them, every name bound to geolens by an import
(``import geolens``, ``import geolens.x as y``, ``from geolens.x import a``, ``from geolens import
viz``; ``geolens`` itself is taken as imported in every block) and every attribute chain on such a
name (``geolens.x.y(...)``, ``viz.f(...)``); imports carry over from cell to cell of a notebook,
each block of a page stands alone, an assignment to a bound name unbinds it, and a piece of code
that does not parse fails the test. Each is resolved by importing and ``getattr``: the
first object along the chain that is not a module is the one it names (``geolens.Attribution.load``
names ``geolens.Attribution``). A chain that does not resolve fails the test; modules and objects
that are neither functions nor classes (``geolens.__all__``) need no entry.

The rule for "listed": an object is listed when some ``::: dotted.name`` of docs/api.md resolves to
the very same object (identity), so an entry under the name where the object is defined
(``geolens.faithfulness.evaluation.AttributionEvaluation``) and one under a name that re-exports it
(``geolens.MaskingConfig`` for ``geolens.faithfulness.MaskingConfig``) both count.

Every ``::: name`` must resolve, and every listed function and class must have a ``>>>`` example;
the examples of the entries outside ``geolens.__all__`` run here as doctests, the way
tests/test_public_api.py runs those of ``geolens.__all__`` (skipped under TransformerLens 2.x/3.x,
where ``tiny_bridge`` raises ImportError).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import re
import textwrap
import types
from pathlib import Path

import pytest
from conftest import run_examples

import geolens

ROOT = Path(__file__).resolve().parents[1]
API = ROOT / "docs" / "api.md"
NOTEBOOKS = sorted((ROOT / "tutorials").glob("*.ipynb"))
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
ENTRY = re.compile(r"^::: *([\w.]+) *$", re.M)
FENCE = re.compile(r"^( *)```(\w*)[^\n]*\n(.*?)^\1```", re.M | re.S)
PYTHON_FENCES = {"python", "py", "pycon"}


def resolve(dotted: str):
    """(the dotted name of the first non-module object along ``dotted``, that object), or
    (``dotted``, the module) when every part is a module. Raises ImportError/AttributeError when a
    part names nothing."""
    parts = dotted.split(".")
    obj = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], start=1):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            obj = importlib.import_module(".".join(parts[: i + 1]))
        if not isinstance(obj, types.ModuleType):
            return ".".join(parts[: i + 1]), obj
    return dotted, obj


class _Uses(ast.NodeVisitor):
    """The geolens dotted names a piece of code imports or reaches by attribute chains, in order
    (names bound by imports persist across the visits of one notebook)."""

    def __init__(self):
        self.bound = {"geolens": "geolens"}  # local name -> the geolens dotted name it holds
        self.found: set[str] = set()

    def visit_Import(self, node):
        for a in node.names:
            if a.name.split(".")[0] == "geolens":
                self.found.add(a.name)
                if a.asname:
                    self.bound[a.asname] = a.name
                else:
                    self.bound["geolens"] = "geolens"

    def visit_ImportFrom(self, node):
        if node.level == 0 and (node.module or "").split(".")[0] == "geolens":
            for a in node.names:
                self.found.add(f"{node.module}.{a.name}")
                self.bound[a.asname or a.name] = f"{node.module}.{a.name}"

    def _unbind(self, target):
        for n in ast.walk(target):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                self.bound.pop(n.id, None)

    def visit_Assign(self, node):
        self.visit(node.value)
        for t in node.targets:
            self._unbind(t)

    def visit_Attribute(self, node):
        chain, n = [], node
        while isinstance(n, ast.Attribute):
            chain.append(n.attr)
            n = n.value
        if isinstance(n, ast.Name) and n.id in self.bound:
            self.found.add(".".join([self.bound[n.id], *reversed(chain)]))
        else:
            self.generic_visit(node)

    def visit_Name(self, node):
        if isinstance(node.ctx, ast.Load) and node.id in self.bound:
            self.found.add(self.bound[node.id])


def _python(code: str) -> str:
    """Code as Python: doctest prompts stripped, IPython magics and shell lines dropped."""
    lines = code.splitlines()
    if any(line.lstrip().startswith(">>>") for line in lines):
        lines = [line.lstrip()[4:] for line in lines if line.lstrip()[:4] in (">>> ", "... ", ">>>", "...")]
    return "\n".join(line for line in lines if not line.lstrip().startswith(("%", "!")))


def _sources() -> dict[str, list[str]]:
    """{file: its code pieces, in order} for every tutorial and docs page."""
    out = {}
    for nb in NOTEBOOKS:
        cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
        out[str(nb.relative_to(ROOT))] = [_python("".join(c["source"])) for c in cells if c["cell_type"] == "code"]
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        out[str(page.relative_to(ROOT))] = [
            _python(textwrap.dedent(m.group(3))) for m in FENCE.finditer(text) if m.group(2) in PYTHON_FENCES
        ]
    return out


def used_names() -> dict[str, set[str]]:
    """{geolens dotted name used: the files using it}. A piece of code that does not parse fails."""
    used: dict[str, set[str]] = {}
    for where, pieces in _sources().items():
        uses = _Uses()
        for i, code in enumerate(pieces):
            if where.endswith(".md"):
                uses = _Uses()  # each block of a page stands alone
            try:
                tree = ast.parse(code)
            except SyntaxError as err:
                raise AssertionError(f"{where}: code piece {i} does not parse: {err}") from err
            uses.visit(tree)
        for name in uses.found:
            used.setdefault(name, set()).add(where)
    return used


def api_entries() -> list[str]:
    return ENTRY.findall(API.read_text(encoding="utf-8"))


def _documentable(obj) -> bool:
    return inspect.isclass(obj) or inspect.isfunction(obj) or inspect.isbuiltin(obj)


def test_tutorial_copies_are_identical():
    for nb in NOTEBOOKS:
        copy = ROOT / "docs" / "tutorials" / nb.name
        assert copy.is_file() and copy.read_bytes() == nb.read_bytes(), f"docs/tutorials/{nb.name} differs"


def test_the_scan_finds_the_ways_code_names_geolens():
    code = (
        "import geolens\nfrom geolens import viz\nfrom geolens.sinks import NormCurve as N\n"
        "import geolens.flow.routes as r\nviz.str_tokens(m, t)\ngeolens.hf.prepare(x).y\nr.flow_routes()\n"
        "sinks = 3\nsinks.semantic_drift\n"
    )
    uses = _Uses()
    uses.visit(ast.parse(code))
    assert uses.found == {
        "geolens",
        "geolens.viz",
        "geolens.sinks.NormCurve",
        "geolens.flow.routes",
        "geolens.viz.str_tokens",
        "geolens.hf.prepare",  # a call ends the chain
        "geolens.flow.routes.flow_routes",
    }
    assert resolve("geolens.Attribution.load") == ("geolens.Attribution", geolens.Attribution)
    assert resolve("geolens.viz.sinks.drift_plot")[0] == "geolens.viz.sinks.drift_plot"
    assert isinstance(resolve("geolens.interventions.base")[1], types.ModuleType)


def test_every_entry_resolves():
    entries = api_entries()
    assert len(entries) >= 40, len(entries)
    assert len(set(entries)) == len(entries), sorted({e for e in entries if entries.count(e) > 1})
    bad = []
    for name in entries:
        try:
            full, obj = resolve(name)
        except (ImportError, AttributeError) as err:
            bad.append(f"{name}: {err}")
            continue
        if full != name or not _documentable(obj):
            bad.append(f"{name}: not a function or class")
    assert not bad, bad


def test_every_geolens_function_or_class_the_guides_use_is_listed():
    listed = {id(resolve(name)[1]) for name in api_entries()}
    unresolved, missing = [], {}
    for name, files in sorted(used_names().items()):
        try:
            full, obj = resolve(name)
        except (ImportError, AttributeError) as err:
            unresolved.append(f"{name} ({', '.join(sorted(files))}): {err}")
            continue
        if _documentable(obj) and id(obj) not in listed:
            missing.setdefault(full, set()).update(files)
    assert not unresolved, f"the guides name what geolens does not have: {unresolved}"
    assert not missing, "used by the guides but without a `::: name` entry in docs/api.md: " + "; ".join(
        f"{name} ({', '.join(sorted(files))})" for name, files in sorted(missing.items())
    )


def _entries_outside_all() -> list[str]:
    public = {id(getattr(geolens, n)) for n in geolens.__all__}
    return [n for n in api_entries() if id(resolve(n)[1]) not in public]


@pytest.mark.parametrize("name", api_entries())
def test_every_entry_has_an_example(name):
    _, obj = resolve(name)
    assert ">>>" in (obj.__doc__ or ""), f"{name} has no >>> example in its docstring"


@pytest.mark.parametrize("name", _entries_outside_all())
def test_examples_outside_all_run(name):
    _, obj = resolve(name)
    run_examples(obj, name)
