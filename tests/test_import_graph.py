"""The import graph of geolens/: no cycles, imports that run down the layers, no pipeline importing
the report, no source file over 600 lines (CONTRIBUTING.md, "Layers").

The graph is read from the source with ``ast``, without importing anything: every ``import`` and
``from ... import`` of a geolens module, at module level *and* inside functions (an import that
runs late still couples two modules), relative imports resolved. ``from pkg import name`` is an
edge to ``pkg.name`` when that is a module, else to ``pkg``; importing ``pkg.sub.mod`` from outside
``pkg.sub`` also runs ``pkg/sub/__init__.py``, so it is an edge to ``pkg.sub`` too (the root
``geolens/__init__.py`` aside, which every import runs).
"""

from __future__ import annotations

import ast
import fnmatch
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "geolens"

# Layers, lowest first: a module may import its own layer and the layers below it, never above.
# A module's layer is that of its first name under geolens/ (geolens.sinks.drift: "sinks").
LAYERS: dict[str, tuple[str, ...]] = {
    "core maths": (
        "_version",
        "errors",
        "layout",
        "validation",
        "stats",
        "files",
        "finite",
        "streaming",
        "visibility",
        "adapter",
        "families",
        "geometry",
        "contributions",
        "factors",
    ),
    "corpus engine": (
        "data",
        "checkpoint",
        "runner",
        "distributed",
        "model_cache",
        "models",
        "testing",
        "hf",
        "claims",
        "resume",
        "preregistration",
        "threads",
    ),
    "topics": (
        "interventions",
        "metrics",
        "sinks",
        "selection",
        "taxonomy",
        "faithfulness",
        "flow",
        "per_term",
        "pruning",
        "multiple_choice",
        "viz",
        "methods",
        "attribution",
        "intervene",
        "stability",
    ),
    "interfaces": ("pipelines", "report", "commands", "run_folder", "folder_lock", "cli", "__main__", "__init__"),
}

# Edges allowed to close a cycle or point up the layers while another change reshapes their code,
# (importer, imported) → the reason; remove an entry when its edge goes (the test fails on an entry
# whose edge no longer exists). None today.
ALLOWED_EDGES: dict[tuple[str, str], str] = {}

# Within a layer, an idea that sits below another: (lower, higher) → why no module of the lower
# (the module itself or one under it) imports a module of the higher.
BELOW: dict[tuple[str, str], str] = {
    ("geolens.multiple_choice", "geolens.faithfulness"): "questions and their scoring are what multiple "
    "choice under masks (geolens.faithfulness.mc_curves, geolens.faithfulness.multiple_choice) builds on",
    ("geolens.methods", "geolens.faithfulness"): "the registry of methods is what the faithfulness evaluations "
    "read (evaluate_attribution); the metrics it lists, Value Zeroing included, register with geolens.metrics",
    ("geolens.metrics", "geolens.faithfulness"): "the metrics are what faithfulness ranks; Value Zeroing is "
    "computed below both (geolens.interventions.value_zeroing)",
    ("geolens.faithfulness", "geolens.attribution"): "attribute() is the one-call interface over the "
    "methods; evaluate_attribution loads a model by name through geolens.models.resolve_model, as attribute() does",
}

MAX_LINES = 600
SOURCE_SUFFIXES = (".py", ".j2", ".html", ".css", ".js")  # code; data files (mc_data/) aside
# Files allowed over MAX_LINES (glob patterns under geolens/) while another change reshapes them,
# each removed when its file shrinks (the test fails on an entry that matches no long file). None
# today: the last ones (per_term.py, now the geolens/per_term package, and
# faithfulness/norm_controlled.py, now beside norm_controlled_stats.py, norm_controlled_summary.py
# and pipelines/norm_controlled_text.py) were split by idea.
LONG_FILES_ALLOWED: tuple[str, ...] = ()


# A command parses its options and prints; what it runs and writes is its pipeline's
# (geolens/pipelines/<topic>.py, the text in <topic>_text.py). The shared option helpers aside.
COMMAND_MAX_LINES = 200
COMMAND_HELPERS = ("_options.py", "_names.py")


def module_files(package: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name → file, for every .py under ``package`` (a package by its ``__init__``)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ``modules`` that module ``name`` (source at ``path``) imports, anywhere in it."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                if f"{source}.{alias.name}" in modules:
                    found.add(f"{source}.{alias.name}")
                elif source in modules:
                    found.add(source)
    root = next(iter(modules)).split(".")[0] if modules else ""
    for target in list(found):  # the __init__ of each subpackage the import enters from outside
        parts = target.split(".")
        for i in range(2, len(parts)):
            parent = ".".join(parts[:i])
            if parent in modules and parent != root and not (name == parent or name.startswith(parent + ".")):
                found.add(parent)
    found.discard(name)
    return found


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    modules = module_files(package)
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph.get(succ, ())))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
    return out


