"""Head taxonomy details: relative offsets of "other" winners, final-query mode,
window-prefix shares, and sliding-window layers, against hand-built patterns and naive loops."""

from __future__ import annotations

import numpy as np
import pytest
import reference
import torch
from conftest import make_tiny

from geolens import taxonomy
from geolens.runner import run_corpus
from geolens.testing import tiny_tokens

T = 10
# target source of query i (i ≥ 1) for each of 4 hand-built heads
TARGETS = [
    lambda i: i - 1,  # previous token: i=1 → sink, then offset −1 eight times
    lambda i: 0,  # sink
    lambda i: i,  # current token
    lambda i: 1 if i < 3 else (i - 1 if i % 2 == 0 else i - 2),  # alternating −1 / −2 (tie)
]


def hand_cache(model, batch: int = 1):
    """A cache whose every layer has the hand-built pattern (a small causal floor so no key gets
    exactly 0) and all-ones values (equal norms: the winner is argmax α)."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    pattern = torch.zeros(batch, H, T, T)
    for h, target in enumerate(TARGETS):
        for i in range(T):
            pattern[:, h, i, : i + 1] = 0.01
            pattern[:, h, i, target(i) if i > 0 else 0] += 1.0
            pattern[:, h, i] /= pattern[:, h, i].sum()
    kv = model.cfg.n_key_value_heads or H
    v = torch.ones(batch, T, kv, model.cfg.d_head)
    cache = {}
    for l in range(L):
        cache[f"blocks.{l}.attn.hook_pattern"] = pattern.clone()
        cache[f"blocks.{l}.attn.hook_v"] = v.clone()
    return cache


@pytest.fixture(scope="module")
def gqa():
    return make_tiny("gqa")


def test_offset_statistic_on_hand_built_pattern(gqa):
    model = gqa
    a = taxonomy.TaxonomyAnalysis.for_model(model, prefix_lengths=(4,))
    a.update(model, hand_cache(model), torch.zeros(1, T, dtype=torch.long))
    np.testing.assert_array_equal(a.counts.total[0].numpy(), [[1, 0, 8], [9, 0, 0], [0, 9, 0], [0, 1, 8]])
    off = a.offsets.total[0]
    assert off[0, 1] == 8 and off[0].sum() == 8
    assert off[1].sum() == 0 and off[2].sum() == 0
    assert off[3, 1] == 4 and off[3, 2] == 4 and off[3].sum() == 8
    res = a.result()
    t = res.table[res.table.layer == 0].set_index("head")
    assert t.loc[0, "regime"] == "Reset" and t.loc[0, "top_offset"] == -1
    assert t.loc[0, "top_offset_count"] == 8
    assert t.loc[0, "top_offset_share"] == pytest.approx(8 / 9)
    assert t.loc[0, "top_offset_share_of_other"] == pytest.approx(1.0)
    assert bool(t.loc[0, "offset_dominant"]) and t.loc[0, "label"] == "Reset (offset −1, 89 %)"
    assert np.isnan(t.loc[1, "top_offset"]) and t.loc[1, "label"] == "Mixer" and t.loc[1, "top_offset_count"] == 0
    assert t.loc[2, "label"] == "Retriever"
    # a tie between −1 and −2 goes to the offset nearest the query; 4/9 is not "most queries"
    assert t.loc[3, "top_offset"] == -1 and t.loc[3, "top_offset_share"] == pytest.approx(4 / 9)
    assert t.loc[3, "top_offset_share_of_other"] == pytest.approx(0.5)
    assert not bool(t.loc[3, "offset_dominant"]) and t.loc[3, "label"] == "Reset"
    assert (t.n_out_of_window == 0).all()
    ot = res.offset_table(top=2)
    assert ot[(ot.layer == 0) & (ot["head"] == 3)][["offset", "count"]].values.tolist() == [[-1, 4], [-2, 4]]
    # prefix of 4 tokens: queries 1..3
    bl = res.by_length()
    assert bl.prefix_length.tolist() == [4] and bl.n_windows.tolist() == [1] and bl.n_queries_per_head.tolist() == [3]
    np.testing.assert_array_equal(res.prefix_counts[0, 0].numpy(), [[1, 0, 2], [3, 0, 0], [0, 3, 0], [0, 1, 2]])


def test_final_query_mode_on_hand_built_pattern(gqa):
    model = gqa
    a = taxonomy.TaxonomyAnalysis.for_model(model, queries="final", prefix_lengths=(4, 8))
    a.update(model, hand_cache(model, batch=2), torch.zeros(2, T, dtype=torch.long))
    np.testing.assert_array_equal(a.counts.total[1].numpy(), [[0, 0, 2], [2, 0, 0], [0, 2, 0], [0, 0, 2]])
    assert a.offsets.total[1, 0, 1] == 2 and a.offsets.total[1, 3, 2] == 2  # query 9: i−1 and i−2
    # final query of the 4-token prefix is query 3: heads → other(−1), sink, current, other(−2)
    np.testing.assert_array_equal(a.prefix_counts.total[0, 0].numpy(), [[0, 0, 2], [2, 0, 0], [0, 2, 0], [0, 0, 2]])
    res = a.result()
    assert res.queries == "final" and (res.table.n_queries == 2).all()
    assert res.table.label.iloc[0] == "Reset (offset −1, 100 %)"


def brute_winners(model, cache, layer, window=None, space="value"):
    """[b, h, q] winners by explicit loops over the visible set, float64."""
    pattern, v, _ = reference.raw_tensors(model, cache, layer)
    u = reference.projected_values(model, cache, layer) if space == "projected" else v.permute(0, 2, 1, 3)
    b, h, q, _ = pattern.shape
    w = np.zeros((b, h, q), dtype=np.int64)
    for bi in range(b):
        for hi in range(h):
            for i in range(q):
                lo = 0 if window is None else max(0, i - window + 1)
                best, best_j = -1.0, None
                for j in range(lo, i + 1):
                    s = float(pattern[bi, hi, i, j] * u[bi, hi, j].norm())
                    if s > best:
                        best, best_j = s, j
                w[bi, hi, i] = best_j
    return w


def brute_counts(model, cache, *, queries="all", prefix=None, windows=None):
    """counts [L, H, 3] and offsets {(l, h, k): n} from the brute winners."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    counts = np.zeros((L, H, 3))
    offs: dict = {}
    for l in range(L):
        w = brute_winners(model, cache, l, None if windows is None else windows[l])
        n = w.shape[-1] if prefix is None else prefix
        qs = [n - 1] if queries == "final" else range(1, n)
        for bi in range(w.shape[0]):
            for hi in range(H):
                for i in qs:
                    kind = 0 if w[bi, hi, i] == 0 else (1 if w[bi, hi, i] == i else 2)
                    counts[l, hi, kind] += 1
                    if kind == 2:
                        key = (l, hi, i - int(w[bi, hi, i]))
                        offs[key] = offs.get(key, 0) + 1
    return counts, offs


