"""The argument checks and state of per_term_effects (geolens.per_term.state): bad tokens, layers,
queries, scopes, outcomes and batch sizes are one-line errors."""

from __future__ import annotations

import pytest

from geolens.per_term import per_term_effects


def test_bad_arguments_are_one_line_errors(tiny_gqa):
    model, tokens, _ = tiny_gqa
    with pytest.raises(ValueError, match="one unpadded text"):
        per_term_effects(model, tokens, 0, 3)  # a batch of 2
    with pytest.raises(TypeError, match="integer tensor"):
        per_term_effects(model, tokens[0].float(), 0, 3)
    with pytest.raises(IndexError, match="query=12"):
        per_term_effects(model, tokens[:1], 0, 12)
    with pytest.raises(IndexError, match="layer=2"):
        per_term_effects(model, tokens[:1], 2, 3, method="naive")
    with pytest.raises(ValueError, match="scope"):
        per_term_effects(model, tokens[:1], 0, 3, scope="row")
    with pytest.raises(ValueError, match="outcome"):
        per_term_effects(model, tokens[:1], 0, 3, outcome="nll")
    with pytest.raises(ValueError, match="batch_size"):
        per_term_effects(model, tokens[:1], 0, 3, batch_size=0)
    with pytest.raises(ValueError, match="method must be 'fast' or 'naive'"):
        per_term_effects(model, tokens[:1], 0, 3, method="exact")
    assert per_term_effects(model, tokens[0], 0, 3).kl.shape == (4, 4)  # [pos] is one text
