"""Ranking scopes of the faithfulness protocol (row / query / source): the removal masks of
geolens.interventions.masking against a naive scoped removal, the masked forward against a
hand-built attention output, and the bad-input errors (issue 10)."""

from __future__ import annotations

import math

import pytest
import reference
import torch

from geolens.faithfulness import (
    MaskingConfig,
    curve_masks,
    faithfulness_curves,
    metric_scores,
)
from geolens.interventions import active_hook_count, applied
from geolens.interventions.masking import (
    mask_from_ranks,
    pattern_mask_hooks,
    removal_masks,
    removal_ranks,
)


def naive_scoped_removal(scores, fraction, scope, largest, allow_sink, allow_current):
    """Python lists: the terms of each ranking group, sorted, the first round-half-up(k·n) removed.

    ``scores`` [head, q, k] (float64). Returns a set of removed (h, i, j); under ``source`` a
    removed (i, j) is removed in every head.
    """
    h_n, q_n, k_n = scores.shape
    removed = set()
    for i in range(q_n):
        elig = [j for j in range(k_n) if j <= i and (allow_sink or j != 0) and (allow_current or j != i)]
        if scope == "row":
            groups = [[((h, j), float(scores[h, i, j])) for j in elig] for h in range(h_n)]
        elif scope == "query":
            groups = [[((h, j), float(scores[h, i, j])) for j in elig for h in range(h_n)]]
        else:  # source: one score per (i, j), summed over heads with an explicit loop
            groups = [[(("all", j), sum(float(scores[h, i, j]) for h in range(h_n))) for j in elig]]
        for terms in groups:
            order = sorted(range(len(terms)), key=lambda t: (-terms[t][1] if largest else terms[t][1], t))
            n = math.floor(fraction * len(terms) + 0.5)
            for t in order[:n]:
                (h, j), _ = terms[t]
                for hh in range(h_n) if h == "all" else [h]:
                    removed.add((hh, i, j))
    return removed


def as_set(mask):
    return {tuple(int(x) for x in idx) for idx in torch.nonzero(mask)}


@pytest.mark.parametrize("scope", ["row", "query", "source"])
@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("allow", [(True, True), (False, False), (True, False)])
@pytest.mark.parametrize("fraction", [0.01, 0.3, 0.5, 0.9])
def test_scoped_ranking_matches_naive(scope, largest, allow, fraction):
    g = torch.Generator().manual_seed(7)
    scores = torch.randn(3, 7, 7, generator=g, dtype=torch.float64)
    scores[1, 5, 2] = scores[0, 5, 2]  # a tie between two heads of one source: lower head first
    rank, n_ok, ok = removal_ranks(scores, scope=scope, largest=largest, allow_sink=allow[0], allow_current=allow[1])
    mask = mask_from_ranks(rank, n_ok, ok, fraction)
    got = as_set(mask.expand(3, 7, 7))
    assert got == naive_scoped_removal(scores, fraction, scope, largest, *allow)


def test_query_scope_shared_score_removes_whole_sources():
    """A head axis of 1 under query ranking ranks sources and removes each in every head."""
    scores = torch.rand(1, 6, 6, generator=torch.Generator().manual_seed(0))
    a = mask_from_ranks(*removal_ranks(scores, scope="query", allow_sink=True, allow_current=True), 0.5)
    b = mask_from_ranks(*removal_ranks(scores, scope="row", allow_sink=True, allow_current=True), 0.5)
    assert torch.equal(a, b)


def naive_attention_output(model, cache, layer, removed):
    """Σ_h Σ_{j kept} α_ij^h ṽ_j^h + b_O with explicit loops, float64; ``removed`` a set of (h, i, j)."""
    pattern, _, _ = reference.raw_tensors(model, cache, layer)
    vt = reference.projected_values(model, cache, layer)
    _, h_n, q_n, k_n = pattern.shape
    b_O = getattr(model.blocks[layer].attn, "b_O", None)
    out = torch.zeros(q_n, vt.shape[-1], dtype=torch.float64)
    for i in range(q_n):
        if b_O is not None:
            out[i] += b_O.detach().double()
        for h in range(h_n):
            for j in range(k_n):
                if (h, i, j) not in removed:
                    out[i] += pattern[0, h, i, j] * vt[0, h, j]
    return out


