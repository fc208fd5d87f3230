"""Shared inputs of the flow erasure tests: held-out news-like texts, small erasure settings and
each tiny model (``KINDS``, ``SMALL``, ``TEXTS`` and ``text_tokens`` are imported as
``from flow.conftest import ...``)."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY_KINDS, make_tiny

from geolens.interventions.base import active_hook_count

KINDS: dict[int, str] = {}


@pytest.fixture(scope="package", params=TINY_KINDS)
def erasure_model(request):
    """Each tiny model, its kind recorded in ``KINDS`` and its hook count after a first forward in
    ``geolens_test_hooks``."""
    m = make_tiny(request.param)
    KINDS[id(m)] = request.param
    with torch.no_grad():  # the bridge's first run_with_cache leaves transformers' own output-capturing hooks
        m.run_with_cache(torch.tensor([[0, 5, 6]]))
    m.geolens_test_hooks = active_hook_count(m)
    return m


# a few short documents (the TL 2.x environment has no gensim, hence no offline corpora)
TEXTS = [
    "the river rose overnight and the bridge was closed to traffic until noon.",
    "a new library opened in the town centre, with a cafe on its top floor.",
    "farmers expect a late harvest after three weeks of cold and rain.",
    "the council voted to repair the old school roof before the winter.",
    "two climbers reached the summit on friday and came down safely.",
    "prices of fresh fruit fell as the first summer crops reached the market.",
]


def text_tokens(model, n: int = 14, doc: int = 0) -> torch.Tensor:
    """BOS and the first ``n`` − 1 tokens of ``TEXTS[doc]``."""
    ids = model.tokenizer(TEXTS[doc], add_special_tokens=False)["input_ids"][: n - 1]
    return torch.tensor([model.tokenizer.bos_token_id] + ids)


SMALL = dict(
    positions=(6, 11),
    fractions=(0.1, 0.5),
    methods=("random", "contribution", "grad_x_input", "integrated_gradients"),
    ig_steps=4,
    n_boot=200,
)
