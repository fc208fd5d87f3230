"""docs/method.md §5–6 corpus parts: the authors' averaging protocol, random baseline, bootstrap, regime fit,
keep-top-N hooks and N*, each against explicit loops."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import reference
import torch

import geolens
from geolens.interventions.base import active_hook_count, applied
from geolens.interventions.keep_top_n import keep_top_n_hooks, keep_top_n_mask
from geolens.runner import run_corpus
from geolens.selection import head_selection_scores, selection_scores, top_n_mask
from geolens.selection.analysis import Condition, SelectionAnalysis, _CorrSums
from geolens.selection.baseline import document_means_ci, paired_comparison, random_rankings
from geolens.selection.effective_set import effective_set_size, n_star, token_nll_sum
from geolens.selection.regime import RegimeAnalysis, fit_exponential_decay, window_regime
from geolens.testing import tiny_tokens

CONDS = [Condition("value", "euclidean", "attention", "keep"), Condition("value", "cosine", "norm", "exclude")]


def corpus(model):
    return torch.cat(
        [tiny_tokens(model, length=12), tiny_tokens(model, ("hello there my friend", "zz top 123"), length=12)]
    )


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


def test_random_rankings_are_seeded_and_nested_across_n():
    vis = torch.arange(10)[None, :] <= torch.tensor([4, 9])[:, None]
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    r1, r2 = random_rankings(vis, 16, generator=g1), random_rankings(vis, 16, generator=g2)
    assert torch.equal(r1, r2) and r1.shape == (16, 2, 10)
    for n in range(1, 5):
        small, big = top_n_mask(r1, vis, n), top_n_mask(r1, vis, n + 1)
        assert bool((small <= big).all()) and bool((small <= vis).all())
    assert bool(torch.isinf(r1[:, 0, 5:]).all())


def test_document_means_ci_against_explicit_loop():
    x = np.random.default_rng(0).normal(size=(30, 2))
    mean, lo, hi = document_means_ci(x, n_boot=500, seed=3)
    rng = np.random.default_rng(3)
    idx = rng.integers(0, 30, size=(500, 30))
    boots = np.array([[x[idx[b], k].mean() for k in range(2)] for b in range(500)])
    np.testing.assert_allclose(mean, x.mean(0))
    np.testing.assert_allclose(lo, np.percentile(boots, 2.5, axis=0))
    np.testing.assert_allclose(hi, np.percentile(boots, 97.5, axis=0))
    m, l, h = document_means_ci(np.full(10, 0.3))
    assert m[0] == pytest.approx(0.3) and l[0] == pytest.approx(0.3) and h[0] == pytest.approx(0.3)
    t = paired_comparison(x[:, :1] + 1, x[:, :1], np.ones((30, 1)), [4], n_boot=200)
    assert (
        t.loc[0, "diff"] == pytest.approx(1.0)
        and t.loc[0, "diff_lo"] == pytest.approx(1.0)
        and t.loc[0, "win_share"] == 1
    )
    with pytest.raises(ValueError, match="per-document"):
        paired_comparison(x, x[:, :1], x, [1, 2])


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


@pytest.mark.parametrize("space", ["value", "projected"])
def test_window_regime_matches_loops(tiny, space):
    model, _, cache = tiny
    layer = geolens.get_attention_layer(model, cache, 1, dtype=torch.float64)
    got = window_regime(layer, space)
    _, v, _ = reference.raw_tensors(model, cache, 1)
    u = reference.projected_values(model, cache, 1) if space == "projected" else v.permute(0, 2, 1, 3)
    b, h, K, _ = u.shape
    cos = lambda a, c: float(torch.dot(a, c) / (a.norm() * c.norm()))
    for bi in range(b):
        for hi in range(h):
            norms = [float(u[bi, hi, j].norm()) for j in range(1, K)]
            mean = sum(norms) / len(norms)
            spread = (sum((n - mean) ** 2 for n in norms) / len(norms)) ** 0.5 / mean
            unit_mean = sum(u[bi, hi, j] / u[bi, hi, j].norm() for j in range(1, K)) / (K - 1)
            assert float(got["norm_spread"][bi, hi]) == pytest.approx(spread, rel=1e-8)
            assert float(got["coherence"][bi, hi]) == pytest.approx(float(unit_mean.norm()), rel=1e-8)
            assert float(got["sink_norm_ratio"][bi, hi]) == pytest.approx(float(u[bi, hi, 0].norm()) / mean, rel=1e-8)
            assert float(got["sink_alignment"][bi, hi]) == pytest.approx(
                sum(cos(u[bi, hi, 0], u[bi, hi, j]) for j in range(1, K)) / (K - 1), abs=1e-8
            )
            for lag in (1, 3, K - 2):
                pairs = [cos(u[bi, hi, i], u[bi, hi, i - lag]) for i in range(1 + lag, K)]
                assert float(got["lag_sim"][bi, hi, lag - 1]) == pytest.approx(sum(pairs) / len(pairs), abs=1e-8)


def test_exponential_decay_fit_recovers_parameters():
    delta = np.arange(1, 41)
    lam = np.geomspace(0.25, 160, 120)[60]
    sim = np.stack([0.1 + 0.6 * np.exp(-delta / lam), 0.3 * np.ones(40) + 0.0 * delta])
    fit = fit_exponential_decay(sim)
    assert (
        fit["length"][0] == pytest.approx(lam)
        and fit["amplitude"][0] == pytest.approx(0.6)
        and fit["offset"][0] == pytest.approx(0.1)
    )
    assert fit["rmse"][0] < 1e-10 and fit["r2"][0] == pytest.approx(1.0)
    assert np.isnan(fit["r2"][1]) and fit["rmse"][1] < 1e-10  # a flat curve has no variance to explain


def test_regime_analysis_streams_and_merges(tiny_gqa):
    model, _, _ = tiny_gqa
    tokens = corpus(model)
    full = RegimeAnalysis.for_model(model, 12)
    a, b = RegimeAnalysis.for_model(model, 12), RegimeAnalysis.for_model(model, 12)
    run_corpus(model, tokens, [full], batch_size=4, progress=False)
    run_corpus(model, tokens[:1], [a], progress=False)
    run_corpus(model, tokens[1:], [b], progress=False)
    a.merge(b)
    ra, rf = a.result(), full.result()
    pd.testing.assert_frame_equal(ra["heads"], rf["heads"], atol=1e-10)
    assert rf["n_windows"] == 4 and rf["lag_sim"].shape == (2, 4, 10) and rf["profile"].shape == (2, 4, 12)
    np.testing.assert_allclose(rf["profile"].sum(-1), 1.0, atol=1e-5)  # the final query's attention sums to 1
    c = RegimeAnalysis.for_model(model, 12).load_state_dict(a.state_dict())
    pd.testing.assert_frame_equal(c.result()["heads"], ra["heads"])
    with pytest.raises(ValueError, match="windows of 12"):
        RegimeAnalysis.for_model(model, 12).update(model, None, torch.zeros(1, 5, dtype=torch.long))


def test_keep_top_n_mask_brute_force():
    g = torch.Generator().manual_seed(0)
    score = torch.rand(2, 3, 6, 6, generator=g)
    score[0, 0, 5, 1] = score[0, 0, 5, 2]  # a tie
    for n in (1, 2, 4):
        m = keep_top_n_mask(score, n)
        for b in range(2):
            for h in range(3):
                for i in range(6):
                    cand = sorted(range(i + 1), key=lambda j: (-float(score[b, h, i, j]), j))[:n]
                    assert [j for j in range(6) if m[b, h, i, j]] == sorted(cand)


@pytest.mark.parametrize("by", ["attention", "norm"])
def test_keep_top_n_hooks_edit_the_head_sum(tiny, by):
    model, tokens, _ = tiny
    with torch.no_grad():
        base, cache = model.run_with_cache(tokens)
    n = 2
    hooks_before = active_hook_count(model)
    names = lambda name: name.endswith("hook_z") or name.endswith("hook_pattern") or name.endswith("hook_v")
    with torch.no_grad(), applied(model, keep_top_n_hooks(model, n, by=by, layers=[0])):
        _, hooked = model.run_with_cache(tokens, names_filter=names)
    assert active_hook_count(model) == hooks_before
    pattern, v, _ = reference.raw_tensors(model, cache, 0)  # layer 0 inputs are unchanged by the edit
    b, h, q, k = pattern.shape
    z = hooked["blocks.0.attn.hook_z"].double()  # [b, q, h, d]
    for bi in range(b):
        for hi in range(h):
            for i in range(q):
                score = [
                    float(pattern[bi, hi, i, j] * (v[bi, j, hi].norm() if by == "norm" else 1)) for j in range(i + 1)
                ]
                keep = sorted(range(i + 1), key=lambda j: (-score[j], j))[:n]
                want = sum(pattern[bi, hi, i, j] * v[bi, j, hi] for j in keep)
                torch.testing.assert_close(z[bi, i, hi], want, atol=1e-5, rtol=1e-4)
    with torch.no_grad(), applied(model, keep_top_n_hooks(model, tokens.shape[1], by=by)):
        same = model(tokens)
    torch.testing.assert_close(same, base)  # N ≥ visible count changes nothing
    with pytest.raises(ValueError, match="by must"):
        keep_top_n_hooks(model, 2, by="random")


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
