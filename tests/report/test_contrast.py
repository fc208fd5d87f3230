"""The attention-vs-contribution statistics of the report (geolens.report.contrast) against loops,
streamed over batches, merged and round-tripped through their state; bad sample shapes refused."""

from __future__ import annotations

import pytest
import reference
import torch

from geolens.report import (
    ContributionContrast,
    contrast_samples,
)
from geolens.runner import run_corpus


def _naive_contrast(model, cache):
    """Per (layer, head): lists of the four measures for every (sequence, query ≥ 1), by loops."""
    out = {}
    for l in range(model.cfg.n_layers):
        pattern, _, _ = reference.raw_tensors(model, cache, l)
        c = reference.contributions(model, cache, l, "intra")
        b, h, n, _ = pattern.shape
        for hi in range(h):
            rows = {"sink_attention": [], "sink_contribution": [], "top1_agreement": [], "negative_share": []}
            for bi in range(b):
                for i in range(1, n):
                    a_row, c_row = pattern[bi, hi, i, : i + 1].tolist(), c[bi, hi, i, : i + 1].tolist()
                    best_a = max(range(i + 1), key=lambda j: (a_row[j], -j))
                    best_c = max(range(i + 1), key=lambda j: (c_row[j], -j))
                    rows["sink_attention"].append(a_row[0])
                    rows["sink_contribution"].append(c_row[0])
                    rows["top1_agreement"].append(float(best_a == best_c))
                    rows["negative_share"].append(sum(v < 0 for v in c_row) / (i + 1))
            out[l, hi] = rows
    return out


def test_contrast_matches_loops_and_streams_over_batches(tiny):
    model, tokens, cache = tiny
    naive = _naive_contrast(model, cache)
    whole = ContributionContrast.for_model(model)
    run_corpus(model, tokens, [whole], batch_size=1, progress=False)  # two batches of one sequence
    frame = whole.per_head()
    for (l, h), rows in naive.items():
        got = frame[(frame["layer"] == l) & (frame["head"] == h)].iloc[0]
        assert got["n_queries"] == len(rows["sink_attention"])
        for name, values in rows.items():
            # top-1 ties between float32 and float64 values are not an issue on random models
            assert got[name] == pytest.approx(sum(values) / len(values), abs=2e-5), (l, h, name)
    overall = whole.overall()
    assert overall["sink_attention"] == pytest.approx(frame["sink_attention"].mean())
    assert 0 <= overall["negative_share"] < 1


def test_contrast_merge_and_state_round_trip(tiny_gqa):
    model, tokens, _ = tiny_gqa
    a, b, whole = (ContributionContrast.for_model(model) for _ in range(3))
    run_corpus(model, tokens[:1], [a], progress=False)
    run_corpus(model, tokens[1:], [b], progress=False)
    run_corpus(model, tokens, [whole], progress=False)
    a.merge(b)
    for name in ("sink_attention", "top1_agreement"):
        torch.testing.assert_close(getattr(a, name).mean, getattr(whole, name).mean)
    restored = ContributionContrast.for_model(model).load_state_dict(a.state_dict())
    torch.testing.assert_close(restored.negative_share.m2, a.negative_share.m2)
    with pytest.raises(ValueError, match="cannot merge"):
        a.merge(ContributionContrast(3, 4))
    with pytest.raises(ValueError, match="no batch"):
        ContributionContrast(2, 4).overall()


def test_contrast_samples_rejects_bad_shapes():
    with pytest.raises(ValueError, match="square"):
        contrast_samples(torch.zeros(1, 1, 2, 3), torch.zeros(1, 1, 2, 3))
    with pytest.raises(ValueError, match="two positions"):
        contrast_samples(torch.ones(1, 1, 1, 1), torch.ones(1, 1, 1, 1))
