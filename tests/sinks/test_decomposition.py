"""Token-type decomposition (docs/method.md §4, geolens.sinks.decomposition) against naive float64
covariances, its identities and its exact merge."""

from __future__ import annotations

import math

import numpy as np
import pytest
import reference
import torch

from geolens.runner import run_corpus
from geolens.sinks import (
    TokenTypeDecomposition,
    token_type_decomposition,
)


def _naive_decomposition(model, cache, layer):
    """Per head and source type: (X, A, R, C) samples from explicit float64 factors."""
    pattern, _, _ = reference.raw_tensors(model, cache, layer)
    rel, cos = reference.factors(model, cache, layer, "intra")
    b, h, q, _ = pattern.shape
    samples = {(hh, t): [] for hh in range(h) for t in ("sink", "tail")}
    for bi in range(b):
        for hh in range(h):
            for i in range(1, q):
                for j in range(0, i + 1):
                    a, r, c = float(pattern[bi, hh, i, j]), float(rel[bi, hh, i, j]), float(cos[bi, hh, i, j])
                    if a <= 0 or r <= 0 or c == 0:
                        continue
                    A, R, C = math.log(a), math.log(r), math.log(abs(c))
                    samples[(hh, "sink" if j == 0 else "tail")].append((A + R + C, A, R, C))
    return samples


def test_decomposition_matches_naive_covariances(corpus):
    model, tokens, cache = corpus
    res = token_type_decomposition(model, tokens, batch_size=2)
    for layer in range(model.cfg.n_layers):
        samples = _naive_decomposition(model, cache, layer)
        for (h, source), rows in samples.items():
            x = np.array(rows)
            cov = np.cov(x.T, ddof=1)
            row = res.heads[(res.heads.layer == layer) & (res.heads["head"] == h) & (res.heads.source == source)].iloc[
                0
            ]
            assert row.n == len(rows)
            assert row.var_log_c == pytest.approx(cov[0, 0], rel=1e-6)
            for f, name in enumerate(("attention", "relnorm", "cosine"), start=1):
                assert row[f"share_{name}"] == pytest.approx(cov[0, f] / cov[0, 0], rel=1e-5, abs=1e-8)
                assert row[f"frac_var_{name}"] == pytest.approx(cov[f, f] / cov[0, 0], rel=1e-5, abs=1e-8)
                assert row[f"mean_log_{name}"] == pytest.approx(x[:, f].mean(), rel=1e-6, abs=1e-8)
            assert row.frac_2cov_attention_cosine == pytest.approx(2 * cov[1, 3] / cov[0, 0], rel=1e-5, abs=1e-8)
        pooled = np.array([r for (h, s), rows in samples.items() if s == "tail" for r in rows])
        lrow = res.layers[(res.layers.layer == layer) & (res.layers.source == "tail")].iloc[0]
        assert lrow.var_log_c == pytest.approx(np.var(pooled[:, 0], ddof=1), rel=1e-6)


def test_decomposition_identities(corpus):
    model, tokens, _ = corpus
    res = token_type_decomposition(model, tokens)
    for df in (res.heads, res.layers):
        shares = df[["share_attention", "share_relnorm", "share_cosine"]].sum(axis=1)
        np.testing.assert_allclose(shares, 1.0, atol=1e-8)
        fracs = df[[c for c in df.columns if c.startswith("frac_")]].sum(axis=1)
        np.testing.assert_allclose(fracs, 1.0, atol=1e-8)
    # in the tiny model every sample of a type is defined (no zero α, cos or norm): n is the count
    B, T = tokens.shape
    sink = res.heads[res.heads.source == "sink"]
    tail = res.heads[res.heads.source == "tail"]
    assert (sink.n == B * (T - 1)).all() and (tail.n == B * (T - 1) * T // 2).all()


def test_decomposition_accumulator_merges_exactly(corpus, whole_and_parts):
    model, tokens, _ = corpus
    whole, a, b = whole_and_parts(model, tokens, TokenTypeDecomposition, split=2, batch_size=2)
    a.merge(b)
    torch.testing.assert_close(whole.per_head.mean, a.per_head.mean)
    torch.testing.assert_close(whole.per_head.var, a.per_head.var)


def test_decomposition_max_sequences_uses_only_the_first_windows(corpus):
    model, tokens, _ = corpus
    capped = TokenTypeDecomposition(model.cfg.n_layers, model.cfg.n_heads, max_sequences=3)
    run_corpus(model, tokens.repeat(2, 1), [capped], batch_size=2, progress=False)  # cut inside batch 2
    ref = TokenTypeDecomposition(model.cfg.n_layers, model.cfg.n_heads)
    run_corpus(model, tokens, [ref], batch_size=2, progress=False)
    assert capped.n_sequences == 3
    torch.testing.assert_close(capped.per_head.count, ref.per_head.count)
    # the float32 forward pass depends slightly on the batch composition ([seq 3, seq 1] vs [seq 3])
    torch.testing.assert_close(capped.per_head.mean, ref.per_head.mean, rtol=1e-4, atol=1e-6)
