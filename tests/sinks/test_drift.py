"""Semantic drift experiment (docs/method.md §4): per-head statistics against loops over the edited pass."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import reference
import torch
from conftest import make_tiny

from geolens.interventions import active_hook_count, applied
from geolens.interventions.sink_values import PartialKVGroupError, scale_sink_value_hooks
from geolens.sinks import low_norm_heads, semantic_drift
from geolens.sinks.drift import next_token_nll
from geolens.testing import tiny_tokens

TEXTS = ("the cat sat on the mat.", "a dog ran far away!!", "it is 42, or 7? no.")


@pytest.fixture(scope="module", params=["gqa", "mha"])
def model_tokens(request):
    model = make_tiny(request.param)
    return model, tiny_tokens(model, TEXTS, length=10)


def _naive_head_stats(model, tokens, lam, layers):
    """mean ‖o_i^h‖, mean cos(o_i^h, mean_{1≤j≤i} ṽ_j), mean ‖ṽ_j‖ (j ≥ 1) from the edited pass."""
    out = {}
    hooks = scale_sink_value_hooks(model, lam, layers=layers)
    for start in range(0, tokens.shape[0], 2):  # the same batches as the analysis
        with torch.no_grad(), applied(model, hooks):
            _, cache = model.run_with_cache(tokens[start : start + 2])
        for l in layers:
            pattern, _, _ = reference.raw_tensors(model, cache, l)
            vt = reference.projected_values(model, cache, l)
            b, h, q, _ = pattern.shape
            for hh in range(h):
                acc = out.setdefault((l, hh), ([], [], []))
                for bi in range(b):
                    for i in range(1, q):
                        o = sum(pattern[bi, hh, i, j] * vt[bi, hh, j] for j in range(i + 1))
                        s = sum(vt[bi, hh, j] for j in range(1, i + 1)) / i
                        acc[0].append(float(o.norm()))
                        acc[1].append(float(torch.dot(o, s) / (o.norm() * s.norm())))
                    acc[2].extend(float(vt[bi, hh, j].norm()) for j in range(1, q))
    return {k: tuple(np.mean(x) for x in v) for k, v in out.items()}


def test_drift_head_statistics_match_naive_loops(model_tokens):
    model, tokens = model_tokens
    res = semantic_drift(model, tokens, lambdas=[0.0, 0.5], batch_size=2)
    assert res.lambdas == (0.0, 0.5, 1.0)
    for lam in res.lambdas:
        naive = _naive_head_stats(model, tokens, lam, range(model.cfg.n_layers))
        df = res.heads[res.heads["lambda"] == lam]
        for (l, h), (norm, cos, vnorm) in naive.items():
            row = df[(df.layer == l) & (df["head"] == h)].iloc[0]
            assert row.out_norm == pytest.approx(norm, rel=1e-6)
            assert row.cos_cone == pytest.approx(cos, rel=1e-6, abs=1e-9)
            assert row.value_norm == pytest.approx(vnorm, rel=1e-6)
            assert row.relative_out_norm == pytest.approx(norm / vnorm, rel=1e-6)


def test_drift_perplexity_is_the_model_loss_and_delta_zero_at_one(model_tokens):
    model, tokens = model_tokens
    before = active_hook_count(model)
    res = semantic_drift(model, tokens, lambdas=[0.0, 2.0], batch_size=3)
    s = res.summary.set_index("lambda")
    with torch.no_grad():
        loss = float(model(tokens, return_type="loss"))
        with applied(model, scale_sink_value_hooks(model, 0.0)):
            loss0 = float(model(tokens, return_type="loss"))
    assert s.loc[1.0, "nll"] == pytest.approx(loss, rel=1e-5)
    assert s.loc[0.0, "nll"] == pytest.approx(loss0, rel=1e-5)
    assert s.loc[1.0, "delta_ppl"] == 0.0
    assert s.loc[0.0, "delta_ppl"] == pytest.approx(
        np.exp(loss0) - np.exp(loss), abs=1e-5 * np.exp(loss)
    )  # float32 losses
    assert active_hook_count(model) == before


def test_next_token_nll_by_hand():
    logits = torch.randn(2, 4, 5)
    tokens = torch.randint(0, 5, (2, 4))
    nll = next_token_nll(logits, tokens)
    for b in range(2):
        for i in range(3):
            p = torch.softmax(logits[b, i].double(), -1)[tokens[b, i + 1]]
            assert float(nll[b, i]) == pytest.approx(-float(torch.log(p)), rel=1e-10)


def test_sink_removal_puts_the_output_in_the_cone_for_uniform_attention():
    """If the tail attention is uniform over 1..i, o_i(λ=0) = (1 − α_i0) s_i: cos = 1 exactly."""
    model = make_tiny("gqa")
    tokens = tiny_tokens(model, TEXTS, length=10)
    # uniform causal attention: zero the attention scores (the pattern is then 1/(i+1) everywhere)
    zero_scores = [
        (
            f"blocks.{l}.attn.hook_attn_scores",
            lambda x, hook: torch.where(torch.isfinite(x) & (x > -1e4), torch.zeros_like(x), x),
        )
        for l in range(2)
    ]
    if not all(name in model.hook_dict for name, _ in zero_scores):
        pytest.skip("no hook_attn_scores on this model")
    with applied(model, zero_scores):
        res = semantic_drift(model, tokens, lambdas=[0.0])
    at0 = res.heads[res.heads["lambda"] == 0.0]
    np.testing.assert_allclose(at0.cos_cone, 1.0, atol=1e-6)
    assert (res.heads[res.heads["lambda"] == 1.0].cos_cone < 1 - 1e-4).all()


def test_drift_on_chosen_kv_heads_reports_only_their_query_heads():
    model = make_tiny("gqa")
    tokens = tiny_tokens(model, TEXTS, length=10)
    res = semantic_drift(model, tokens, lambdas=[0.0], layers=[1], kv_heads=[0])
    assert res.edited == {"layers": [1], "kv_heads": [0], "query_heads": [0, 1]}
    assert set(res.heads.layer) == {1} and set(res.heads["head"]) == {0, 1}
    with pytest.raises(PartialKVGroupError):
        semantic_drift(model, tokens, lambdas=[0.0], heads=[1])


def test_low_norm_rule():
    df = pd.DataFrame({"relative_out_norm": [0.1, 0.5, 0.2, 0.9, 0.7, 0.3, 0.8, 0.4]})
    low = low_norm_heads(df, 0.25)
    assert low.tolist() == [True, False, True, False, False, False, False, False]
    with pytest.raises(ValueError, match="quantile"):
        low_norm_heads(df, 1.5)


def test_drift_low_norm_flags_are_the_same_rows_for_every_lambda(model_tokens):
    model, tokens = model_tokens
    res = semantic_drift(model, tokens, lambdas=[0.0], low_norm_quantile=0.5)
    a = res.heads[res.heads["lambda"] == 0.0].reset_index(drop=True)
    b = res.heads[res.heads["lambda"] == 1.0].reset_index(drop=True)
    assert a.low_norm.tolist() == b.low_norm.tolist()
    assert b.low_norm.tolist() == low_norm_heads(b, 0.5).tolist()
    assert b.low_norm.sum() == len(b) // 2
