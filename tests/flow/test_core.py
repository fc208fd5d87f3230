"""Contribution flow across layers (geolens.flow, docs/method.md §10, issue #24).

Every method is checked against a naive float64 composition that materialises ṽ_j^h = v_j^h W_O^h,
builds the terms t_ij and the mixing matrices with explicit loops from the definitions and
composes them with matrix products; plus the identities (Σ_j t_ij = the model's own
``hook_resid_mid``, rows summing to 1, causality), streamed = unstreamed and padded = alone.
"""

from __future__ import annotations

import pytest
import reference
import torch
from conftest import make_tiny
from reference import naive_value_zeroing, pad_prompts, padding_prompts, real_span

import geolens
from geolens.flow.core import (
    FLOW_METHODS,
    _post_norm_scale,
    contribution_flow,
    flow_names_filter,
    layer_mixing,
    residual_decomposition,
)

# ---------------------------------------------------------------------------------------------
# naive float64 reference


def _b_O(model, layer):
    try:
        b = model.blocks[layer].attn.b_O
    except (AttributeError, TypeError):
        b = None
    return torch.zeros(model.cfg.d_model, dtype=torch.float64) if b is None else b.detach().double()


def naive_terms(model, cache, layer):
    """t [b, q, k, d_model], with loops: t_ij = D_i (Σ_h α_ij^h ṽ_j^h) + [i = j](x_i + D_i b_O), where D_i
    is the post-attention norm at i as a diagonal map (the ratio of its output to its input,
    coordinate by coordinate; the identity without such a norm)."""
    pattern, _, _ = reference.raw_tensors(model, cache, layer)
    vt = reference.projected_values(model, cache, layer)  # [b, h, k, d_model]
    b_O = _b_O(model, layer)
    x = cache[f"blocks.{layer}.hook_resid_pre"].double()
    update = cache[f"blocks.{layer}.hook_attn_out"].double()
    try:
        pre = cache[f"blocks.{layer}.attn.hook_out"].double()  # before the post-attention norm (bridge)
    except KeyError:
        pre = update
    D = torch.where(pre != 0, update / torch.where(pre != 0, pre, torch.ones_like(pre)), torch.ones_like(pre))
    b, h, q, k = pattern.shape
    t = torch.zeros(b, q, k, x.shape[-1], dtype=torch.float64)
    for bi in range(b):
        for i in range(q):
            for j in range(k):
                s = torch.zeros(x.shape[-1], dtype=torch.float64)
                for hi in range(h):
                    s += pattern[bi, hi, i, j] * vt[bi, hi, j]
                t[bi, i, j] = D[bi, i] * s
            t[bi, i, i] += x[bi, i] + D[bi, i] * b_O
    return t


def _normalised(M):
    M = M.clone()
    for bi in range(M.shape[0]):
        for i in range(M.shape[1]):
            total = M[bi, i].sum()
            if total > 0:
                M[bi, i] /= total
            else:
                M[bi, i] = 0
                M[bi, i, i] = 1
    return M


def naive_mixing(model, cache, tokens, layer, method):
    if method == "attention_rollout":
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"].double()
        return _normalised(0.5 * pattern.mean(1) + 0.5 * torch.eye(pattern.shape[-1], dtype=torch.float64))
    if method == "value_zeroing_rollout":
        return _normalised(naive_value_zeroing(model, tokens, layer))
    t = naive_terms(model, cache, layer)
    xt = t.sum(2)
    b, q, k, _ = t.shape
    M = torch.zeros(b, q, k, dtype=torch.float64)
    for bi in range(b):
        for i in range(q):
            for j in range(k):
                if method == "contribution":
                    M[bi, i, j] = max(0.0, float(torch.dot(xt[bi, i], t[bi, i, j]) / torch.dot(xt[bi, i], xt[bi, i])))
                else:  # alti
                    M[bi, i, j] = max(0.0, float(xt[bi, i].abs().sum() - (t[bi, i, j] - xt[bi, i]).abs().sum()))
    return _normalised(M)


def naive_flows(model, cache, tokens, method):
    """R^(l) for every layer l, composed with matrix products from R^(0) = I."""
    R = torch.eye(tokens.shape[1], dtype=torch.float64).expand(tokens.shape[0], -1, -1)
    flows = []
    for layer in range(model.cfg.n_layers):
        R = naive_mixing(model, cache, tokens, layer, method) @ R
        flows.append(R)
    return flows


# ---------------------------------------------------------------------------------------------
# the residual decomposition


