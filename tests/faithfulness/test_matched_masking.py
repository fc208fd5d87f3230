"""Protocol 4's size-matched random controls (geolens.faithfulness.matched_masking).

The terms' vectors against a naive float64 loop over (head, query, key) with the reference's
projected values; each control's achieved norm against the norm of its removed terms summed by
hand; the document's rows against the stored masking rows they must reuse (hash check, recomputed
KL) and against masked_outcomes run by hand on the same masks.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import TINY_KINDS, make_tiny
from reference import projected_values, raw_tensors

from faithfulness.conftest import N_POS
from geolens.adapter import get_attention_layer
from geolens.faithfulness.layer_masking import layer_masking_document, mask_hash, query_masks
from geolens.faithfulness.masked_outcomes import masked_outcomes
from geolens.faithfulness.matched_masking import (
    CHECKED,
    MATCHED,
    QueryTerms,
    matched_masking_document,
    matched_random_mask,
    matched_seed,
    term_vectors,
)
from geolens.interventions.base import active_hook_count
from geolens.testing import tiny_tokens

METRICS = ["raw_attention", "value_weighted", "contribution"]
FRACTIONS = [0.1, 0.5]


def _section(**over) -> dict:
    section = dict(
        scored_positions=[4, N_POS - 4, 4],
        fractions=FRACTIONS,
        metrics=METRICS,
        draws=2,
        tolerance=0.05,
        max_orders=10,
        check=["contribution", 0.1],
        check_rtol=1e-4,
    )
    section.update(over)
    return section


def _addendum() -> dict:
    """The masking addendum's settings on short windows: one layer per document, these metrics."""
    import json
    from pathlib import Path

    twin = json.loads(
        (Path(__file__).resolve().parents[2] / "docs/faithfulness/v3/masking/protocol.json").read_text(encoding="utf-8")
    )
    twin["secondary"].update(scored_positions=[4, N_POS - 4, 4], fractions=FRACTIONS, metrics=METRICS)
    twin["pairs"] = [["raw_attention", "contribution"]]
    return twin


@pytest.fixture(scope="module", params=TINY_KINDS)
def stored(request):
    model = make_tiny(request.param, n_layers=3)
    tokens = tiny_tokens(model, length=N_POS)[:1]
    rows = layer_masking_document(model, tokens, 4, protocol=_addendum(), batch_size=32)
    return model, tokens, rows


def test_term_vectors_equal_a_naive_float64_loop(stored):
    model, tokens, _ = stored
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    layer = 1
    pattern, _, _ = raw_tensors(model, cache, layer)
    vt = projected_values(model, cache, layer)  # [b, h, k, d_model], float64 by loops
    u = term_vectors(get_attention_layer(model, cache, layer))
    H, Q, K, _ = u.shape
    for h in range(H):
        for i in range(0, Q, 7):
            for j in range(K):
                want = pattern[0, h, i, j].double() * vt[0, h, j]
                assert torch.allclose(u[h, i, j], want, atol=1e-6, rtol=1e-5)


def _toy(seed=0, H=2, Q=6, K=6, d=5):
    g = torch.Generator().manual_seed(seed)
    vectors = torch.randn(H, Q, K, d, generator=g, dtype=torch.float64)
    terms = torch.ones(H, Q, K, dtype=torch.bool).tril()
    vectors = vectors * terms[..., None]
    return vectors, terms


def test_each_control_removes_as_much_norm_as_its_target_within_the_tolerance():
    vectors, terms = _toy()
    target = torch.zeros_like(terms)
    target[0, :, 0] = True  # one term per query
    target[1, 3:, 2] = True
    mask, ratio, ok = matched_random_mask(vectors, terms, target, np.random.default_rng(3), tolerance=0.05)
    assert not bool((mask & ~terms).any()), "a control removes terms only"
    for i in range(terms.shape[1]):
        tau = float(vectors[:, i][target[:, i]].sum(0).norm())
        got = float(vectors[:, i][mask[:, i]].sum(0).norm())  # the removed sum, by hand
        assert ratio[i] == pytest.approx(got / tau, rel=1e-12)
        assert ok[i] == (abs(got / tau - 1) <= 0.05)
    assert ok.mean() > 0.5