@pytest.mark.parametrize("scope", ["row", "query", "source"])
def test_masked_forward_equals_hand_built_output(tiny, scope):
    """The hooked run with a scoped contribution-weight mask equals, at the masked layer, the
    attention output built by hand with exactly the naive ranking's (h, i, j) terms dropped."""
    model, tokens, cache = tiny
    seq = tokens[:1]
    layer = model.cfg.n_layers - 1  # masked alone: its input is the clean one
    protocol = MaskingConfig(layers=(layer,), ranking=scope, fractions=(0.3,))
    scores = metric_scores(model, seq, protocol, ["contribution"])["contribution"]
    mask = curve_masks(scores, protocol)[:, :1]  # comprehensiveness, k = 0.3
    h_n = model.cfg.n_heads
    # under source ranking the scores are already summed over heads (head axis 1): every head
    # carries the same per-source score, and the naive sum ranks sources the same way
    naive = naive_scoped_removal(scores[0, 0].double().expand(h_n, -1, -1), 0.3, scope, True, True, True)
    assert as_set(mask[0, 0].expand(h_n, -1, -1)) == naive and naive
    got = {}

    def save(z, hook):
        got["z"] = z.detach().double()

    before = active_hook_count(model)
    hooks = list(pattern_mask_hooks(model, mask.expand(-1, -1, h_n, -1, -1), [layer]))
    with torch.no_grad(), applied(model, hooks + [(f"blocks.{layer}.attn.hook_z", save)]):
        model(seq, return_type="logits")
    assert active_hook_count(model) == before
    _, _, W_O = reference.raw_tensors(model, cache, layer)
    b_O = getattr(model.blocks[layer].attn, "b_O", None)
    out = torch.einsum("qhd,hdm->qm", got["z"][0], W_O)
    if b_O is not None:
        out = out + b_O.detach().double()
    want = naive_attention_output(
        model, {k: v[:1] for k, v in cache.items()} if hasattr(cache, "items") else cache, layer, naive
    )
    assert torch.allclose(out, want, atol=1e-5, rtol=1e-4), (out - want).abs().max()


def test_bad_input_one_line_errors(tiny_gqa):
    model, tokens, _ = tiny_gqa

    def one_line(exc_info):
        assert "\n" not in str(exc_info.value)

    for fr in [(0.0, 0.5), (0.5, 1.0)]:
        with pytest.raises(ValueError, match=r"fractions must lie in \(0, 1\)") as e:
            faithfulness_curves(model, tokens, MaskingConfig(fractions=fr), ["random"], progress=False)
        one_line(e)
    with pytest.raises(ValueError, match=r"fractions must lie in \(0, 1\)") as e:
        MaskingConfig(fractions=(-0.1, 0.5))
    one_line(e)
    with pytest.raises(ValueError, match="unknown ranking scope 'head'") as e:
        MaskingConfig(ranking="head")
    one_line(e)
    with pytest.raises(ValueError, match="unknown metrics") as e:
        faithfulness_curves(model, tokens, MaskingConfig(), ["attention"], progress=False)
    one_line(e)
    with pytest.raises(IndexError, match="layer=7 is out of range: the model has 2 layers") as e:
        faithfulness_curves(model, tokens, MaskingConfig(layers=(7,)), ["random"], progress=False)
    one_line(e)
    with pytest.raises(ValueError, match="skip_prefix") as e:
        faithfulness_curves(
            model, tokens[:, :5], MaskingConfig(skip_prefix=4, fractions=(0.5,)), ["random"], progress=False
        )
    one_line(e)


def test_masks_need_hook_pattern():
    class NoPattern:  # e.g. a model run with fused (sdpa) attention: no hook_pattern to edit
        class cfg:
            n_layers = 2
            n_heads = 2

        hook_dict = {"blocks.0.attn.hook_z": None}

    remove = torch.zeros(1, 1, 2, 4, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match="no blocks.0.attn.hook_pattern") as e:
        pattern_mask_hooks(NoPattern(), remove, [0])
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="masking needs the attention-pattern hook") as e:
        faithfulness_curves(
            NoPattern(), torch.zeros(1, 12, dtype=torch.long), MaskingConfig(), ["random"], progress=False
        )
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("scope", ["row", "query", "source"])
@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("allow", [(False, False), (True, True), (True, False)])
def test_removal_masks_equal_masks_from_full_ranking(scope, largest, allow):
    """The top-k selection used for one or two fractions gives the masks of the full stable
    ranking bit for bit, ties included (scores drawn from 3 values, so ties are everywhere)."""
    g = torch.Generator().manual_seed(3)
    for n_heads in (1, 4):
        scores = torch.randint(0, 3, (2, 1, n_heads, 11, 11), generator=g).float() - 1.0
        kw = dict(scope=scope, largest=largest, allow_sink=allow[0], allow_current=allow[1])
        ranks = removal_ranks(scores, **kw)
        for fractions in ([0.1], [0.0, 1.0], [0.37, 0.5], [0.1, 0.5, 0.9]):
            got = removal_masks(scores, fractions, **kw)
            for k, mask in zip(fractions, got, strict=True):
                assert torch.equal(mask.expand_as(mask_from_ranks(*ranks, k)), mask_from_ranks(*ranks, k)), (
                    fractions,
                    k,
                )
    with pytest.raises(ValueError, match="fraction"):
        removal_masks(scores, [1.5])