def test_terms_rebuild_the_models_residual_after_attention(tiny):
    """Σ_j t_ij = x̃_i, the model's own hook_resid_mid, for geolens' terms and the naive ones."""
    model, _, cache = tiny
    for layer in range(model.cfg.n_layers):
        mid = cache[f"blocks.{layer}.hook_resid_mid"].double()
        t = residual_decomposition(model, cache, layer, dtype=torch.float64)
        torch.testing.assert_close(t.sum(2), mid, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(naive_terms(model, cache, layer).sum(2), mid, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(t, naive_terms(model, cache, layer), atol=1e-5, rtol=1e-4)


class _RMSNorm(torch.nn.Module):
    """RMSNorm with Gemma's (1 + w) weight convention, float64."""

    def __init__(self, w: torch.Tensor, eps: float = 1e-6):
        super().__init__()
        self.w, self.eps = torch.nn.Parameter(w), eps

    def forward(self, x):
        return x * (1 + self.w) / (x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt()


def test_post_norm_scale_is_exact_for_rmsnorm_and_refuses_layernorm():
    g = torch.Generator().manual_seed(0)
    pre = torch.randn(2, 7, 16, generator=g, dtype=torch.float64)
    pre[0, 3, 5] = 0.0  # an exact zero: no ratio there, the scale still comes out
    pre[:, :6, 2] *= 1e-9  # a coordinate that nearly vanishes in most rows: its ratio is noise there
    norm = _RMSNorm(torch.randn(16, generator=g, dtype=torch.float64))
    with torch.no_grad():
        post = norm(pre)
        expected = (1 + norm.w) / (pre.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt()
    real = torch.ones(2, 7, dtype=torch.bool)
    scale = _post_norm_scale(pre, post, real, 0, 1e-12, norm)
    torch.testing.assert_close(scale, expected, rtol=1e-12, atol=0)
    with pytest.raises(NotImplementedError, match="not an elementwise rescaling"):
        _post_norm_scale(pre, torch.nn.functional.layer_norm(pre, (16,)) * (1 + norm.w.detach()), real, 0, 1e-3, norm)


# ---------------------------------------------------------------------------------------------
# each method against the naive composition


@pytest.mark.parametrize("method", FLOW_METHODS)
def test_flow_matches_naive_composition(tiny, method):
    model, tokens, cache = tiny
    last = model.cfg.n_layers - 1
    # value_zeroing computes 1 − cos in float32 (absolute error ~2e-7, tests/faithfulness/test_value_zeroing.py),
    # and in the tiny GPT-2 a row of scores sums to ~1e-4: ~1e-3 once the rows are normalised
    atol = 2e-3 if method == "value_zeroing_rollout" else 1e-6
    flows = naive_flows(model, cache, tokens, method)
    for target in (0, last):
        got = contribution_flow(model, cache, method, target_layer=target, tokens=tokens, dtype=torch.float64)
        want = flows[target]
        torch.testing.assert_close(got, want, atol=atol, rtol=1e-5, msg=f"{method}, layer {target}")
    # float32 by default, same numbers
    got32 = contribution_flow(model, cache, method, tokens=tokens)
    assert got32.dtype == torch.float32
    torch.testing.assert_close(got32.double(), want, atol=max(atol, 1e-4), rtol=1e-3)


@pytest.mark.parametrize("method", FLOW_METHODS)
def test_rows_sum_to_one_and_flow_is_causal(tiny, method):
    model, tokens, cache = tiny
    R = contribution_flow(model, cache, method, tokens=tokens)
    torch.testing.assert_close(R.sum(-1), torch.ones(R.shape[:2]))
    assert bool((R >= 0).all())
    assert bool((R.triu(1) == 0).all()), "weight on later tokens"
    M = layer_mixing(model, cache, 0, method, tokens=tokens)
    assert bool((M.triu(1) == 0).all())
    torch.testing.assert_close(M.sum(-1), torch.ones(M.shape[:2]))


@pytest.mark.parametrize("method", FLOW_METHODS)
def test_streamed_equals_unstreamed(tiny, method):
    """Query-chunked, in-place composition = the full mixing matrices multiplied out."""
    model, tokens, cache = tiny
    mixings = [layer_mixing(model, cache, l, method, tokens=tokens) for l in range(model.cfg.n_layers)]
    unstreamed = torch.eye(tokens.shape[1]).expand(tokens.shape[0], -1, -1)
    for M in mixings:
        unstreamed = M @ unstreamed
    variants = ({}, {"query_chunk_size": 1}, {"query_chunk_size": 5}, {"memory_budget_bytes": 20_000})
    if method == "value_zeroing_rollout":  # reruns the model per call; its rows are sliced from one matrix
        variants = variants[2:3]
    for kwargs in variants:
        got = contribution_flow(model, cache, method, tokens=tokens, **kwargs)
        torch.testing.assert_close(got, unstreamed, atol=1e-6, rtol=1e-5, msg=str(kwargs))
        chunked_layer = layer_mixing(model, cache, 0, method, tokens=tokens, **kwargs)
        torch.testing.assert_close(chunked_layer, mixings[0], atol=1e-6, rtol=1e-5, msg=str(kwargs))
    torch.testing.assert_close(contribution_flow(model, cache, method, tokens=tokens, target_layer=0), mixings[0])


def test_flow_names_filter_is_enough(tiny_gqa):
    model, tokens, full = tiny_gqa
    _, cache = model.run_with_cache(tokens, names_filter=flow_names_filter(model))
    _, everything = model.run_with_cache(tokens)
    torch.testing.assert_close(contribution_flow(model, cache, "alti"), contribution_flow(model, everything, "alti"))
    assert geolens.contribution_flow is contribution_flow


# ---------------------------------------------------------------------------------------------
# padded batches


@pytest.fixture(scope="module", params=["gqa", "mha", "gemma"])
def model(request):
    from conftest import TINY_KINDS

    if request.param not in TINY_KINDS:
        pytest.skip(f"no tiny {request.param} model in this TransformerLens")
    return make_tiny(request.param)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("method", FLOW_METHODS)
def test_padded_batch_equals_each_prompt_alone(model, side, method):
    if method == "value_zeroing_rollout" and side == "right":
        pytest.skip("Value Zeroing runs each padded row on its real tokens alone: one side is enough (and costly)")
    prompts = padding_prompts()
    tokens, mask = pad_prompts(prompts, side)
    _, cache = model.run_with_cache(tokens, attention_mask=mask, names_filter=flow_names_filter(model))
    R = contribution_flow(model, cache, method, attention_mask=mask, tokens=tokens, query_chunk_size=4)
    for row, prompt in enumerate(prompts):
        _, alone_cache = model.run_with_cache(prompt[None], names_filter=flow_names_filter(model))
        alone = contribution_flow(model, alone_cache, method, tokens=prompt[None])
        real = real_span(mask[row])
        torch.testing.assert_close(R[row][real, real], alone[0], atol=1e-5, rtol=1e-4)
        pad = ~mask[row].bool()
        assert bool((R[row][pad] == 0).all()) and bool((R[row][:, pad] == 0).all())  # padding gets no share
    with pytest.raises(ValueError, match="attention_mask="):
        contribution_flow(model, cache, method, tokens=tokens)  # the padded cache without its mask


# ---------------------------------------------------------------------------------------------
# bad input: one line each


def _one_line(excinfo):
    assert "\n" not in str(excinfo.value)


def test_bad_input_is_one_line(tiny_gqa):
    model, tokens, cache = tiny_gqa
    with pytest.raises(ValueError, match="method must be one of 'contribution', 'alti'") as e:
        contribution_flow(model, cache, "rollout")
    _one_line(e)
    with pytest.raises(IndexError, match=r"target_layer=2 is out of range: the model has 2 layers") as e:
        contribution_flow(model, cache, target_layer=2)
    _one_line(e)
    with pytest.raises(TypeError, match="target_layer must be an integer") as e:
        contribution_flow(model, cache, target_layer=1.0)
    _one_line(e)
    with pytest.raises(ValueError, match="pass tokens=") as e:
        contribution_flow(model, cache, "value_zeroing_rollout")
    _one_line(e)
    with pytest.raises(ValueError, match="tokens has shape") as e:
        contribution_flow(model, cache, "value_zeroing_rollout", tokens=tokens[:, :5])
    _one_line(e)
    with pytest.raises(KeyError, match="flow_names_filter") as e:
        contribution_flow(model, cache, "contribution")  # a cache with pattern, v and z only
    _one_line(e)
    with pytest.raises(ValueError, match="query_chunk_size must be a positive integer"):
        layer_mixing(model, cache, 0, "attention_rollout", query_chunk_size=0)
    with pytest.raises(TypeError, match="dtype must be a torch floating dtype"):
        contribution_flow(model, cache, "attention_rollout", dtype="float32")
    # negative target layers count from the end
    torch.testing.assert_close(
        contribution_flow(model, cache, "attention_rollout", target_layer=-1),
        contribution_flow(model, cache, "attention_rollout"),
    )


# ---------------------------------------------------------------------------------------------
# the one-prompt look shared by ``geolens flow "prompt"`` and the report (geolens.pipelines.flow.prompt_flow)