def _offsets_dict(total):
    return {(l, h, k): int(total[l, h, k]) for l, h, k in zip(*np.nonzero(total.numpy()))}


@pytest.mark.parametrize("queries", ["all", "final"])
def test_modes_and_prefixes_match_naive_loop(tiny, queries):
    model, tokens, cache = tiny
    a = taxonomy.TaxonomyAnalysis.for_model(model, queries=queries, prefix_lengths=(4, 8, 64))
    a.update(model, cache, tokens)
    counts, offs = brute_counts(model, cache, queries=queries)
    np.testing.assert_array_equal(a.counts.total.numpy(), counts)
    assert _offsets_dict(a.offsets.total) == offs
    for p_idx, p in enumerate((4, 8)):
        c, _ = brute_counts(model, cache, queries=queries, prefix=p)
        np.testing.assert_array_equal(a.prefix_counts.total[p_idx].numpy(), c)
    bl = a.result().by_length()
    assert bl.prefix_length.tolist() == [4, 8]  # 64 > the 12-token windows: skipped
    assert bl.n_windows.tolist() == [tokens.shape[0]] * 2
    assert a.prefix_windows.total[2] == 0


@pytest.mark.bridge_only  # the tiny Gemma 3 exists only as a TransformerBridge
def test_sliding_window_layer_uses_the_visible_set():
    """Tiny Gemma 3: layer 0 is local (W = 16), layer 1 global; 40-token windows."""
    from geolens.adapter import sliding_window

    model = make_tiny("gemma")
    windows = [sliding_window(model, l) for l in range(model.cfg.n_layers)]
    if windows[0] is None:
        pytest.skip("this TransformerLens build does not expose the sliding window of the tiny Gemma")
    assert windows == [16, None]
    tokens = tiny_tokens(model, length=40)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    a = taxonomy.TaxonomyAnalysis.for_model(model)
    a.update(model, cache, tokens)
    counts, offs = brute_counts(model, cache, windows=windows)
    np.testing.assert_array_equal(a.counts.total.numpy(), counts)
    assert _offsets_dict(a.offsets.total) == offs
    assert max(k for (l, _h, k) in offs if l == 0) <= 15  # no winner outside the window
    res = a.result()
    t = res.table
    # queries 16..39 of both windows cannot see the sink in layer 0
    assert (t[t.layer == 0].n_out_of_window == 2 * 24).all() and (t[t.layer == 1].n_out_of_window == 0).all()
    # the sink alignment of layer 0 averages only queries 1..15
    pattern, v, _ = reference.raw_tensors(model, cache, 0)
    for h in range(model.cfg.n_heads):
        cs = []
        for bi in range(tokens.shape[0]):
            for i in range(1, 16):
                o = sum(pattern[bi, h, i, j] * v[bi, j, h] for j in range(i + 1))
                cs.append(float(o @ v[bi, 0, h] / (o.norm() * v[bi, 0, h].norm())))
        assert t[(t.layer == 0) & (t["head"] == h)].mean_sink_alignment.item() == pytest.approx(np.mean(cs), abs=1e-5)


