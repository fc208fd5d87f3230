"""The authors' averaging protocol of the selection analysis (geolens.selection.analysis,
docs/method.md §5–6): per-condition scores against explicit loops, merge and state round trip, and
the pooled correlation sums against numpy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import geolens
from geolens.runner import run_corpus
from geolens.selection import head_selection_scores, selection_scores
from geolens.selection.analysis import Condition, SelectionAnalysis, _CorrSums
from selection.conftest import corpus

CONDS = [Condition("value", "euclidean", "attention", "keep"), Condition("value", "cosine", "norm", "exclude")]


def test_selection_analysis_follows_the_averaging_protocol(tiny_gqa):
    model, _, _ = tiny_gqa
    tokens = corpus(model)
    sizes = [1, 2, 4, 8]
    a = SelectionAnalysis(
        model.cfg.n_layers, model.cfg.n_heads, sizes, conditions=CONDS, n_random=5, random_bounds=True
    )
    run_corpus(model, tokens, [a], batch_size=3, progress=False)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=geolens.names_filter(model))
    L, H = model.cfg.n_layers, model.cfg.n_heads
    for c in CONDS:
        top = np.zeros((tokens.shape[0], len(sizes)))
        rnd = np.zeros_like(top)
        win = np.zeros_like(top)
        for l in range(L):
            layer = geolens.get_attention_layer(model, cache, l, dtype=torch.float64)
            sep = head_selection_scores(layer, sizes, space=c.space, distance=c.distance, by=c.by, sink=c.sink)
            y = layer.pattern[:, :, -1:, :, None] * layer.v.permute(0, 2, 1, 3)[:, :, None]
            vis = torch.ones(1, layer.pattern.shape[-1], dtype=torch.bool)
            draws = a.draw_rankings(tokens, l, vis.expand(layer.pattern[:, :, -1:].shape))
            for d in range(tokens.shape[0]):
                for h in range(H):
                    per_draw = [
                        selection_scores(y[d, h], draws[r, d, h], vis, sizes, distance=c.distance, sink=c.sink).f[0]
                        for r in range(5)
                    ]
                    r_mean = torch.stack(per_draw).mean(0)  # repeats within the head first
                    top[d] += sep.f[d, h, 0].numpy() / (L * H)  # then heads and layers
                    rnd[d] += r_mean.numpy() / (L * H)
                    win[d] += (sep.f[d, h, 0] > r_mean).double().numpy() / (L * H)
        np.testing.assert_allclose(a.per_document(f"{c.name}|top|f"), top, atol=1e-10)
        np.testing.assert_allclose(a.per_document(f"{c.name}|random|f"), rnd, atol=1e-10)
        np.testing.assert_allclose(a.per_document(f"{c.name}|win"), win, atol=1e-10)
    res = a.result(n_boot=100)
    assert (res["violations"][["precision_bound", "recall_bound", "equivalence"]] == 0).all().all()
    assert (res["violations"].n_cases > 0).all()
    assert res["n_documents"] == tokens.shape[0]
    cmp = res["comparison"]
    first = cmp[(cmp.condition == CONDS[0].name) & (cmp.N == 1)].iloc[0]
    assert first.top == 1 and first.random == 1 and first.tie_share == 1  # Euclidean F_1 caveat
    assert set(res["heads"].columns) >= {"layer", "head", "N", "recall", "f", "sink_alignment"}


def test_selection_analysis_merges_and_round_trips(tiny_gqa):
    model, _, _ = tiny_gqa
    tokens = corpus(model)
    mk = lambda: SelectionAnalysis(model.cfg.n_layers, model.cfg.n_heads, [1, 2, 4], conditions=CONDS, n_random=3)
    full, a, b = mk(), mk(), mk()
    run_corpus(model, tokens, [full], batch_size=4, progress=False)
    run_corpus(model, tokens[:2], [a], progress=False)
    run_corpus(model, tokens[2:], [b], progress=False)
    a.merge(b)
    for key in full.doc:
        np.testing.assert_allclose(a.per_document(key), full.per_document(key), atol=1e-12)  # shard-independent draws
    torch.testing.assert_close(a.head_recall.mean, full.head_recall.mean)
    c = mk().load_state_dict(a.state_dict())
    np.testing.assert_allclose(c.per_document(f"{CONDS[0].name}|top|f"), a.per_document(f"{CONDS[0].name}|top|f"))
    torch.testing.assert_close(c.corr_alignment.s, a.corr_alignment.s)
    with pytest.raises(ValueError, match="merge"):
        a.merge(SelectionAnalysis(model.cfg.n_layers, model.cfg.n_heads, [1, 2], conditions=CONDS))


def test_pooled_correlation_sums_match_numpy():
    g = np.random.default_rng(1)
    x, y = g.normal(size=(50, 3)), g.normal(size=(50, 3))
    y[:, 1] += 2 * x[:, 1]
    acc = _CorrSums((3,)).update(torch.tensor(x[:20]), torch.tensor(y[:20]))
    acc.merge(_CorrSums((3,)).update(torch.tensor(x[20:]), torch.tensor(y[20:])))
    want = [np.corrcoef(x[:, k], y[:, k])[0, 1] for k in range(3)]
    np.testing.assert_allclose(acc.pearson().numpy(), want, atol=1e-10)
    const = _CorrSums(()).update(torch.ones(5), torch.arange(5.0))
    assert torch.isnan(const.pearson())
