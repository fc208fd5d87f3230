"""Shared inputs of the HF-native backend tests: token rows longer than the tiny sliding windows,
each family's prepared tiny model with its full cache (``family_cache``), and the attention modules found by
class name (``N_POS``, ``hf_tokens`` and ``attention_modules`` are imported as
``from hf.conftest import ...``)."""

from __future__ import annotations

import pytest
import torch

import geolens
from geolens.hf import prepare
from geolens.hf.tiny import FAMILIES, tiny_family

N_POS = 12  # longer than the tiny sliding windows (8)


def hf_tokens(n_rows: int = 2, n_pos: int = N_POS, seed: int = 0) -> torch.Tensor:
    """``[n_rows, n_pos]`` ids in 4 … 63 from ``seed``, BOS (0) first."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(4, 64, (n_rows, n_pos), generator=g)
    t[:, 0] = 0
    return t


@pytest.fixture(scope="package", params=FAMILIES)
def family_cache(request):
    """(family, prepared tiny model, tokens [2, 12], full cache)."""
    model = prepare(tiny_family(request.param))
    tokens = hf_tokens()
    with torch.no_grad():
        _, cache = geolens.run_with_cache(model, tokens)
    return request.param, model, tokens, cache


def attention_modules(model) -> list[torch.nn.Module]:
    """The attention modules in layer order, found by class name (not through the adapter)."""
    found = [m for name, m in model.named_modules() if type(m).__name__.endswith("Attention")]
    assert len(found) == model.config.num_hidden_layers
    return found
