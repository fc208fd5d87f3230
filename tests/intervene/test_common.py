"""geolens.intervene._common: texts as token groups of equal length, in the call's order."""

from __future__ import annotations

import pytest
import torch

from geolens.intervene._common import _texts
from tests.conftest import make_tiny


def test_texts_are_grouped_by_length_and_keep_their_order():
    model = make_tiny("gqa")
    t = _texts(model, ["a dog ran", "the cat sat", "a cat"])
    assert t.n == 3
    assert [g.shape[1] for g in t.groups] == sorted(g.shape[1] for g in t.groups)
    flat = {i: g[r] for g, index in zip(t.groups, t.index) for r, i in enumerate(index)}
    for i, text in enumerate(["a dog ran", "the cat sat", "a cat"]):
        assert torch.equal(flat[i], model.to_tokens(text)[0])
    one = _texts(model, model.to_tokens("the cat"))
    assert one.n == 1 and one.index == [[0]]
    with pytest.raises(TypeError, match="integer tensor"):
        _texts(model, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="seq ≥ 2"):
        _texts(model, torch.zeros(1, 1, dtype=torch.long))
    with pytest.raises(ValueError, match=r"texts\[1\] must be a non-empty string"):
        _texts(model, ["the cat", ""])
    with pytest.raises(TypeError, match="texts must be"):
        _texts(model, 3)
