"""Pruning orders and curves, single-head sensitivity (docs/method.md §6; the ablation itself:
tests/interventions/test_ablation.py)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from geolens.interventions import active_hook_count
from geolens.interventions.ablation import ablated_heads, mean_head_z
from geolens.pruning import (
    attention_entropy,
    corpus_nll,
    head_sensitivity,
    n_pruned,
    order_by_score,
    pruning_curves,
    random_order,
    regime_order,
    robust_z,
    weight_magnitude,
)


def test_weight_magnitude_matches_naive(tiny):
    model, _, _ = tiny
    cfg = model.cfg
    got = weight_magnitude(model)
    for l in range(cfg.n_layers):
        attn = model.blocks[l].attn
        W_V = getattr(attn, "_W_V", None)
        W_V = (W_V if W_V is not None else attn.W_V).detach().double()  # raw kv layout when TL2 has one
        W_O = attn.W_O.detach().double()
        group = cfg.n_heads // W_V.shape[0]
        for h in range(cfg.n_heads):
            want = math.sqrt(float((W_V[h // group] ** 2).sum())) * math.sqrt(float((W_O[h] ** 2).sum()))
            assert got[l, h].item() == pytest.approx(want, rel=1e-5)


def test_attention_entropy_matches_naive(tiny):
    model, tokens, cache = tiny
    got = attention_entropy(model, tokens, batch_size=1)
    for l in range(model.cfg.n_layers):
        p = cache[f"blocks.{l}.attn.hook_pattern"].double()
        for h in range(model.cfg.n_heads):
            vals = []
            for b in range(p.shape[0]):
                for i in range(1, p.shape[2]):
                    vals.append(-sum(float(a) * math.log(float(a)) for a in p[b, h, i] if a > 0))
            assert got[l, h].item() == pytest.approx(sum(vals) / len(vals), rel=1e-5, abs=1e-6)


def test_regime_order_with_fake_taxonomy():
    table = pd.DataFrame(
        dict(
            layer=[0, 0, 1, 1, 2, 2],
            head=[0, 1, 0, 1, 0, 1],
            regime=["Retriever", "Mixer", "Reset", "Mixer", "Reset", "Retriever"],
            share_current=[0.6, 0.1, 0.3, 0.05, 0.2, 0.5],
        )
    )
    assert regime_order(table) == [(2, 0), (1, 0), (1, 1), (0, 1), (2, 1), (0, 0)]
    with pytest.raises(ValueError, match="columns"):
        regime_order(table.drop(columns="share_current"))
    with pytest.raises(ValueError, match="not in the pruning order"):
        regime_order(table.assign(regime="Other"))


def test_orders_and_counts():
    score = torch.tensor([[3.0, 1.0], [1.0, 2.0]])
    assert order_by_score(score) == [(0, 1), (1, 0), (1, 1), (0, 0)]
    assert order_by_score(score, descending=True) == [(0, 0), (1, 1), (0, 1), (1, 0)]
    perm = random_order(3, 4, seed=1)
    assert sorted(perm) == [(l, h) for l in range(3) for h in range(4)] and perm != random_order(3, 4, seed=2)
    assert [n_pruned(r, 270) for r in (1.0, 0.9, 0.5, 0.1)] == [0, 27, 135, 243]
    assert n_pruned(0.75, 10) == 3  # 2.5 rounds half up


def test_robust_z_by_hand():
    x = np.array([1.0, 2.0, 3.0, 4.0, 100.0])
    # median 3, |x − 3| = 2,1,0,1,97 -> MAD 1 -> scale 1.4826
    assert np.allclose(robust_z(x), (x - 3.0) / 1.4826)


def test_pruning_curves_match_manual(tiny_gqa):
    model, tokens, _ = tiny_gqa
    cfg = model.cfg
    order = random_order(cfg.n_layers, cfg.n_heads, seed=0)
    df = pruning_curves(model, tokens, {"r": order}, (1.0, 0.5, 0.0), mode="zero", progress=False)
    clean = math.exp(corpus_nll(model, tokens))
    assert df.n_pruned.tolist() == [0, 4, 8]
    assert df.delta_ppl.iloc[0] == pytest.approx(0.0, abs=1e-9)
    with ablated_heads(model, order[:4], "zero"):
        want = math.exp(corpus_nll(model, tokens))
    assert df.ppl.iloc[1] == pytest.approx(want, rel=1e-6) and df.clean_ppl.iloc[0] == pytest.approx(clean)
    with pytest.raises(ValueError, match="each of the"):
        pruning_curves(model, tokens, {"bad": order[:3]}, (0.5,), mode="zero", progress=False)


def test_head_sensitivity_matches_one_head_at_a_time(tiny):
    model, tokens, _ = tiny
    cfg = model.cfg
    means = mean_head_z(model, tokens)
    before = active_hook_count(model)
    res = head_sensitivity(model, tokens, mode="mean", means=means, progress=False)
    assert active_hook_count(model) == before
    clean = math.exp(corpus_nll(model, tokens))
    for l in range(cfg.n_layers):
        for h in range(cfg.n_heads):
            with ablated_heads(model, [(l, h)], "mean", means):
                want = math.exp(corpus_nll(model, tokens)) - clean
            assert res.delta_ppl[l, h] == pytest.approx(want, rel=1e-4, abs=1e-5)
    assert set(res.table.columns) >= {"layer", "head", "delta_ppl", "robust_z", "critical"}
    tail = head_sensitivity(model, tokens, mode="zero", n_scored=5, progress=False)
    with ablated_heads(model, [(1, 2)], "zero"):
        ablated = math.exp(corpus_nll(model, tokens, n_scored=5))
    assert tail.delta_ppl[1, 2] == pytest.approx(ablated - tail.clean_ppl, rel=1e-4, abs=1e-5)


@pytest.mark.slow
def test_smollm2_regime_order_and_one_level(smollm2, smollm2_tokens):
    from geolens.pruning import pruning_orders

    tokens = smollm2_tokens[:2, :32]
    orders = pruning_orders(smollm2, tokens, seeds=(0,))
    assert set(orders) == {"regime", "weight", "entropy", "random_0"}
    assert all(len(o) == 270 and len(set(o)) == 270 for o in orders.values())
    df = pruning_curves(smollm2, tokens, {"weight": orders["weight"]}, (0.9,), mode="zero", progress=False)
    assert df.n_pruned.item() == 27 and np.isfinite(df.delta_ppl.item())
