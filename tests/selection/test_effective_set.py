"""The effective selection set (geolens.selection.effective_set, docs/method.md §6): on a tiny model,
the unedited NLL equals the model's own token NLL and keeping N ≥ the window changes nothing; N*
and its stable variant on a constructed table."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from geolens.selection.effective_set import effective_set_size, n_star, token_nll_sum
from selection.conftest import corpus


def test_effective_set_size_and_n_star(tiny_gqa):
    model, _, _ = tiny_gqa
    tokens = corpus(model)
    res = effective_set_size(model, tokens, sizes=[1, 4, 12], batch_size=2, progress=False)
    nll = res["nll"]
    with torch.no_grad():
        s, c = token_nll_sum(model(tokens), tokens)
    base = nll[nll.ranking == "none"].iloc[0]
    assert base.nll == pytest.approx(s / c) and base.n_tokens == c == 4 * 11
    full = nll[nll.N == 12]
    assert np.allclose(full.relative_increase, 0, atol=1e-6)  # N ≥ window keeps everything
    assert set(res["n_star"].ranking) == {"attention", "norm"}
    table = pd.DataFrame(
        dict(ranking=["none"] + ["attention"] * 4, N=[0, 1, 2, 4, 8], nll=[1.0, 1.3, 1.04, 1.06, 1.0], n_tokens=[1] * 5)
    )
    table["relative_increase"] = table.nll - 1.0
    ns = n_star(table, (0.01, 0.05, 0.10)).set_index("tolerance")
    assert ns.loc[0.01, "n_star"] == 8 and ns.loc[0.05, "n_star"] == 2 and ns.loc[0.05, "n_star_stable"] == 8
    assert ns.loc[0.10, "n_star"] == 2 and ns.loc[0.10, "n_star_stable"] == 2
    assert np.isnan(n_star(table, (-0.5,)).loc[0, "n_star"])  # no N of the grid qualifies
