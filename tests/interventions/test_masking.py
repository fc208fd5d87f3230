"""Masking intervention through hook_pattern (docs/method.md §3): identities against naive references."""

from __future__ import annotations

import math

import pytest
import torch

from geolens.interventions import active_hook_count, applied
from geolens.interventions.masking import (
    eligible_sources,
    masked_token_nll,
    pattern_mask_hooks,
    removal_mask,
    token_nll,
)


def naive_removal(scores, fraction, largest, allow_sink, allow_current):
    """Row by row with Python lists: rank the eligible sources, remove round-half-up(k·n)."""
    *lead, q, k = scores.shape
    flat = scores.reshape(-1, q, k)
    out = torch.zeros_like(flat, dtype=torch.bool)
    for b in range(flat.shape[0]):
        for i in range(q):
            elig = [j for j in range(k) if j <= i and (allow_sink or j != 0) and (allow_current or j != i)]
            ranked = sorted(elig, key=lambda j: (-flat[b, i, j].item() if largest else flat[b, i, j].item(), j))
            n = math.floor(fraction * len(elig) + 0.5)
            for j in ranked[:n]:
                out[b, i, j] = True
    return out.reshape(scores.shape)


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("allow_sink,allow_current", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.35, 0.5, 0.9, 1.0])
def test_removal_mask_matches_naive(largest, allow_sink, allow_current, fraction):
    g = torch.Generator().manual_seed(1)
    scores = torch.randn(2, 3, 9, 9, generator=g)
    scores[0, 0, 5, :3] = 0.25  # ties: broken by increasing source index
    got = removal_mask(scores, fraction, largest=largest, allow_sink=allow_sink, allow_current=allow_current)
    want = naive_removal(scores, fraction, largest, allow_sink, allow_current)
    assert torch.equal(got, want)


def test_removal_mask_hand_example():
    # query 3 sees sources 0..3; sink and current protected -> eligible {1, 2}
    scores = torch.zeros(4, 4)
    scores[3] = torch.tensor([9.0, 1.0, 5.0, 7.0])
    top = removal_mask(scores, 0.5)
    bottom = removal_mask(scores, 0.5, largest=False)
    assert top[3].tolist() == [False, False, True, False]
    assert bottom[3].tolist() == [False, True, False, False]
    assert not top[:2].any()  # queries 0 and 1 have no eligible source
    assert top[2].tolist() == [False, True, False, False]  # one eligible source: ⌊0.5 + 0.5⌋ = 1
    assert removal_mask(scores, 1.0)[2].tolist() == [False, True, False, False]
    with pytest.raises(ValueError, match="fraction"):
        removal_mask(scores, 1.5)
    with pytest.raises(ValueError, match="NaN"):
        removal_mask(torch.full((3, 3), float("nan")), 0.5)


def test_eligible_sources_causal():
    ok = eligible_sources(4, 4, allow_sink=True, allow_current=True)
    assert torch.equal(ok, torch.ones(4, 4, dtype=torch.bool).tril())


def _layers_all(model):
    return list(range(model.cfg.n_layers))


def _capture_z(model, tokens, hooks, layer):
    got = {}

    def save(z, hook):
        got["z"] = z.detach().clone()

    with torch.no_grad(), applied(model, list(hooks) + [(f"blocks.{layer}.attn.hook_z", save)]):
        model(tokens, return_type="logits")
    return got["z"]


def test_removing_every_source_zeroes_head_output(tiny):
    model, tokens, _ = tiny
    n = tokens.shape[1]
    layers = _layers_all(model)
    remove = torch.ones(len(layers), 1, model.cfg.n_heads, n, n, dtype=torch.bool)
    before = active_hook_count(model)  # the bridge's run_with_cache leaves hooks of its own
    for l in layers:
        z = _capture_z(model, tokens, pattern_mask_hooks(model, remove, layers), l)
        assert z.abs().max().item() == 0.0
    assert active_hook_count(model) == before


def test_removing_no_source_changes_nothing(tiny):
    model, tokens, _ = tiny
    n = tokens.shape[1]
    layers = _layers_all(model)
    remove = torch.zeros(len(layers), 1, model.cfg.n_heads, n, n, dtype=torch.bool)
    with torch.no_grad():
        clean = model(tokens, return_type="logits")
        with applied(model, pattern_mask_hooks(model, remove, layers)):
            masked = model(tokens, return_type="logits")
    assert torch.equal(clean, masked)


