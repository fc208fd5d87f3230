"""Shared fixtures of the sink tests: a tiny model's corpus and cache, whole-vs-parts runs, and a small dose protocol
(``SMALL``, imported as ``from sinks.conftest import SMALL``)."""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny

from geolens.runner import run_corpus
from geolens.sinks.controls_protocol import DoseProtocol
from geolens.testing import tiny_tokens

# a small dose protocol for the dose-response controls (tests of controls_dose, _protocol, _summary)
SMALL = DoseProtocol(
    lambdas=(0.0, 0.5, 2.0), seeds_by_angle=((60.0, 3), (180.0, 2)), n_documents=2, seq_len=12, n_boot=300
)
TEXTS = ("the cat sat on the mat.", "a dog ran far away!!", "it is 42, or 7? no.")


@pytest.fixture(scope="package", params=["gqa", "mha"])
def corpus(request):
    """(model, tokens, cache) of a tiny model on ``TEXTS``: the reference cache of the sink analyses."""
    model = make_tiny(request.param)
    tokens = tiny_tokens(model, TEXTS, length=10)
    # the reference cache is built from the same batches of 2 the analyses use (float32 numerics
    # of a forward pass depend slightly on the batch composition)
    parts = []
    with torch.no_grad():
        for start in range(0, tokens.shape[0], 2):
            parts.append(model.run_with_cache(tokens[start : start + 2])[1])
    cache = {name: torch.cat([p[name] for p in parts]) for name in parts[0].keys()}
    return model, tokens, cache


def _run_whole_and_parts(model, tokens, analysis, *, split: int, batch_size: int):
    """``analysis(n_layers, n_heads)`` run on the whole corpus (in batches of ``batch_size``) and,
    separately, on ``tokens[:split]`` and ``tokens[split:]``: (whole, first part, second part)."""
    whole, a, b = (analysis(model.cfg.n_layers, model.cfg.n_heads) for _ in range(3))
    run_corpus(model, tokens, [whole], batch_size=batch_size, progress=False)
    run_corpus(model, tokens[:split], [a], progress=False)
    run_corpus(model, tokens[split:], [b], progress=False)
    return whole, a, b


@pytest.fixture
def whole_and_parts():
    """:func:`_run_whole_and_parts`, for the merge tests."""
    return _run_whole_and_parts
