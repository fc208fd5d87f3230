"""The one registry of attribution methods (geolens.methods, geolens.list_methods): every method the
command line and the protocols accept is in it, registered metrics join it, and the docs' table is
generated from it."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

import geolens
from geolens import methods
from geolens.flow import ERASURE_METHODS, FLOW_METHODS
from geolens.metrics import metric_names, unregister_metric

ROOT = Path(__file__).resolve().parents[1]


def test_list_methods_columns_levels_and_citations():
    table = geolens.list_methods()
    assert list(table.columns) == ["name", "level", "needs", "citation", "description"]
    assert table.name.is_unique and set(table.level) == {"head", "layer", "model"}
    assert set(table.needs) <= {"none", "cache", "gradients", "reruns"}
    model = table[table.level == "model"]
    assert len(model) == 6 and (model.citation != "").all()
    assert table.set_index("name").loc["value_zeroing", "level"] == "layer"
    assert set(geolens.list_methods("head").level) == {"head"}
    with pytest.raises(ValueError, match="level must be one of"):
        geolens.list_methods("token")


def test_every_flow_erasure_and_metric_name_is_registered():
    for key in FLOW_METHODS:
        assert methods.method_for("flow", key) is not None, key
    for key in ERASURE_METHODS:
        assert any(methods.method_for(f, key) for f in ("flow", "gradient", "metric")), key
    for name in metric_names():
        assert methods.method_for("metric", name) is not None, name


def _choice_actions(parser: argparse.ArgumentParser, prefix: str = ""):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _choice_actions(sub, f"{prefix}{name} ")
        elif action.choices and action.dest in ("method", "methods", "metric", "metrics"):
            yield prefix.strip(), action


def test_every_cli_method_choice_is_in_the_registry():
    from geolens.cli import build_parser

    found = list(_choice_actions(build_parser()))
    assert found, "no command offers a method choice"  # geolens flow --method does
    keys = {m.key for m in methods.methods()} | {m.name for m in methods.methods()}
    for command, action in found:
        missing = [c for c in action.choices if c not in keys]
        assert not missing, f"geolens {command} {action.option_strings}: {missing} not in geolens.list_methods()"


def test_cli_flow_choices_come_from_the_registry():
    from geolens.cli import build_parser

    (flow,) = [a for c, a in _choice_actions(build_parser()) if c == "flow"]
    assert tuple(flow.choices) == tuple(m.key for m in methods.model_methods("flow"))


def test_a_registered_metric_joins_the_registry():
    geolens.register_metric("twice_alpha", label="2α", fn=lambda x: 2 * x.alpha, citation="a test")
    try:
        m = methods.get_method("twice_alpha")
        assert (m.level, m.needs, m.citation, m.family) == ("head", "cache", "a test", "metric")
    finally:
        unregister_metric("twice_alpha")
    with pytest.raises(ValueError, match="unknown method 'twice_alpha'"):
        methods.get_method("twice_alpha")


def test_model_methods_import_no_torch():
    import subprocess
    import sys

    code = "import sys, geolens.methods as m; m.model_methods('flow'); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr


def test_docs_table_is_the_registry():
    page = (ROOT / "docs" / "methods.md").read_text(encoding="utf-8")
    assert methods.markdown_table() in page, (
        "docs/methods.md is stale: regenerate its table with python -m geolens.methods"
    )
