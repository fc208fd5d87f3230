"""docs/method.md §6 head taxonomy against brute-force loops (argmax, counts, alignments) on tiny models."""

from __future__ import annotations

import numpy as np
import pytest
import reference
import torch

from geolens import taxonomy
from geolens.runner import run_corpus
from geolens.testing import tiny_tokens


def brute_counts(model, cache, space="value", skip_first=True):
    """[layer, head, 3] winner counts and alignment means, all by explicit loops in float64."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    counts = np.zeros((L, H, 3))
    sink_al = [[[] for _ in range(H)] for _ in range(L)]
    cur_al = [[[] for _ in range(H)] for _ in range(L)]
    for l in range(L):
        pattern, v, _ = reference.raw_tensors(model, cache, l)
        u = reference.projected_values(model, cache, l) if space == "projected" else v.permute(0, 2, 1, 3)  # [b,h,k,*]
        b, h, q, k = pattern.shape
        for bi in range(b):
            for hi in range(h):
                for i in range(1 if skip_first else 0, q):
                    best, best_j = -1.0, None
                    for j in range(i + 1):
                        s = float(pattern[bi, hi, i, j] * u[bi, hi, j].norm())
                        if s > best:
                            best, best_j = s, j
                    kind = 0 if best_j == 0 else (1 if best_j == i else 2)
                    counts[l, hi, kind] += 1
                    o = sum(pattern[bi, hi, i, j] * u[bi, hi, j] for j in range(i + 1))
                    cos = lambda a, c: float(torch.dot(a, c) / (a.norm() * c.norm()))
                    sink_al[l][hi].append(cos(o, u[bi, hi, 0]))
                    cur_al[l][hi].append(cos(o, u[bi, hi, i]))
    return (
        counts,
        np.array([[np.mean(x) for x in row] for row in sink_al]),
        np.array([[np.mean(x) for x in row] for row in cur_al]),
    )


@pytest.mark.parametrize("space", ["value", "projected"])
def test_taxonomy_matches_brute_force(tiny, space):
    model, tokens, cache = tiny
    analysis = taxonomy.TaxonomyAnalysis.for_model(model, space=space)
    analysis.update(model, cache, tokens)
    counts, sink_al, cur_al = brute_counts(model, cache, space)
    np.testing.assert_array_equal(analysis.counts.total.numpy(), counts)
    res = analysis.result()
    shares = counts / counts.sum(-1, keepdims=True)
    np.testing.assert_allclose(res.shares(), shares)
    # regime by explicit comparison, ties in the order sink, current, other
    for l in range(model.cfg.n_layers):
        for h in range(model.cfg.n_heads):
            s = list(shares[l, h])
            want = ["Mixer", "Retriever", "Reset"][s.index(max(s))]
            assert res.regimes[l, h] == want
            row = res.table[(res.table.layer == l) & (res.table["head"] == h)].iloc[0]
            assert row.regime == want
            assert row.n_queries == counts[l, h].sum()
    np.testing.assert_allclose(res.table.mean_sink_alignment.to_numpy().reshape(sink_al.shape), sink_al, atol=1e-5)
    np.testing.assert_allclose(res.table.mean_current_alignment.to_numpy().reshape(cur_al.shape), cur_al, atol=1e-5)
    assert sum(res.distribution.values()) == pytest.approx(1.0)


def test_winner_ties_go_to_smallest_index_and_future_is_ignored():
    # query 2 sees keys 0..2; keys 1 and 2 tie; key 3 (future) would win but is masked
    pattern = torch.tensor([[[[1.0, 0, 0, 0], [0.5, 0.5, 0, 0], [0.2, 0.4, 0.4, 0], [0.1, 0.1, 0.1, 0.7]]]])
    norms = torch.tensor([[[1.0, 1.0, 1.0, 100.0]]])
    w = taxonomy.winners(pattern, norms)
    assert w.tolist() == [[[0, 0, 1, 3]]]
    assert taxonomy.winner_kinds(w).tolist() == [[[0, 0, 2, 1]]]  # query 0: sink (also current)


def test_regime_rule_has_no_threshold():
    counts = torch.tensor([[[34.0, 33.0, 33.0], [10.0, 45.0, 45.0], [0.0, 1.0, 2.0]]])
    res = taxonomy.taxonomy_from_counts(counts)
    assert res.regimes.tolist() == [["Mixer", "Retriever", "Reset"]]  # tie current/other → current
    assert res.distribution == pytest.approx({"Mixer": 1 / 3, "Retriever": 1 / 3, "Reset": 1 / 3})
    with pytest.raises(ValueError, match=r"\[layer, head, 3\]"):
        taxonomy.taxonomy_from_counts(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="space"):
        taxonomy.TaxonomyAnalysis(1, 1, space="keys")


def test_head_taxonomy_streams_merges_and_round_trips(tiny_gqa):
    model, _, _ = tiny_gqa
    tokens = torch.cat([tiny_tokens(model, length=12), tiny_tokens(model, ("hello world", "zz top"), length=12)])
    full = taxonomy.head_taxonomy(model, tokens, batch_size=2)
    a = taxonomy.TaxonomyAnalysis.for_model(model)
    b = taxonomy.TaxonomyAnalysis.for_model(model)
    run_corpus(model, tokens[:2], [a], progress=False)
    run_corpus(model, tokens[2:], [b], progress=False)
    merged = a.merge(b).result()
    np.testing.assert_allclose(merged.shares(), full.shares())
    np.testing.assert_allclose(merged.table.mean_sink_alignment, full.table.mean_sink_alignment, atol=1e-10)
    c = taxonomy.TaxonomyAnalysis.for_model(model).load_state_dict(a.state_dict())
    np.testing.assert_array_equal(c.counts.total.numpy(), a.counts.total.numpy())
    assert list(full.table.columns[:7]) == [
        "layer",
        "head",
        "n_queries",
        "share_sink",
        "share_current",
        "share_other",
        "regime",
    ]
    assert full.regimes.shape == (model.cfg.n_layers, model.cfg.n_heads)


def test_compare_taxonomies_agreement():
    a = taxonomy.taxonomy_from_counts(torch.tensor([[[5.0, 1, 1], [1, 5, 1]], [[1, 1, 5], [5, 1, 1]]]))
    b = taxonomy.taxonomy_from_counts(torch.tensor([[[5.0, 1, 1], [1, 1, 5]], [[1, 1, 5], [5, 1, 1]]]))
    cmp = taxonomy.compare_taxonomies(a, b, ("x", "y"))
    assert cmp["agreement"] == 0.75 and cmp["n_heads"] == 4
    assert cmp["distribution"].loc["Retriever", "x"] == 0.25 and cmp["distribution"].loc["Retriever", "y"] == 0.0
    assert cmp["confusion"].loc["Retriever", "Reset"] == 1
    with pytest.raises(ValueError, match="different heads"):
        taxonomy.compare_taxonomies(a, taxonomy.taxonomy_from_counts(torch.ones(1, 2, 3)))


@pytest.mark.slow
def test_smollm2_taxonomy_is_consistent(smollm2, smollm2_tokens):
    res = taxonomy.head_taxonomy(smollm2, smollm2_tokens, batch_size=4)
    assert res.regimes.shape == (30, 9)
    assert (res.table.n_queries == 4 * 63).all()
    np.testing.assert_allclose(res.shares().sum(-1), 1.0)
    assert set(res.regimes.ravel()) <= set(taxonomy.REGIMES)
