"""The tiny models of the geolens.intervene tests, both architectures, warmed up once."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import make_tiny
from tests.intervene.hand import TEXTS


@pytest.fixture(scope="module", params=["gqa", "mha"])
def model(request):
    model = make_tiny(request.param)
    with torch.no_grad():  # transformers registers hooks of its own on the first cached forward (docs/tl-notes.md)
        model.run_with_cache(model.to_tokens(TEXTS[0]))
    return model
