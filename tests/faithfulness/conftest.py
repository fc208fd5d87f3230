"""Shared inputs of the faithfulness tests: protocol 2's masking protocol on short windows and one
masked document per tiny model (``masking_protocol`` and ``N_POS`` are imported as
``from faithfulness.conftest import ...``)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import TINY_KINDS, make_tiny

from geolens.faithfulness.layer_masking import layer_masking_document
from geolens.interventions.base import active_hook_count
from geolens.testing import tiny_tokens

TWIN = Path(__file__).resolve().parents[2] / "docs" / "faithfulness" / "protocol.json"
N_POS = 40  # beyond the tiny Gemma's 16-token sliding window: some sources are no terms there


def masking_protocol(**secondary) -> dict:
    """Protocol 2's twin (docs/faithfulness/protocol.json) with scored positions 4 … N_POS − 4 and ``secondary`` overrides."""
    p = json.loads(TWIN.read_text(encoding="utf-8"))
    p["secondary"]["scored_positions"] = [4, N_POS - 4, 4]
    p["secondary"].update(secondary)
    return p


@pytest.fixture(scope="package", params=TINY_KINDS)
def document(request):
    """One masked document of a 3-layer tiny model: (model, tokens, protocol, unigram, rows, logits, cache)."""
    model = make_tiny(request.param, n_layers=3)
    tokens = tiny_tokens(model, length=N_POS)[:1]
    protocol = masking_protocol()
    unigram = torch.log_softmax(
        torch.randn(model.cfg.d_vocab, generator=torch.Generator().manual_seed(1), dtype=torch.float64), -1
    )
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
    before = active_hook_count(model)  # transformers keeps hooks of its own after a first forward
    rows = layer_masking_document(model, tokens, 4, protocol=protocol, unigram_logprobs=unigram, batch_size=32)
    assert active_hook_count(model) == before
    return model, tokens, protocol, unigram, rows, logits, cache


@pytest.fixture(scope="package")
def norm_controlled_run():
    """Protocol 3's per-term tables of three short documents of a float64 tiny bridge (float64_exact):
    (model, tokens, terms, positions). Needs TransformerLens 4.x (its tests are bridge_only)."""
    from geolens.faithfulness.norm_controlled import norm_controlled_document
    from geolens.per_term import float64_exact
    from geolens.testing import tiny_bridge

    model = tiny_bridge("gqa").to(torch.float64)
    tokens = tiny_tokens(
        model, ("the cat sat on the mat.", "a dog ran far away!!", "seven wizards judge boxing"), length=24
    )
    parts = []
    with float64_exact(model):
        for d in range(3):
            parts.append(norm_controlled_document(model, tokens[d : d + 1], d, n_positions=2, queries=(8, 22)))
    terms = pd.concat([p[0] for p in parts], ignore_index=True)
    positions = pd.concat([p[1] for p in parts], ignore_index=True)
    return model, tokens, terms, positions