def without_allowed(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    return {a: {b for b in targets if (a, b) not in ALLOWED_EDGES} for a, targets in graph.items()}


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of ``module`` (KeyError for a module that no layer lists)."""
    first = module.split(".")[1] if "." in module else "__init__"
    for i, members in enumerate(LAYERS.values()):
        if first in members:
            return i
    raise KeyError(module)


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


# ---------------------------------------------------------------------------------------------
# The reader itself, on a package written here


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root / "pkg"


def test_the_reader_finds_every_kind_of_import_and_the_cycles(tmp_path):
    package = _write(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg import a\n",
            "pkg/a.py": "import os\nfrom pkg.sub import b\n",
            "pkg/sub/__init__.py": "from . import b\n",
            "pkg/sub/b.py": "def f():\n    from ..c import g  # function level, relative\n",
            "pkg/c.py": '"""from pkg import a (a docstring, not an import)"""\ndef g():\n    import pkg.a\n',
            "pkg/d.py": "from pkg.sub.b import f\nfrom pkg.c import g\n",
        },
    )
    g = import_graph(package)
    assert g["pkg"] == {"pkg.a"}
    assert g["pkg.a"] == {"pkg.sub.b", "pkg.sub"}  # entering pkg.sub from outside runs its __init__
    assert g["pkg.sub"] == {"pkg.sub.b"}
    assert g["pkg.sub.b"] == {"pkg.c"}
    assert g["pkg.c"] == {"pkg.a"}
    assert g["pkg.d"] == {"pkg.sub.b", "pkg.sub", "pkg.c"}
    assert cycles(g) == [["pkg.a", "pkg.c", "pkg.sub", "pkg.sub.b"]]
    g["pkg.c"] = set()
    assert cycles(g) == []


def test_layers_name_each_module_once():
    names = [name for members in LAYERS.values() for name in members]
    assert len(names) == len(set(names))
    assert layer_of("geolens.adapter.layer") == 0 and layer_of("geolens.runner") == 1 and layer_of("geolens") == 3


# ---------------------------------------------------------------------------------------------
# geolens/


def test_no_import_cycle(graph):
    found = cycles(without_allowed(graph))
    assert not found, "import cycles among geolens modules (function-level imports included):\n" + "\n".join(
        " ⇄ ".join(c) + "\n    " + "; ".join(f"{a} → {b}" for a in c for b in sorted(graph[a]) if b in c) for c in found
    )


def test_every_allowed_edge_still_exists(graph):
    stale = [edge for edge in ALLOWED_EDGES if edge[1] not in graph.get(edge[0], ())]
    assert not stale, f"these allowed edges are gone: remove them from ALLOWED_EDGES: {stale}"


def test_every_module_has_a_layer(graph):
    missing = []
    for module in graph:
        try:
            layer_of(module)
        except KeyError:
            missing.append(module)
    assert not missing, f"add these modules to a layer of LAYERS (and CONTRIBUTING.md): {missing}"


def test_imports_run_down_the_layers(graph):
    names = list(LAYERS)
    up = [
        f"{a} ({names[layer_of(a)]}) → {b} ({names[layer_of(b)]})"
        for a, targets in sorted(without_allowed(graph).items())
        for b in sorted(targets)
        if layer_of(b) > layer_of(a)
    ]
    assert not up, "imports that point up the layers (core maths → corpus engine → topics → interfaces):\n" + "\n".join(
        up
    )


def _in(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_ideas_below_others_do_not_import_them(graph):
    assert all(low in graph and high in graph for low, high in BELOW), f"BELOW names a missing module: {list(BELOW)}"
    bad = [
        f"{a} → {b}: {why}"
        for (low, high), why in BELOW.items()
        for a, targets in sorted(graph.items())
        if _in(a, low)
        for b in sorted(targets)
        if _in(b, high)
    ]
    assert not bad, "imports of an idea that sits above the importer (BELOW):\n" + "\n".join(bad)


def test_pipelines_do_not_import_the_report(graph):
    bad = [
        f"{a} → {b}"
        for a, targets in sorted(graph.items())
        if a == "geolens.pipelines" or a.startswith("geolens.pipelines.")
        for b in sorted(targets)
        if b == "geolens.report" or b.startswith("geolens.report.")
    ]
    assert not bad, "pipelines import the report (claims and sample sizes live in geolens.claims):\n" + "\n".join(bad)


def _source_files() -> dict[str, int]:
    out = {}
    for path in sorted(PACKAGE.rglob("*")):
        if path.is_file() and path.suffix in SOURCE_SUFFIXES and "__pycache__" not in path.parts:
            out[path.relative_to(PACKAGE).as_posix()] = len(path.read_text(encoding="utf-8").splitlines())
    return out


def test_commands_only_parse_and_print():
    lengths = {
        path.name: len(path.read_text(encoding="utf-8").splitlines())
        for path in sorted((PACKAGE / "commands").glob("*.py"))
        if path.name not in COMMAND_HELPERS
    }
    long = {name: n for name, n in lengths.items() if n > COMMAND_MAX_LINES}
    assert not long, (
        f"command modules over {COMMAND_MAX_LINES} lines (move the work to geolens/pipelines/<topic>.py "
        f"and the text to <topic>_text.py): {long}"
    )


def test_no_source_file_over_600_lines():
    files = _source_files()
    long = {
        rel: n
        for rel, n in files.items()
        if n > MAX_LINES and not any(fnmatch.fnmatch(rel, p) for p in LONG_FILES_ALLOWED)
    }
    assert not long, f"files over {MAX_LINES} lines (split them by idea): {long}"
    stale = [
        p for p in LONG_FILES_ALLOWED if not any(fnmatch.fnmatch(rel, p) and n > MAX_LINES for rel, n in files.items())
    ]
    assert not stale, (
        f"no file over {MAX_LINES} lines matches these entries any more: remove them from LONG_FILES_ALLOWED: {stale}"
    )
