"""geolens.faithfulness.method_scores: a method's scores of measured terms, read from each drawn
layer's block run alone on the residual entering it, equal those of the whole forward."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import HAS_BRIDGE, make_tiny

from geolens.adapter import get_attention_layer, names_filter
from geolens.faithfulness.method_scores import flat_caches, layer_caches, method_scores, stored_caches
from geolens.metrics import LayerInputs, get_metric
from geolens.per_term import float64_model
from geolens.testing import tiny_tokens

KINDS = ("gqa", "mha", "gemma") if HAS_BRIDGE else ("gqa", "mha")  # TransformerLens 2.x: HookedTransformer


def _terms(model, layers_queries) -> pd.DataFrame:
    rows = []
    for p, (l, q) in enumerate(layers_queries):
        for h in range(model.cfg.n_heads):
            for j in range(q + 1):
                rows.append(dict(document=0, position=p, layer=l, query=q, head=h, source=j))
    return pd.DataFrame(rows)


@pytest.mark.parametrize("kind", KINDS)
def test_scores_equal_the_whole_forwards(kind):
    """Against the naive reading: the whole window's forward, every layer cached, the metric's
    [head, query, key] scores indexed at each term (float64 throughout)."""
    model = make_tiny(kind)
    tokens = tiny_tokens(model, length=12)[:1]
    drawn = [(model.cfg.n_layers - 1, 9), (0, 5)]
    terms = _terms(model, drawn)
    checked = [(get_metric("contribution"), "inter", "contribution"), (get_metric("raw_attention"), "inter", "raw")]
    with float64_model(model):
        (c, a), norms, caches = method_scores(model, checked, tokens, terms, seed=0)
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
        # each drawn layer's pattern, values and z, cut after its query
        for l, q in drawn:
            pattern = next(x for k, x in caches[l].items() if k.endswith("hook_pattern"))
            assert pattern.shape[-2:] == (q + 1, q + 1) and all(
                x.shape[1] == q + 1 for k, x in caches[l].items() if k.endswith(("hook_v", "hook_z"))
            )
        # given those tensors back from their arrays (as the reference cache gives them): no forward, the same scores
        stored = stored_caches(flat_caches(0, caches), 0)
        model.run_with_cache = None  # any forward would fail
        again, norms_again, same = method_scores(model, checked, tokens, terms, seed=0, caches=stored)
        del model.run_with_cache
        assert same is stored and all(np.array_equal(x, y) for x, y in zip(again, (c, a)))
        assert np.array_equal(norms_again, norms)


def test_one_forward_stops_at_the_last_drawn_layer(monkeypatch):
    model = make_tiny("gqa")
    tokens = tiny_tokens(model, length=12)[:1]
    seen = {}
    real = model.run_with_cache

    def spy(*args, **kwargs):
        seen.update(kwargs, n=args[0].shape[-1])
        return real(*args, **kwargs)

    monkeypatch.setattr(model, "run_with_cache", spy)
    out = layer_caches(model, tokens, {0: 4, 1: 7})
    assert seen["stop_at_layer"] == 2 and seen["n"] == 7
    assert sorted(out) == [0, 1] and all(k.startswith("blocks.0.") for k in out[0])


def test_stored_caches_reads_one_documents_layers():
    stored = {"3:5:blocks.5.attn.hook_v": np.zeros((1, 4, 2)), "3:7:blocks.7.attn.hook_v": np.ones((1, 6, 2))}
    stored["13:5:blocks.5.attn.hook_v"] = np.ones((1, 2, 2))
    got = stored_caches(stored, 3)
    assert sorted(got) == [5, 7] and got[7]["blocks.7.attn.hook_v"].shape == (1, 6, 2)
    assert stored_caches(stored, 4) is None and stored_caches(None, 3) is None
