"""The public API: one ``geolens.__all__`` whose every name carries a runnable ``>>>`` example.

The examples run here as doctests on the tiny random models, under TransformerLens 4.x (and, for
the names whose examples do not need a ``TransformerBridge``, under 2.x/3.x too).
"""

from __future__ import annotations

import pytest
from conftest import run_examples

import geolens

BRIDGE_ONLY = {"adapter_for"}  # its example names the TL 4.x adapter class


def test_one_all_of_15_to_32_names_all_importable():
    assert 15 <= len(geolens.__all__) <= 32  # a small API: everything else is imported from its module
    assert len(set(geolens.__all__)) == len(geolens.__all__)
    for name in geolens.__all__:
        assert getattr(geolens, name) is not None, name


@pytest.mark.parametrize("name", geolens.__all__)
def test_every_public_name_has_a_runnable_example(name, monkeypatch):
    obj = getattr(geolens, name)
    assert ">>>" in (obj.__doc__ or ""), f"geolens.{name} has no >>> example"
    run_examples(obj, f"geolens.{name}")