def test_mask_equals_analytic_sum_over_kept_sources(tiny):
    """At the first masked layer, z_i^h = Σ_{j kept} α_ij^h v_j^h (float64, explicit loops)."""
    import reference

    model, tokens, cache = tiny
    n = tokens.shape[1]
    layer = model.cfg.n_layers - 1  # its input is unchanged when only this layer is masked
    g = torch.Generator().manual_seed(0)
    remove = torch.rand(1, tokens.shape[0], model.cfg.n_heads, n, n, generator=g) < 0.4
    z = _capture_z(model, tokens, pattern_mask_hooks(model, remove, [layer]), layer).double()
    pattern, v, _ = reference.raw_tensors(model, cache, layer)
    b, h = pattern.shape[:2]
    want = torch.zeros(b, n, h, v.shape[-1], dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            for i in range(n):
                for j in range(n):
                    if not remove[0, bi, hi, i, j]:
                        want[bi, i, hi] += pattern[bi, hi, i, j] * v[bi, j, hi]
    assert torch.allclose(z, want, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("branch", [True, False])
def test_batched_masks_equal_one_at_a_time(tiny, branch):
    model, tokens, _ = tiny
    seq = tokens[:1]
    n = seq.shape[1]
    layers = [model.cfg.n_layers - 1] if branch else _layers_all(model)
    g = torch.Generator().manual_seed(3)
    scores = torch.randn(len(layers), 1, model.cfg.n_heads, n, n, generator=g)
    remove = torch.cat([removal_mask(scores, k) for k in (0.0, 0.2, 0.5, 0.8, 1.0)], dim=1)
    before = active_hook_count(model)
    batched = masked_token_nll(model, seq, remove, layers, chunk_size=3, branch=branch)
    single = []
    with torch.no_grad():
        for m in range(remove.shape[1]):
            with applied(model, pattern_mask_hooks(model, remove[:, m : m + 1], layers)):
                single.append(token_nll(model(seq, return_type="logits"), seq))
    assert torch.allclose(batched, torch.cat(single), atol=1e-5)
    assert active_hook_count(model) == before


def test_head_broadcast_mask(tiny_gqa):
    """A mask with head axis 1 removes the same sources in every head."""
    model, tokens, _ = tiny_gqa
    n = tokens.shape[1]
    one = torch.rand(1, 1, 1, n, n, generator=torch.Generator().manual_seed(0)) < 0.5
    full = one.expand(-1, -1, model.cfg.n_heads, -1, -1).contiguous()
    seq = tokens[:1]
    a = masked_token_nll(model, seq, one.expand(-1, 1, -1, -1, -1), [0], branch=False)
    b = masked_token_nll(model, seq, full, [0], branch=False)
    assert torch.equal(a, b)


def test_bad_masks_raise(tiny_gqa):
    model, tokens, _ = tiny_gqa
    n = tokens.shape[1]
    before = active_hook_count(model)
    with pytest.raises(TypeError, match="bool"):
        pattern_mask_hooks(model, torch.zeros(1, 1, 1, n, n), [0])
    with pytest.raises(ValueError, match="layer slices"):
        pattern_mask_hooks(model, torch.zeros(2, 1, 1, n, n, dtype=torch.bool), [0])
    with pytest.raises(IndexError):
        pattern_mask_hooks(model, torch.zeros(1, 1, 1, n, n, dtype=torch.bool), [99])
    bad = torch.zeros(1, 1, 1, n + 1, n + 1, dtype=torch.bool)
    with pytest.raises(ValueError, match="does not fit"):
        with applied(model, pattern_mask_hooks(model, bad, [0])):
            model(tokens[:1])
    assert active_hook_count(model) == before


@pytest.mark.slow
def test_smollm2_batched_masks_equal_single(smollm2, smollm2_tokens):
    model = smollm2
    seq = smollm2_tokens[:1, :32]
    layers = [20, 25, 29]
    scores = torch.rand(len(layers), 1, model.cfg.n_heads, 32, 32, generator=torch.Generator().manual_seed(0))
    remove = torch.cat([removal_mask(scores, 0.0), removal_mask(scores, 0.5)], dim=1)
    batched = masked_token_nll(model, seq, remove, layers)
    with torch.no_grad():
        clean = token_nll(model(seq, return_type="logits"), seq)
        with applied(model, pattern_mask_hooks(model, remove[:, 1:], layers)):
            single = token_nll(model(seq, return_type="logits"), seq)
    assert torch.allclose(batched[0], clean[0], atol=1e-4)
    assert torch.allclose(batched[1], single[0], atol=1e-4)
    assert (batched[1].mean() - clean[0].mean()).abs() > 1e-3  # the mask does something


def test_scoring_the_last_predictions_equals_the_tail_of_full_nll(tiny):
    model, tokens, _ = tiny
    seq = tokens[:1]
    n = seq.shape[1]
    remove = removal_mask(torch.rand(1, 1, model.cfg.n_heads, n, n, generator=torch.Generator().manual_seed(0)), 0.5)
    remove = torch.cat([remove, ~remove], dim=1)
    full = masked_token_nll(model, seq, remove, [0])
    tail = masked_token_nll(model, seq, remove, [0], n_scored=4)
    assert tail.shape == (2, 4)
    assert torch.allclose(tail, full[:, -4:], atol=1e-5)
    with pytest.raises(ValueError, match="n_scored"):
        masked_token_nll(model, seq, remove, [0], n_scored=n)
