"""The adapter as a whole: no family branching outside geolens/adapter (and the loading modules),
and the adapter modules' examples run. Each module's own tests: tests/adapter/test_<module>.py."""

from __future__ import annotations

import pytest

import geolens

# ---------------------------------------------------------------------------------------------
# No family branching outside the adapter (and the loading module)

_FAMILY_NAMES = frozenset(
    {
        "is_bridge",
        "original_model",
        "HookedTransformer",
        "HookedTransformerConfig",
        "TransformerBridge",
        "enable_compatibility_mode",
        "use_normalization_before_and_after",
        "attn_types",
        "layer_types",
        "original_architecture",
        "n_key_value_heads",
        "looks_like_bridge",
    }
)
_FAMILY_STRINGS = _FAMILY_NAMES - {"n_key_value_heads"}  # recorded as a config field by checkpoint/report
_RAW_HOOKS = ("hook_resid", "hook_attn_out", "ln_final", "unembed.hook", "attn.hook_out")
_FAMILY_WORDS = ("gemma", "llama", "gpt2", "gpt-2", "mistral", "qwen", "bridge", "hooked")
_WEIGHTS = frozenset({"W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"})
_ALLOWED = ("adapter/", "families/", "models.py")  # geolens/adapter, geolens/families and geolens/models.py
_TINY_KINDS_ALLOWED = {"testing.py"}  # chooses which tiny HF model to build by kind ("gemma")


def family_branching(source: str, name: str = "<source>") -> list[str]:
    """Places in ``source`` that branch on the model family or TransformerLens version, outside
    docstrings and comments: family names (``is_bridge``, ``original_model``, the TL classes, the
    config fields that tell families apart), TransformerLens imports, raw hook names of the
    residual stream / attention output / unembedding, ``.attn.W_V``-style weight reads,
    ``hasattr(model, ...)`` and comparisons with architecture names."""
    import ast

    tree = ast.parse(source)
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.add(id(first.value))
    found = []
    for node in ast.walk(tree):
        where = f"{name}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Name) and node.id in _FAMILY_NAMES:
            found.append(f"{where} {node.id}")
        elif isinstance(node, ast.Attribute):
            if node.attr in _FAMILY_NAMES:
                found.append(f"{where} .{node.attr}")
            if node.attr in _WEIGHTS and isinstance(node.value, ast.Attribute) and node.value.attr == "attn":
                found.append(f"{where} .attn.{node.attr}")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in node.names] + ([node.module] if getattr(node, "module", None) else [])
            if any(m.split(".")[0] == "transformer_lens" for m in modules):
                found.append(f"{where} import transformer_lens")
            found += [f"{where} import {a.name}" for a in node.names if a.name in _FAMILY_NAMES]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            if node.value in _FAMILY_STRINGS or any(h in node.value for h in _RAW_HOOKS):
                found.append(f"{where} {node.value!r}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "hasattr":
            if node.args and isinstance(node.args[0], ast.Name) and node.args[0].id == "model":
                found.append(f"{where} hasattr(model, ...)")
        elif isinstance(node, ast.Compare) and not any(name.endswith(f) for f in _TINY_KINDS_ALLOWED):
            for side in (node.left, *node.comparators):
                if (
                    isinstance(side, ast.Constant)
                    and isinstance(side.value, str)
                    and any(w in side.value.lower() for w in _FAMILY_WORDS)
                ):
                    found.append(f"{where} compares with {side.value!r}")
    return found


def test_the_family_scan_finds_branching():
    """The scan below is not vacuous: each kind of branching it looks for is found."""
    bad = '''
from transformer_lens import HookedTransformer
def f(model, cache, l):
    """is_bridge(model) in a docstring is fine"""
    if is_bridge(model) or hasattr(model, "original_model"):  # a comment: hook_resid_pre is fine
        x = cache[f"blocks.{l}.hook_resid_pre"]
    if model.cfg.original_architecture == "Gemma3ForCausalLM" or getattr(model.cfg, "attn_types", None):
        W = model.blocks[l].attn.W_V
    return model_mode(model) == "bridge-compat"
'''
    found = " ".join(family_branching(bad))
    for needle in (
        "import transformer_lens",
        "import HookedTransformer",
        ":5 is_bridge",
        "hasattr(model",
        "'original_model'",
        "hook_resid_pre",
        ".original_architecture",
        "'Gemma3ForCausalLM'",
        "'attn_types'",
        ".attn.W_V",
        "'bridge-compat'",
    ):
        assert needle in found, needle
    assert ":4 " not in found  # the docstring


def test_no_family_branching_outside_the_adapter():
    """Only the geolens/adapter package (reading models), geolens/families (what geolens knows of
    each family) and geolens/models.py (loading them) may know model families and TransformerLens
    versions."""
    from pathlib import Path

    root = Path(geolens.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).as_posix().startswith(_ALLOWED):
            continue
        found += family_branching(path.read_text(encoding="utf-8"), str(path.relative_to(root.parent)))
    assert not found, (
        "family branching outside geolens/adapter/, geolens/families/ and geolens/models.py:\n" + "\n".join(found)
    )


@pytest.mark.bridge_only
def test_the_adapter_modules_examples_run():
    """The ``>>>`` examples of every module of the geolens/adapter package (the family registry, the
    layer view) and of geolens.layout (hook names, the grouped-query rule) run as doctests."""
    import doctest
    import importlib
    import pkgutil

    import geolens.adapter

    attempted = {}
    names = [f"geolens.adapter.{info.name}" for info in pkgutil.iter_modules(geolens.adapter.__path__)] + [
        "geolens.layout"
    ]
    for name in names:
        module = importlib.import_module(name)
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed"
        attempted[name] = result.attempted
    assert all(attempted[f"geolens.{name}"] > 0 for name in ("layout", "adapter.registry", "adapter.layer")), attempted


# ---------------------------------------------------------------------------------------------
# Adding a family from one file: register_family


# ---------------------------------------------------------------------------------------------
# TransformerLens 4.x bridges over tiny random models of other families (geolens.hf.tiny)
