"""geolens.faithfulness.method_scores: a method's scores of measured terms, read from each drawn
layer's block run alone on the residual entering it, equal those of the whole forward."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from geolens.adapter import get_attention_layer, names_filter
from geolens.faithfulness.method_scores import method_scores, residuals, stored_residuals
from geolens.metrics import LayerInputs, get_metric
from geolens.per_term import float64_model
from geolens.testing import TINY_KINDS, tiny_bridge, tiny_tokens


def _terms(model, layers_queries) -> pd.DataFrame:
    rows = []
    for p, (l, q) in enumerate(layers_queries):
        for h in range(model.cfg.n_heads):
            for j in range(q + 1):
                rows.append(dict(document=0, position=p, layer=l, query=q, head=h, source=j))
    return pd.DataFrame(rows)


@pytest.mark.parametrize("kind", TINY_KINDS)
def test_scores_equal_the_whole_forwards(kind):
    """Against the naive reading: the whole window's forward, every layer cached, the metric's
    [head, query, key] scores indexed at each term (float64 throughout)."""
    model = tiny_bridge(kind)
    tokens = tiny_tokens(model, length=12)[:1]
    drawn = [(model.cfg.n_layers - 1, 9), (0, 5)]
    terms = _terms(model, drawn)
    checked = [(get_metric("contribution"), "inter", "contribution"), (get_metric("raw_attention"), "inter", "raw")]
    with float64_model(model):
        (c, a), norms, resid = method_scores(model, checked, tokens, terms, seed=0)
        with torch.no_grad():
            _, cache = model.run_with_cache(tokens, names_filter=names_filter(model))
        for name, got in (("contribution", c), ("raw_attention", a), ("norm", norms)):
            want = np.empty(len(terms))
            for k, t in enumerate(terms.itertuples()):
                inputs = LayerInputs.from_layer(
                    get_attention_layer(model, cache, t.layer, dtype=torch.float64), "inter"
                )
                x = (
                    (inputs.alpha * inputs.value_norm)
                    if name == "norm"
                    else get_metric(name).layer_scores(inputs, summed=False)
                )
                want[k] = float(x[0].expand(model.cfg.n_heads, 12, 12)[t.head, t.query, t.source])
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15, err_msg=name)
        # the residuals entering each drawn layer, cut after its query
        assert {l: tuple(x.shape) for l, x in resid.items()} == {l: (q + 1, model.cfg.d_model) for l, q in drawn}
        # given those residuals (as the reference cache gives them), no forward of the prefix: the same scores
        again, norms_again, same = method_scores(model, checked, tokens, terms, seed=0, resid=resid)
        assert same is resid and all(np.array_equal(x, y) for x, y in zip(again, (c, a)))
        assert np.array_equal(norms_again, norms)


def test_residuals_stop_at_the_last_drawn_layer(monkeypatch):
    model = tiny_bridge("gqa")
    tokens = tiny_tokens(model, length=12)[:1]
    seen = {}
    real = model.run_with_cache

    def spy(*args, **kwargs):
        seen.update(kwargs, n=args[0].shape[-1])
        return real(*args, **kwargs)

    monkeypatch.setattr(model, "run_with_cache", spy)
    out = residuals(model, tokens, {0: 4, 1: 7})
    assert seen["stop_at_layer"] == 2 and seen["n"] == 7 and out[0].shape[0] == 4


def test_stored_residuals_reads_one_documents_layers():
    stored = {"3:5": np.zeros((4, 2)), "3:7": np.ones((6, 2)), "13:5": np.ones((2, 2))}
    got = stored_residuals(stored, 3)
    assert sorted(got) == [5, 7] and got[7].shape == (6, 2)
    assert stored_residuals(stored, 4) is None and stored_residuals(None, 3) is None
