"""Shared inputs of the per-term tests: one text row per tiny model, longer than the tiny Gemma's
sliding window (``N_POS`` is imported as ``from per_term.conftest import N_POS``)."""

from __future__ import annotations

import pytest

from geolens.testing import tiny_tokens

N_POS = 24  # longer than the tiny Gemma's 16-token window: its layer 0 has terms with α = 0


@pytest.fixture(scope="package")
def text(tiny):
    """(tiny model, one row of N_POS tokens) for each tiny kind."""
    model = tiny[0]
    return model, tiny_tokens(model, length=N_POS)[:1]