def test_offsets_stream_merge_and_round_trip(tiny_gqa):
    model, _, _ = tiny_gqa
    short = tiny_tokens(model, length=8)
    long = tiny_tokens(model, ("hello world", "zz top"), length=12)
    whole = taxonomy.TaxonomyAnalysis.for_model(model, prefix_lengths=(4, 12))
    run_corpus(model, short, [whole], progress=False)
    run_corpus(model, long, [whole], progress=False)
    a = taxonomy.TaxonomyAnalysis.for_model(model, prefix_lengths=(4, 12))
    b = taxonomy.TaxonomyAnalysis.for_model(model, prefix_lengths=(4, 12))
    run_corpus(model, long, [a], progress=False)  # wider offset histogram first
    run_corpus(model, short, [b], progress=False)
    a.merge(b)
    np.testing.assert_array_equal(a.offsets.total.numpy(), whole.offsets.total.numpy())
    np.testing.assert_array_equal(a.prefix_counts.total.numpy(), whole.prefix_counts.total.numpy())
    assert a.prefix_windows.total.tolist() == [4.0, 2.0]
    c = taxonomy.TaxonomyAnalysis.for_model(model, prefix_lengths=(4, 12)).load_state_dict(a.state_dict())
    pd_a, pd_c = a.result().table, c.result().table
    assert pd_a.equals(pd_c)
    with pytest.raises(ValueError, match="different settings|other constructor arguments"):
        a.merge(taxonomy.TaxonomyAnalysis.for_model(model, queries="final", prefix_lengths=(4, 12)))


def test_bad_taxonomy_settings():
    with pytest.raises(ValueError, match="queries must be one of 'all' \\(every query ≥ 1\\), 'final'"):
        taxonomy.TaxonomyAnalysis(1, 1, queries="last")
    with pytest.raises(ValueError, match="prefix_lengths"):
        taxonomy.TaxonomyAnalysis(1, 1, prefix_lengths=(1, 8))
    with pytest.raises(ValueError, match="do not add up"):
        taxonomy.taxonomy_from_counts(torch.tensor([[[1.0, 1, 2]]]), offsets=torch.tensor([[[0.0, 1]]]))
