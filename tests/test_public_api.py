"""The public API: one ``geolens.__all__`` whose every name carries a runnable ``>>>`` example.

The examples run here as doctests on the tiny random models, under TransformerLens 4.x (and, for
the names whose examples do not need a ``TransformerBridge``, under 2.x/3.x too).
"""

from __future__ import annotations

import doctest
import sys

import pytest

import geolens

BRIDGE_ONLY = {"adapter_for"}  # its example names the TL 4.x adapter class


def test_one_all_of_15_to_32_names_all_importable():
    assert 15 <= len(geolens.__all__) <= 32  # a small API: everything else is imported from its module
    assert len(set(geolens.__all__)) == len(geolens.__all__)
    for name in geolens.__all__:
        assert getattr(geolens, name) is not None, name


@pytest.mark.parametrize("name", geolens.__all__)
def test_every_public_name_has_a_runnable_example(name, monkeypatch):
    from geolens.adapter import is_bridge
    from geolens.testing import tiny_bridge

    obj = getattr(geolens, name)
    assert ">>>" in (obj.__doc__ or ""), f"geolens.{name} has no >>> example"
    try:
        bridge = is_bridge(tiny_bridge("gqa"))
    except ImportError:
        bridge = False
    if not bridge:
        pytest.skip("the examples use TransformerLens 4.x TransformerBridge models")
    finder = doctest.DocTestFinder(recurse=False)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    tests = finder.find(
        obj, name=f"geolens.{name}", globs=dict(vars(sys.modules[obj.__module__]))
    )  # as doctest-modules does
    assert tests and tests[0].examples, name
    for t in tests:
        runner.run(t)
    res = runner.summarize(verbose=False)
    assert res.failed == 0, (
        f"geolens.{name}: {res.failed} of {res.attempted} examples failed (run pytest -s to see them)"
    )
