"""The per-layer masking endpoint (geolens.faithfulness.layer_masking, PROTOCOL.md §3-4).

Every measured number is checked against a hand-built reference: masks against a naive loop over
each query's terms, outcomes against a full forward from layer 0 with the same α zeroed by a hook
written here (KL, Δp and NLL in float64 by hand), the all-removed condition against replacing the
attention output itself, the summary against nAOPC, exclusions and bootstrap computed by hand on
constructed rows.
"""

from __future__ import annotations

import doctest
import json
import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from reference import contributions, factors, projected_values

from faithfulness.conftest import N_POS, TWIN, masking_protocol
from geolens.adapter import adapter_for, get_attention_layer
from geolens.faithfulness import layer_masking as lm
from geolens.faithfulness import value_zeroing
from geolens.faithfulness.layer_masking import (
    ALL_REMOVED,
    layer_masking_document,
    mask_hash,
    masking_layers,
    masking_random_seed,
    masking_scores,
    protocol_metrics,
    query_masks,
    scored_positions,
    unigram_logprobs,
)
from geolens.interventions.base import active_hook_count
from geolens.interventions.masking import random_scores
from geolens.testing import tiny_tokens

# ---------------------------------------------------------------------------------------------
# The protocol's choices


def test_three_layers_per_document_one_per_third_and_every_layer_equally_often():
    for L in (3, 18, 30):
        counts = np.zeros(L, dtype=int)
        for d in range(L):
            layers = masking_layers(d, L)
            assert layers == (d % L, (d + L // 3) % L, (d + 2 * (L // 3)) % L)
            assert len(set(layers)) == 3
            counts[list(layers)] += 1
        assert (counts == 3).all()  # L consecutive documents mask every layer three times
    assert masking_layers(0, 2) == (0, 0, 0)
    with pytest.raises(ValueError, match="document_index"):
        masking_layers(-1, 30)


def test_scored_positions_and_random_seeds():
    assert scored_positions(json.loads(TWIN.read_text())) == list(range(8, 125, 4))
    assert len(scored_positions(json.loads(TWIN.read_text()))) == 30
    seeds = {masking_random_seed(d, l) for d in range(20) for l in range(30)}
    assert len(seeds) == 600  # one stream per (document, layer)
    assert masking_random_seed(4, 7) == int(np.random.SeedSequence([2026, 4, 7, 2]).generate_state(1)[0])


def test_protocol_metrics_add_the_pair_metrics_but_not_grad_x_act():
    p = json.loads(TWIN.read_text())
    metrics = protocol_metrics(p)
    assert metrics[: len(p["secondary"]["metrics"])] == p["secondary"]["metrics"]
    assert set(metrics) - set(p["secondary"]["metrics"]) == {"output_normalized_inter"}
    assert "grad_x_act" not in metrics


# ---------------------------------------------------------------------------------------------
# Masks: query ranking, ⌈k n⌉ units per query


def _naive_masks(scores: torch.Tensor, terms: torch.Tensor, k: float, largest: bool) -> torch.Tensor:
    """Loop over queries: the query's units sorted by (score, then source, then head), the first
    ⌈k n⌉ removed (in every head for a per-source score)."""
    H, Q, K = terms.shape
    out = [[[False] * K for _ in range(Q)] for _ in range(H)]
    per_source = scores.shape[0] == 1
    s, t = scores.tolist(), terms.tolist()
    for i in range(Q):
        units = []
        for j in range(K):
            heads = [h for h in range(H) if t[h][i][j]]
            if per_source and heads:
                units.append((s[0][i][j], j, 0, heads))
            elif not per_source:
                units += [(s[h][i][j], j, h, [h]) for h in heads]
        n = len(units)
        take = math.ceil(Fraction(str(k)) * n)
        units.sort(key=lambda u: ((-u[0] if largest else u[0]), u[1], u[2]))
        for _, j, _, heads in units[:take]:
            for h in heads:
                out[h][i][j] = True
    return torch.tensor(out, dtype=torch.bool)


@pytest.mark.parametrize("per_source", [False, True])
def test_query_masks_remove_ceil_k_n_units_per_query_as_a_naive_loop(per_source):
    g = torch.Generator().manual_seed(0)
    H, Q = 3, 30
    terms = torch.ones(H, Q, Q, dtype=torch.bool).tril()
    terms[1, :, :4] = False  # head 1 sees no early source: a sliding-window-like gap
    terms[:, 20:, :3] = False  # no head: those sources are no units for the per-source score either
    terms[:, torch.arange(Q), torch.arange(Q)] = True
    scores = torch.randint(0, 6, (1 if per_source else H, Q, Q), generator=g).float()  # many ties
    scores[0, 5, 2] = -3.0  # negative scores rank as signed values
    fractions = [0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0]
    for largest in (True, False):
        masks = query_masks(scores, terms, fractions, largest=largest)
        for k, mask in zip(fractions, masks):
            naive = _naive_masks(scores, terms, k, largest)
            assert torch.equal(mask, naive), (k, largest)
            assert not (mask & ~terms).any()
            if per_source:  # units: the query's sources with a term in some head
                n, got = terms.any(0).sum(-1), mask.any(0).sum(-1)
            else:  # units: the query's (head, source) terms
                n, got = terms.sum((0, 2)), mask.sum((0, 2))
            assert got.tolist() == [math.ceil(Fraction(str(k)) * int(x)) for x in n]


def test_fractions_round_up_exactly():
    n = torch.tensor([30, 1, 100, 7])
    assert lm._n_take(n, 0.1).tolist() == [3, 1, 10, 1]  # 0.1 · 30 = 3.0000000000000004 in floats
    assert lm._n_take(n, 0.01).tolist() == [1, 1, 1, 1]
    assert lm._n_take(n, 0.2).tolist() == [6, 1, 20, 2]


def test_query_masks_refuse_bad_input():
    terms = torch.ones(2, 3, 3, dtype=torch.bool).tril()
    with pytest.raises(ValueError, match="fractions"):
        query_masks(torch.rand(2, 3, 3), terms, [0.0])
    with pytest.raises(ValueError, match="finite"):
        query_masks(torch.full((2, 3, 3), float("nan")), terms, [0.5])
    with pytest.raises(ValueError, match="head"):
        query_masks(torch.rand(3, 3, 3), terms, [0.5])


# ---------------------------------------------------------------------------------------------
# One document on the tiny models


def _by_hand(model, tokens, layer, removed, positions, clean_logits, hook_name=None, replace=None):
    """A full forward from layer 0, α of ``removed`` [(head, query, key)] zeroed one by one in
    layer's pattern (or the hook ``hook_name`` replaced by ``replace``); KL, Δp, NLL by hand."""

    def zero(pattern, hook):
        pattern = pattern.clone()
        for h, i, j in removed:
            pattern[:, h, i, j] = 0.0
        return pattern

    name = hook_name or adapter_for(model).pattern_hook(layer)
    with torch.no_grad():
        logits = model.run_with_hooks(tokens, fwd_hooks=[(name, replace or zero)])[0]
    kl, dp, nll = [], [], []
    for n, p in enumerate(positions):
        clean = torch.log_softmax(clean_logits[n].double(), -1)
        masked = torch.log_softmax(logits[p].double(), -1)
        top = int(clean.argmax())
        kl.append(float(sum(clean.exp()[t] * (clean[t] - masked[t]) for t in range(clean.shape[0]))))
        dp.append(float(masked[top].exp() - clean[top].exp()))
        nll.append(float(-masked[int(tokens[0, p + 1])]))
    return np.mean(kl), np.mean(dp), np.mean(nll)


def test_rows_cover_every_condition_of_the_three_layers(document):
    model, tokens, protocol, unigram, rows, *_ = document
    layers = masking_layers(4, 3)
    assert sorted(set(rows.layer)) == sorted(layers)
    metrics = protocol_metrics(protocol)
    n_k = len(protocol["secondary"]["fractions"])
    assert len(rows) == 3 * (len(metrics) * 2 * n_k + 1)
    assert (rows.document == 4).all()
    assert set(rows[rows.metric == ALL_REMOVED].direction) == {ALL_REMOVED}
    assert (rows.kl >= -1e-12).all() and (rows.n_removed >= 1).all()
    positions = scored_positions(protocol)
    nxt = tokens[0, torch.tensor(positions) + 1]
    assert rows.unigram_ce.iloc[0] == pytest.approx(float(-unigram[nxt].mean()), abs=1e-12)


def test_a_masked_condition_equals_a_hand_built_full_forward(document):
    model, tokens, protocol, _, rows, logits, cache = document
    positions = scored_positions(protocol)
    clean = logits[0, positions]
    for layer in sorted(set(rows.layer)):
        alpha = get_attention_layer(model, cache, layer).pattern[0]
        terms = alpha != 0
        cases = [("raw_attention", "comprehensiveness", 0.2, alpha), ("random", "sufficiency", 0.05, None)]
        for metric, direction, k, scores in cases:
            if scores is None:
                scores = random_scores(tuple(alpha.shape), seed=masking_random_seed(4, layer))
            mask = _naive_masks(scores, terms, k, direction == "comprehensiveness")
            row = rows[
                (rows.layer == layer) & (rows.metric == metric) & (rows.direction == direction) & (rows.k == k)
            ].iloc[0]
            assert row.mask_hash == mask_hash(mask)
            assert row.n_removed == int(mask.sum())
            kl, dp, nll = _by_hand(model, tokens, layer, mask.nonzero().tolist(), positions, clean)
            assert row.kl == pytest.approx(kl, rel=1e-4, abs=1e-7)
            assert row.delta_p == pytest.approx(dp, abs=1e-6)
            assert row.nll == pytest.approx(nll, rel=1e-5)
            assert row.kl > 0


def test_every_metric_ranks_its_reference_scores(document):
    """Each metric's scores equal the float64 references (loops over ṽ; checked on one layer), and
    its masks are those of the naive loop on the scores (every layer; every k on one layer, the
    smallest and largest k on the others)."""
    model, tokens, protocol, _, rows, logits, cache = document
    metrics = protocol_metrics(protocol)
    layers = sorted(set(rows.layer))
    vz_all = value_zeroing(model, tokens, layers)
    fractions = protocol["secondary"]["fractions"]
    for n, layer in enumerate(layers):
        view = get_attention_layer(model, cache, layer)
        scores = masking_scores(view, metrics, value_zeroing=vz_all[n, 0], random_seed=masking_random_seed(4, layer))
        alpha = view.pattern[0].double()
        ok = alpha != 0
        if n == 1:
            vt_norm = projected_values(model, cache, layer)[0].norm(dim=-1)  # [head, key]
            rel_intra, _ = factors(model, cache, layer, "intra")
            rel_inter, _ = factors(model, cache, layer, "inter")
            c = contributions(model, cache, layer, "inter")[0]
            ref = {
                "raw_attention": alpha,
                "value_weighted": alpha * vt_norm[:, None, :],
                "output_normalized_intra": alpha * rel_intra[0],
                "output_normalized_inter": alpha * rel_inter[0],
                "contribution": c,
                "contribution_abs": c.abs(),
            }
            for name, r in ref.items():
                torch.testing.assert_close(scores[name].double()[ok], r[ok], rtol=2e-4, atol=1e-6, msg=name)
        torch.testing.assert_close(scores["value_zeroing"][0], vz_all[n, 0])
        torch.testing.assert_close(
            scores["random"], random_scores(tuple(alpha.shape), seed=masking_random_seed(4, layer))
        )
        terms = view.pattern[0] != 0
        for metric in metrics:
            for direction in ("comprehensiveness", "sufficiency"):
                for k in fractions if n == 1 else (fractions[0], fractions[-1]):
                    mask = _naive_masks(scores[metric], terms, k, direction == "comprehensiveness")
                    row = rows[
                        (rows.layer == layer) & (rows.metric == metric) & (rows.direction == direction) & (rows.k == k)
                    ]
                    assert row.mask_hash.iloc[0] == mask_hash(mask), (metric, direction, k)


def test_value_weighted_and_output_normalised_inter_share_masks(document):
    """One ‖o_i‖ per query: identical rankings, hence identical masks and outcomes (one forward)."""
    rows = document[4]
    a = rows[rows.metric == "value_weighted"].reset_index(drop=True)
    b = rows[rows.metric == "output_normalized_inter"].reset_index(drop=True)
    assert (a.mask_hash == b.mask_hash).all()
    assert (a.kl == b.kl).all()


def test_all_removed_equals_removing_the_attention_output(document):
    """Every α of the layer zeroed = the pre-norm attention output replaced by b_O (0 without bias)."""
    model, tokens, protocol, _, rows, logits, cache = document
    positions = scored_positions(protocol)
    adapter = adapter_for(model)
    for layer in sorted(set(rows.layer)):
        _, b_O = adapter.output_weights(layer)

        def only_bias(out, hook, b_O=b_O):
            return torch.zeros_like(out) + b_O.detach().to(out.dtype)

        kl, dp, nll = _by_hand(
            model, tokens, layer, [], positions, logits[0, positions], adapter.attn_out_hook(layer), only_bias
        )
        row = rows[(rows.layer == layer) & (rows.metric == ALL_REMOVED)].iloc[0]
        assert row.kl == pytest.approx(kl, rel=1e-4, abs=1e-7)
        assert row.delta_p == pytest.approx(dp, abs=1e-6)
        assert row.nll == pytest.approx(nll, rel=1e-5)
        assert row.n_removed == row.n_terms == int((get_attention_layer(model, cache, layer).pattern != 0).sum())


def test_bad_input_is_one_clear_error(tiny_gqa):
    model = tiny_gqa[0]
    tokens = tiny_tokens(model, length=N_POS)[:1]
    before = active_hook_count(model)
    with pytest.raises(ValueError, match="masking_scope"):
        layer_masking_document(model, tokens, 0, protocol=masking_protocol(masking_scope="all"))
    with pytest.raises(ValueError, match="tokens must be one"):
        layer_masking_document(model, tokens.float(), 0, protocol=masking_protocol())
    with pytest.raises(ValueError, match="window of at least"):
        layer_masking_document(model, tokens[:, :20], 0, protocol=masking_protocol())
    with pytest.raises(ValueError, match="unigram_logprobs"):
        layer_masking_document(model, tokens, 0, protocol=masking_protocol(), unigram_logprobs=torch.zeros(3))
    with pytest.raises(ValueError, match="document_index"):
        layer_masking_document(model, tokens, -2, protocol=masking_protocol())
    assert active_hook_count(model) == before


def test_unigram_logprobs_count_every_token_with_add_one_smoothing(tiny_gqa):
    model = tiny_gqa[0]
    texts = ["the cat sat.", "a cat!", "zz"]
    counts = [0] * model.cfg.d_vocab
    for text in texts:
        for t in model.tokenizer(text, add_special_tokens=False)["input_ids"]:
            counts[t] += 1
    n, V = sum(counts), model.cfg.d_vocab
    u = unigram_logprobs(model, texts)
    assert u.dtype == torch.float64 and u.shape == (V,)
    for t in range(V):
        assert float(u[t]) == pytest.approx(math.log((counts[t] + 1) / (n + V)), abs=1e-12)
    with pytest.raises(ValueError, match="texts"):
        unigram_logprobs(model, "one string")


@pytest.mark.bridge_only
def test_docstring_examples_run():
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    tests = finder.find(lm, globs=dict(vars(lm)))
    assert sum(len(t.examples) for t in tests) >= 20
    for t in tests:
        runner.run(t)
    assert runner.summarize(verbose=False).failed == 0


# ---------------------------------------------------------------------------------------------
# The summary, on constructed rows