def test_a_query_removing_nothing_is_left_whole_and_the_draw_is_reproducible():
    vectors, terms = _toy(1)
    target = torch.zeros_like(terms)
    target[:, 4, 1] = True
    prepared = QueryTerms(vectors, terms)
    a = matched_random_mask(prepared, None, target, np.random.default_rng(matched_seed(0, 1, 2, 0, 0)))
    b = matched_random_mask(vectors, terms, target, np.random.default_rng(matched_seed(0, 1, 2, 0, 0)))
    assert torch.equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert not bool(a[0][:, [0, 1, 2, 3, 5]].any())
    assert a[1][0] == 1.0 and bool(a[2][0])


def test_a_target_no_order_matches_keeps_the_closest_prefix_and_counts_as_unmatched():
    vectors = torch.zeros(1, 1, 4, 2, dtype=torch.float64)
    vectors[0, 0, :, 0] = torch.tensor([3.0, -2.0, -2.0, -2.0])  # prefix norms move in steps of 2 or 3
    terms = torch.ones(1, 1, 4, dtype=torch.bool)
    target = torch.tensor([[[True, False, False, False]]])  # a norm of 3: only an order starting with it matches
    seen = set()
    for seed in range(40):
        mask, ratio, ok = matched_random_mask(vectors, terms, target, np.random.default_rng(seed), max_orders=1)
        by_hand = float(vectors[0, 0][mask[0, 0]].sum(0).norm()) / 3.0
        assert ratio[0] == pytest.approx(by_hand)
        assert bool(ok[0]) == (abs(by_hand - 1) <= 0.05)
        seen.add(bool(ok[0]))
    assert seen == {True, False}
    with pytest.raises(ValueError, match="tolerance"):
        matched_random_mask(vectors, terms, target, np.random.default_rng(0), tolerance=1.5)
    with pytest.raises(ValueError, match="max_orders"):
        matched_random_mask(vectors, terms, target, np.random.default_rng(0), max_orders=0)


def test_the_document_reuses_the_stored_masks_and_measures_the_controls_like_any_mask(stored):
    model, tokens, rows = stored
    before = active_hook_count(model)
    out = matched_masking_document(model, tokens, 4, protocol=_section(), stored=rows, batch_size=8)
    assert active_hook_count(model) == before
    controls = out[out.metric == MATCHED]
    assert len(controls) == len(METRICS) * len(FRACTIONS) * 2
    checks = out[out.metric == CHECKED]
    assert set(checks.target) == {"all_removed", "contribution"}
    assert np.allclose(checks.kl, checks.stored_kl, rtol=1e-4)
    # the controls of raw attention at k = 0.5 rebuilt by hand, measured by masked_outcomes directly
    layer = int(out.layer.iloc[0])
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
    view = get_attention_layer(model, cache, layer)
    terms = view.pattern[0] != 0
    from geolens.faithfulness.layer_masking import masking_random_seed, masking_scores

    scores = masking_scores(view, METRICS, random_seed=masking_random_seed(4, layer))
    target = query_masks(scores["raw_attention"], terms, [0.5])[0]
    prepared = QueryTerms(term_vectors(view), terms)
    positions = list(range(4, N_POS - 3, 4))
    for draw in range(2):
        rng = np.random.default_rng(matched_seed(4, layer, 0, 1, draw))
        mask, _, _ = matched_random_mask(prepared, None, target, rng, tolerance=0.05, max_orders=10)
        row = controls[(controls.target == "raw_attention") & (controls.k == 0.5) & (controls.draw == draw)].iloc[0]
        assert row.mask_hash == mask_hash(mask)
        kl = masked_outcomes(model, tokens, layer, mask[None], positions, logits[0, positions])["kl"].mean()
        assert row.kl == pytest.approx(float(kl), rel=1e-6, abs=1e-9)


def test_stored_rows_that_do_not_match_are_refused(stored):
    model, tokens, rows = stored
    tampered = rows.copy()
    first = tampered.index[(tampered.metric == "contribution") & (tampered.direction == "comprehensiveness")][0]
    tampered.loc[first, "mask_hash"] = "0" * 16
    with pytest.raises(ValueError, match="not the stored one"):
        matched_masking_document(model, tokens, 4, protocol=_section(), stored=tampered)
    tampered = rows.copy()
    tampered.loc[tampered.metric == "all_removed", "kl"] *= 1.01
    with pytest.raises(RuntimeError, match="cannot be reused"):
        matched_masking_document(model, tokens, 4, protocol=_section(draws=1), stored=tampered)
