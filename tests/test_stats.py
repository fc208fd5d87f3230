"""geolens.stats (issue #25 item 2) against naive float64 references with explicit loops, and the
migrated call sites against the formulas they used before (the published CIs must not move)."""

from __future__ import annotations

import doctest
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from geolens import stats
from geolens.stats import (
    bootstrap_indices,
    bootstrap_pvalue,
    cluster_bootstrap_indices,
    holm,
    mean_ci,
    paired_bootstrap,
    percentile_ci,
    resample_means,
    verdict,
)

PACKAGE = Path(__file__).resolve().parents[1] / "geolens"


# ---------------------------------------------------------------------------------------------
# naive references (explicit loops, float64)


def naive_draws(n: int, n_boot: int, seed) -> list[list[int]]:
    """One index at a time from the same generator stream as Generator.integers(0, n, (n_boot, n))."""
    idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))  # the generator call itself
    return [[int(idx[b, i]) for i in range(n)] for b in range(n_boot)]


def naive_quantile(values, p: float) -> float:
    """Hyndman & Fan type 7 (numpy's "linear"): h = (B − 1)·p, interpolate x_(⌊h⌋) … x_(⌊h⌋+1)."""
    x = sorted(float(v) for v in values)
    h = (len(x) - 1) * p
    lo = math.floor(h)
    hi = min(lo + 1, len(x) - 1)
    return x[lo] + (h - lo) * (x[hi] - x[lo])


def naive_mean(values) -> float:
    total, count = 0.0, 0
    for v in values:
        if not math.isnan(v):
            total += float(v)
            count += 1
    return total / count if count else math.nan


def naive_cluster_resamples(groups, n_boot: int, seed) -> list[list[int]]:
    """Clusters in sorted label order, drawn with replacement; every row of a drawn cluster, in order."""
    labels = sorted(set(groups))
    draws = np.random.default_rng(seed).integers(0, len(labels), size=(n_boot, len(labels)))
    out = []
    for b in range(n_boot):
        rows = []
        for c in draws[b]:
            rows += [i for i, g in enumerate(groups) if g == labels[int(c)]]
        out.append(rows)
    return out


# ---------------------------------------------------------------------------------------------
# resampling


def test_bootstrap_indices_is_the_generator_draw():
    idx = bootstrap_indices(7, 50, seed=3)
    assert idx.shape == (50, 7) and idx.dtype.kind == "i" and idx.min() >= 0 and idx.max() <= 6
    assert idx.tolist() == naive_draws(7, 50, 3)
    # a Generator is advanced: two draws from one stream are the two halves of one bigger draw
    g = np.random.default_rng(5)
    first, second = bootstrap_indices(4, 10, g), bootstrap_indices(4, 10, g)
    ref = np.random.default_rng(5)
    assert np.array_equal(first, ref.integers(0, 4, size=(10, 4))) and np.array_equal(
        second, ref.integers(0, 4, size=(10, 4))
    )
    assert not np.array_equal(first, second)
    # every unit is drawn with probability 1/n: frequencies over many draws
    freq = np.bincount(bootstrap_indices(5, 4000, seed=0).ravel(), minlength=5) / 20000
    assert np.allclose(freq, 0.2, atol=0.01)
    with pytest.raises(ValueError, match="at least one unit"):
        bootstrap_indices(0, 10)
    with pytest.raises(ValueError, match="n_boot"):
        bootstrap_indices(3, 0)


def test_cluster_bootstrap_resamples_whole_documents():
    # 6 documents with 1–4 windows each, rows interleaved (a document's rows need not be adjacent)
    sizes = {"d0": 1, "d1": 2, "d2": 3, "d3": 4, "d4": 2, "d5": 3}
    groups = [d for d, k in sizes.items() for _ in range(k)]
    groups = [groups[i] for i in np.random.default_rng(0).permutation(len(groups))]
    rows_of = {d: [i for i, g in enumerate(groups) if g == d] for d in sizes}
    res = cluster_bootstrap_indices(groups, 3000, seed=1)
    assert len(res) == 3000
    distinct = []
    for r in res:
        counts = np.bincount(r, minlength=len(groups))
        n_draws = 0
        for d, rows in rows_of.items():
            c = counts[rows]
            assert (c == c[0]).all()  # all of the document's rows or none, each as often as the document was drawn
            n_draws += int(c[0])
        assert n_draws == len(sizes)  # G documents drawn per resample
        distinct.append(sum(counts[rows[0]] > 0 for rows in rows_of.values()))
    # drawn with replacement: E[distinct documents] = G (1 − (1 − 1/G)^G) (≈ 3.99 for G = 6), some repeats
    G = len(sizes)
    expected = G * (1 - (1 - 1 / G) ** G)
    assert abs(np.mean(distinct) - expected) < 0.05 and min(distinct) < G and max(distinct) == G
    # against the naive loop: the same rows in the same order
    assert [r.tolist() for r in cluster_bootstrap_indices(groups, 40, seed=2)] == naive_cluster_resamples(groups, 40, 2)
    # one row per cluster, labels 0 … n − 1 in row order: the ordinary bootstrap
    one = cluster_bootstrap_indices(list(range(9)), 25, seed=4)
    assert np.array_equal(np.stack(one), bootstrap_indices(9, 25, seed=4))
    with pytest.raises(ValueError, match="non-empty 1-D"):
        cluster_bootstrap_indices([], 5)


def test_resample_means_against_loops():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(11, 3))
    x[2, 1] = np.nan
    idx = bootstrap_indices(11, 30, seed=1)
    got = resample_means(x, idx)
    got_nan = resample_means(x, idx, omit_nan=True)
    for b in range(30):
        for k in range(3):
            vals = [x[i, k] for i in idx[b]]
            ref = sum(vals) / len(vals)
            if any(np.isnan(vals)):
                assert np.isnan(got[b, k])
            else:
                assert got[b, k] == pytest.approx(ref, rel=1e-12)
            assert got_nan[b, k] == pytest.approx(naive_mean(vals), rel=1e-12)
    # cluster resamples (a list of index arrays) give the mean over all rows of the drawn clusters
    groups = [0, 0, 1, 2, 2, 2, 3, 4, 4, 5, 5]
    res = cluster_bootstrap_indices(groups, 20, seed=3)
    m = resample_means(x[:, 0], res)
    assert np.allclose(m, [naive_mean([x[i, 0] for i in r]) for r in res], rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# intervals


def test_percentile_ci_is_numpys_percentile_and_the_type_7_quantile():
    samples = np.random.default_rng(0).normal(size=(1000, 4))
    lo, hi = percentile_ci(samples)
    # numpy's percentile on the same draws, as the sink controls and token selection took it
    ref_lo, ref_hi = np.percentile(samples, [(1 - 0.95) / 2 * 100, (1 + 0.95) / 2 * 100], axis=0)
    assert np.array_equal(lo, ref_lo) and np.array_equal(hi, ref_hi)
    # ... and as multiple choice took it (2.5 exactly): equal up to the last bits of the probability
    np.testing.assert_allclose(np.stack([lo, hi]), np.percentile(samples, [2.5, 97.5], axis=0), rtol=0, atol=1e-12)
    for level in (0.5, 0.9, 0.95, 0.99):
        a = (1 - level) / 2
        lo, hi = percentile_ci(samples[:, 0], level)
        assert lo == pytest.approx(naive_quantile(samples[:, 0], a), rel=1e-12)
        assert hi == pytest.approx(naive_quantile(samples[:, 0], 1 - a), rel=1e-12)
    # NaN samples: propagated, or left out on request
    s = samples[:, 0].copy()
    s[[3, 70]] = np.nan
    assert all(np.isnan(v) for v in percentile_ci(s))
    lo, hi = percentile_ci(s, omit_nan=True)
    kept = [v for v in s if not np.isnan(v)]
    assert lo == pytest.approx(naive_quantile(kept, 0.025), rel=1e-12) and hi == pytest.approx(
        naive_quantile(kept, 0.975), rel=1e-12
    )
    for bad in (0.0, 1.0, 95):
        with pytest.raises(ValueError, match="level"):
            percentile_ci(samples, bad)


def test_mean_ci_against_explicit_loops():
    x = np.random.default_rng(1).gamma(2.0, size=40)
    m, lo, hi = mean_ci(x, n_boot=300, seed=7, level=0.9)
    boots = [naive_mean([x[i] for i in row]) for row in naive_draws(40, 300, 7)]
    assert m == pytest.approx(naive_mean(x), rel=1e-12)
    assert lo == pytest.approx(naive_quantile(boots, 0.05), rel=1e-12) and hi == pytest.approx(
        naive_quantile(boots, 0.95), rel=1e-12
    )
    # columns: each column's own interval from the same resamples
    X = np.stack([x, 2 * x + 1], 1)
    M, LO, HI = mean_ci(X, n_boot=300, seed=7, level=0.9)
    assert np.allclose([M[0], LO[0], HI[0]], [m, lo, hi], rtol=1e-12)
    assert np.allclose([M[1], LO[1], HI[1]], [2 * m + 1, 2 * lo + 1, 2 * hi + 1], rtol=1e-12)
    # NaN rows left out of every mean
    y = x.copy()
    y[[0, 5]] = np.nan
    m, lo, hi = mean_ci(y, n_boot=200, seed=2, omit_nan=True)
    boots = [naive_mean([y[i] for i in row]) for row in naive_draws(40, 200, 2)]
    assert m == pytest.approx(naive_mean(y), rel=1e-12)
    assert lo == pytest.approx(naive_quantile(boots, 0.025), rel=1e-12) and hi == pytest.approx(
        naive_quantile(boots, 0.975), rel=1e-12
    )
    # constant data: a zero-width interval at the value
    assert [float(v) for v in mean_ci(np.full(9, 0.25), n_boot=50)] == [0.25, 0.25, 0.25]
    with pytest.raises(ValueError, match="at least one unit"):
        mean_ci(np.array([]))


def test_mean_ci_with_groups_resamples_documents():
    # 8 documents, 3 windows each; windows of a document share a document effect
    rng = np.random.default_rng(3)
    doc_effect = rng.normal(size=8)
    groups = np.repeat(np.arange(8), 3)
    x = doc_effect[groups] + 0.1 * rng.normal(size=24)
    m, lo, hi = mean_ci(x, n_boot=400, seed=1, groups=groups)
    boots = [naive_mean([x[i] for i in rows]) for rows in naive_cluster_resamples(list(groups), 400, 1)]
    assert m == pytest.approx(naive_mean(x), rel=1e-12)
    assert lo == pytest.approx(naive_quantile(boots, 0.025), rel=1e-12) and hi == pytest.approx(
        naive_quantile(boots, 0.975), rel=1e-12
    )
    # windows of one document are not independent: the document bootstrap is wider than the window one
    _, wlo, whi = mean_ci(x, n_boot=400, seed=1)
    assert hi - lo > 1.3 * (whi - wlo)
    with pytest.raises(ValueError, match="label every row"):
        mean_ci(x, groups=groups[:-1])


def test_paired_bootstrap_difference_and_ratio_against_loops():
    rng = np.random.default_rng(4)
    a = rng.gamma(3.0, size=30)
    b = a * 1.2 + rng.normal(scale=0.3, size=30)
    rows = naive_draws(30, 250, 9)
    d, lo, hi = paired_bootstrap(a, b, n_boot=250, seed=9)
    boots = [naive_mean([b[i] - a[i] for i in r]) for r in rows]
    assert d == pytest.approx(naive_mean(b) - naive_mean(a), rel=1e-12)
    assert lo == pytest.approx(naive_quantile(boots, 0.025), rel=1e-12) and hi == pytest.approx(
        naive_quantile(boots, 0.975), rel=1e-12
    )
    r, lo, hi = paired_bootstrap(a, b, statistic="ratio", n_boot=250, seed=9)
    boots = [naive_mean([b[i] for i in s]) / naive_mean([a[i] for i in s]) for s in rows]
    assert r == pytest.approx(naive_mean(b) / naive_mean(a), rel=1e-12)
    assert lo == pytest.approx(naive_quantile(boots, 0.025), rel=1e-12) and hi == pytest.approx(
        naive_quantile(boots, 0.975), rel=1e-12
    )
    # paired: a constant shift has a zero-width interval, however noisy a is
    assert [round(float(v), 12) for v in paired_bootstrap(a, a + 0.5, n_boot=100)] == [0.5, 0.5, 0.5]
    # omit_nan: the rows where both are present
    a2, b2 = a.copy(), b.copy()
    a2[1], b2[4] = np.nan, np.nan
    r, lo, hi = paired_bootstrap(a2, b2, statistic="ratio", n_boot=250, seed=9, omit_nan=True)
    keep = [i for i in range(30) if i not in (1, 4)]
    assert r == pytest.approx(naive_mean(b[keep]) / naive_mean(a[keep]), rel=1e-12)
    with pytest.raises(ValueError, match="same shape"):
        paired_bootstrap(a, b[:-1])
    with pytest.raises(ValueError, match="statistic"):
        paired_bootstrap(a, b, statistic="median")


# ---------------------------------------------------------------------------------------------
# decisions


def naive_holm(p):
    m = len(p)
    order = sorted(range(m), key=lambda i: p[i])
    out = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out


def test_holm_textbook_example_and_properties():
    assert np.allclose(holm([0.01, 0.04, 0.03, 0.005]), [0.03, 0.06, 0.06, 0.02], rtol=0, atol=1e-15)
    p = np.random.default_rng(0).uniform(0, 0.3, size=25)
    adj = holm(p)
    assert np.allclose(adj, naive_holm(list(p)), rtol=0, atol=1e-15)
    order = np.argsort(p)
    assert (np.diff(adj[order]) >= 0).all() and (adj >= p).all() and (adj <= 1).all()  # monotone, ≥ p, capped
    assert holm([0.5, 0.9]).tolist() == [1.0, 1.0] and holm([0.02]).tolist() == [0.02] and holm([]).size == 0
    assert holm([0.01, 0.01, 0.2]).tolist() == pytest.approx([0.03, 0.03, 0.2])  # ties
    for bad in ([0.1, np.nan], [-0.1], [1.5], [[0.1]]):
        with pytest.raises(ValueError):
            holm(bad)


def test_bootstrap_pvalue_formula_and_agreement_with_the_interval():
    rng = np.random.default_rng(1)
    s = rng.normal(0.3, 1.0, size=999)
    below, above = sum(v <= 0 for v in s), sum(v >= 0 for v in s)
    ref = min(1.0, 2 * min((1 + below) / 1000, (1 + above) / 1000))
    assert bootstrap_pvalue(s) == pytest.approx(ref, rel=1e-15)
    assert bootstrap_pvalue(s, null=0.3) == pytest.approx(1.0, abs=0.1)
    assert bootstrap_pvalue(np.full(99, 0.0)) == 1.0 and bootstrap_pvalue(np.full(99, 2.0)) == pytest.approx(0.02)
    # p < 0.05 exactly when the 95% percentile interval excludes 0 (away from the boundary)
    for mu in (-1.0, -0.5, 0.0, 0.1, 0.5, 1.0, 3.0):
        x = rng.normal(mu, 1.0, size=1999)
        lo, hi = percentile_ci(x)
        if lo > 0.01 or hi < -0.01 or (lo < -0.01 and hi > 0.01):
            assert (bootstrap_pvalue(x) < 0.05) == (lo > 0 or hi < 0)
    with_nan = np.concatenate([s, [np.nan]])
    assert bootstrap_pvalue(with_nan) == bootstrap_pvalue(s)
    with pytest.raises(ValueError, match="no bootstrap samples"):
        bootstrap_pvalue([np.nan])


def test_verdict_sign_rules_and_not_testable():
    assert verdict(0.1, 0.5) == "holds" and verdict(1e-12, 1.0) == "holds"
    assert verdict(-0.5, -0.1) == "reversed" and verdict(-1.0, -1e-12) == "reversed"
    assert (
        verdict(-0.1, 0.1) == "tie"
        and verdict(0.0, 0.3) == "tie"
        and verdict(-0.3, 0.0) == "tie"
        and verdict(0.0, 0.0) == "tie"
    )
    # identical conditions by construction: never a tie, whatever the interval says
    for lo, hi in ((0.0, 0.0), (-0.1, 0.1), (0.2, 0.3), (np.nan, np.nan)):
        assert verdict(lo, hi, testable=False) == "not testable"
    assert set(stats.VERDICTS) == {"holds", "reversed", "tie", "not testable"}
    with pytest.raises(ValueError, match="confidence interval"):
        verdict(np.nan, 0.1)
    with pytest.raises(ValueError, match="ci_low"):
        verdict(0.2, 0.1)
    # the faithfulness verdict is this one, after its own range and sample-size checks
    from geolens.faithfulness import verdict as faithfulness_verdict

    assert (
        faithfulness_verdict(0.1, 0.2) == "holds" and faithfulness_verdict(-0.1, 0.2, testable=False) == "not testable"
    )
    assert faithfulness_verdict(0.1, 0.2, False) == "no range"
    assert (
        faithfulness_verdict(0.1, 0.2, False, testable=False) == "not testable"
    )  # by construction, whatever the range


def test_docstring_examples_run():
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    tests = finder.find(stats, globs=dict(vars(stats)))
    assert sum(len(t.examples) for t in tests) >= 10
    for t in tests:
        runner.run(t)
    assert runner.summarize(verbose=False).failed == 0


def test_no_other_module_draws_bootstrap_indices():
    """One place draws resamples: no other bootstrap function and no other index draw in geolens."""
    defs, draws = [], []
    allowed_draws = {  # random positions or replacement tokens, not resamples
        ("sinks/controls.py", "positions = rng.integers(1, T, size=W)"),
        ("faithfulness/ground_truth.py", "layer = int(rng.integers(0, n_layers))"),
        ("faithfulness/ground_truth.py", "out.append((layer, int(rng.integers(lo, hi + 1))))"),
        ("flow/erasure.py", "return torch.from_numpy(rng.choice(p.size, size=n_pos, p=p / p.sum())).to(torch.long)"),
        (
            "flow/induction.py",
            "ids = torch.from_numpy(np.random.default_rng(seed).choice(candidates, size=n_tokens, replace=False)).to(torch.long)",
        ),
        ("hf/check.py", "return torch.randint(0, cfg.d_vocab, (batch, n), generator=generator)"),  # check tokens
        ("families/convert.py", "t = torch.randint(4, 64, (n_rows, n_pos), generator=g)"),  # check tokens
        ("hf/streamed.py", ">>> tokens = torch.randint(4, 64, (6, 10), generator=torch.Generator().manual_seed(0))"),
    }
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel == "stats.py":
            continue
        for line in path.read_text().splitlines():
            if re.search(r"def [a-z_]*boot", line) and not (rel == "models.py" and "def _boot(" in line):
                defs.append((rel, line.strip()))
            if (
                re.search(r"\.integers\(|randint\(|\.choice\(|multinomial\(", line)
                and (rel, line.strip()) not in allowed_draws
            ):
                draws.append((rel, line.strip()))
    assert not defs, defs
    assert not draws, draws


# ---------------------------------------------------------------------------------------------
# the migrated call sites reproduce the formulas they used before (published CIs unchanged)


def test_faithfulness_auc_ci_equals_the_former_formula_bit_for_bit():
    from geolens.faithfulness import area_under_curve, auc_ci

    fr = [0.01, 0.1, 0.5, 0.9]
    y = np.random.default_rng(0).normal(size=(23, 4)) + [0.0, 1.0, 2.0, 3.0]
    # the former formula
    rng = np.random.default_rng(5)
    idx = rng.integers(0, 23, size=(400, 23))
    boot = area_under_curve(fr, y[idx].mean(1))
    a = (1.0 - 0.95) / 2.0
    old = (float(area_under_curve(fr, y.mean(0))), float(np.quantile(boot, a)), float(np.quantile(boot, 1 - a)))
    assert auc_ci(fr, y, n_boot=400, seed=5) == old


def _faithfulness_result(n_docs=12, seed=0):
    from geolens.faithfulness import FaithfulnessResult

    g = np.random.default_rng(seed)
    fr = (0.1, 0.5, 0.9)
    clean = pd.DataFrame(
        dict(
            sequence=np.arange(n_docs),
            nll=3 + 0.2 * g.normal(size=n_docs),
            n_scored=g.integers(20, 40, size=n_docs),
            sink_nll=4 + g.normal(size=n_docs) * 0.1,
        )
    )
    rows = []
    for m, shift in (("raw_attention", 0.5), ("contribution", 1.0), ("random", 0.3)):
        for d in ("comprehensiveness", "sufficiency"):
            for k in fr:
                for s in range(n_docs):
                    nll = float(clean.nll[s] + shift * k * (1 if d[0] == "c" else 0.2) + 0.05 * g.normal())
                    rows.append(dict(sequence=s, metric=m, direction=d, fraction=k, nll=nll, n_removed=1))
    protocol = dict(
        layers=[0],
        masking_scope="all",
        ranking="query",
        allow_sink=True,
        allow_current=True,
        mode="inter",
        fractions=fr,
        skip_prefix=0,
    )
    return FaithfulnessResult(protocol=protocol, per_sequence=pd.DataFrame(rows), clean=clean, n_boot=300, seed=4)


def test_faithfulness_result_cis_are_the_former_formula_bit_for_bit():
    from geolens.faithfulness import area_under_curve, faithfulness_sign

    res = _faithfulness_result()
    # the former formula: row 0 the data, rows 1… default_rng(seed).integers(0, n, (n_boot, n)),
    # document-weighted mean NLLs, np.quantile at (1 − 0.95)/2 and 1 − that
    clean = res.clean.sort_values("sequence")
    w, c, n = clean.n_scored.to_numpy(float), clean.nll.to_numpy(float), len(clean)
    idx = np.concatenate([np.arange(n)[None], np.random.default_rng(4).integers(0, n, size=(300, n))])
    cn = (w * c)[idx].sum(1) / w[idx].sum(1)
    a = (1.0 - 0.95) / 2.0

    def curve(metric, direction):
        y = res.per_sequence[(res.per_sequence.metric == metric) & (res.per_sequence.direction == direction)]
        y = y.pivot(index="sequence", columns="fraction", values="nll").to_numpy(float)
        nll = np.einsum("bn,bnk->bk", w[idx], y[idx]) / w[idx].sum(1)[:, None]
        return -(nll - cn[:, None])  # Δ log-prob

    auc = res.auc().set_index(["metric", "direction", "quantity"])
    pairs = res.pairs().set_index(["a", "b", "direction", "quantity"])
    for d in ("comprehensiveness", "sufficiency"):
        x = area_under_curve(res.protocol["fractions"], curve("contribution", d))
        row = auc.loc[("contribution", d, "delta_logprob")]
        assert (row.auc, row.ci_low, row.ci_high) == (
            float(x[0]),
            float(np.quantile(x[1:], a)),
            float(np.quantile(x[1:], 1 - a)),
        )
        diff = faithfulness_sign(d, "delta_logprob") * (
            x - area_under_curve(res.protocol["fractions"], curve("raw_attention", d))
        )
        row = pairs.loc[("raw_attention", "contribution", d, "delta_logprob")]
        assert (row.auc_diff, row.ci_low, row.ci_high) == (
            float(diff[0]),
            float(np.quantile(diff[1:], a)),
            float(np.quantile(diff[1:], 1 - a)),
        )
        lo, hi = float(np.quantile(diff[1:], a)), float(np.quantile(diff[1:], 1 - a))
        assert row.verdict == ("holds" if lo > 0 else "reversed" if hi < 0 else "tie")


def _questions(n=60, seed=0, p=0.5):
    g = np.random.default_rng(seed)
    tasks = np.where(np.arange(n) < n // 3, "t1", "t2")
    qid = np.concatenate([np.arange((tasks == "t1").sum()), np.arange((tasks == "t2").sum())])
    lp = g.normal(-2, 1, size=n)
    return pd.DataFrame(
        dict(
            task=tasks,
            qid=qid,
            correct=g.uniform(size=n) < p,
            logprob_correct=lp,
            logprob_correct_norm=lp / 3,
            chance=1 / 3,
        )
    )


def _old_boot_mean(x, idx):
    x = np.asarray(x, dtype=np.float64)
    b = x[idx].mean(1)
    return float(x.mean()), float(np.percentile(b, 2.5)), float(np.percentile(b, 97.5))


def test_mc_summary_and_paired_difference_are_the_former_formula():
    """Same draws; the lower bound's probability is now (1 − 0.95)/2 = 0.025000000000000022 instead
    of 0.025, so lower bounds agree to ~1e-15 and everything else is bit-identical."""
    from geolens.multiple_choice import mc_summary, paired_difference

    q = _questions()
    got = mc_summary(q, n_boot=500, seed=3)
    rng = np.random.default_rng(3)
    groups = [(t, g) for t, g in q.groupby("task", sort=False)] + [("all", q)]
    for (task, g), (_, row) in zip(groups, got.iterrows()):
        idx = rng.integers(0, len(g), size=(500, len(g)))
        assert row.task == task
        for col, name in (
            ("correct", "accuracy"),
            ("logprob_correct", "logprob_correct"),
            ("logprob_correct_norm", "logprob_correct_norm"),
        ):
            m, lo, hi = _old_boot_mean(g[col].astype(float), idx)
            assert (
                row[name] == m and row[f"{name}_hi"] == hi and row[f"{name}_lo"] == pytest.approx(lo, rel=0, abs=1e-12)
            )
    b = _questions(seed=1, p=0.7)
    got = paired_difference(q, b, n_boot=400, seed=2)
    rng = np.random.default_rng(2)
    m = q.merge(b, on=["task", "qid"], suffixes=("_a", "_b"))
    for (task, g), (_, row) in zip([(t, g) for t, g in m.groupby("task", sort=False)] + [("all", m)], got.iterrows()):
        idx = rng.integers(0, len(g), size=(400, len(g)))
        d = g["correct_b"].astype(float).to_numpy() - g["correct_a"].astype(float).to_numpy()
        mean, lo, hi = _old_boot_mean(d, idx)
        assert (
            row.accuracy_diff == mean
            and row.accuracy_diff_hi == hi
            and row.accuracy_diff_lo == pytest.approx(lo, rel=0, abs=1e-12)
        )
        assert row.verdict == ("b higher" if lo > 0 else "a higher" if hi < 0 else "tie")


def test_mc_pairs_is_the_former_formula():
    from geolens.faithfulness.mc_curves import mc_pairs

    g = np.random.default_rng(0)
    rows = []
    for qn in range(30):
        base = g.normal(-2)
        rows.append(dict(task="t", qid=qn, metric="clean", direction="", fraction=0.0, logprob_correct=base, correct=1))
        for m, s in (("raw_attention", 0.2), ("contribution", 0.6), ("random", 0.1)):
            for d in ("comprehensiveness", "sufficiency"):
                for k in (0.1, 0.5):
                    lp = base - s * k + 0.1 * g.normal()
                    rows.append(
                        dict(
                            task="t",
                            qid=qn,
                            metric=m,
                            direction=d,
                            fraction=k,
                            logprob_correct=lp,
                            correct=int(g.uniform() < 0.5),
                        )
                    )
    per_q = pd.DataFrame(rows)
    got = mc_pairs(per_q, pairs=[("raw_attention", "contribution")], n_boot=300, seed=6)
    idx = np.random.default_rng(6).integers(0, 30, size=(300, 30))

    def col(metric, d, k, c="logprob_correct"):
        x = per_q[(per_q.metric == metric) & (per_q.direction == d) & np.isclose(per_q.fraction, k)]
        return x.sort_values("qid")[c].astype(float).to_numpy()

    for r in got.itertuples():
        sign = 1.0 if r.direction == "comprehensiveness" else -1.0
        x = -sign * (col("contribution", r.direction, r.fraction) - col("raw_attention", r.direction, r.fraction))
        old = (float(x.mean()), float(np.quantile(x[idx].mean(1), 0.025)), float(np.quantile(x[idx].mean(1), 0.975)))
        assert r.diff == old[0] and r.ci_high == old[2] and r.ci_low == pytest.approx(old[1], rel=0, abs=1e-12)


def test_document_means_ci_is_the_former_document_bootstrap_bit_for_bit():
    from geolens.selection.baseline import document_means_ci

    x = np.random.default_rng(2).normal(size=(25, 3))
    x[[1, 7], 0] = np.nan
    x[3] = np.nan
    for ci in (0.95, 0.9):
        # the former formula
        idx = np.random.default_rng(8).integers(0, 25, size=(700, 25))
        boots = np.nanmean(x[idx], axis=1)
        lo, hi = np.nanpercentile(boots, [(1 - ci) / 2 * 100, (1 + ci) / 2 * 100], axis=0)
        m, l, h = document_means_ci(x, n_boot=700, seed=8, ci=ci)
        assert np.array_equal(m, np.nanmean(x, axis=0)) and np.array_equal(l, lo) and np.array_equal(h, hi)
    # groups: windows of one document resampled together
    groups = np.repeat(np.arange(5), 5)
    m, l, h = document_means_ci(x[:, 1], n_boot=300, seed=1, groups=groups)
    boots = [naive_mean([x[i, 1] for i in rows]) for rows in naive_cluster_resamples(list(groups), 300, 1)]
    assert l[0] == pytest.approx(naive_quantile(boots, 0.025), rel=1e-12) and h[0] == pytest.approx(
        naive_quantile(boots, 0.975), rel=1e-12
    )


def test_sink_controls_cis_are_the_former_formula_bit_for_bit(monkeypatch):
    """The bootstrap part of sink_controls on synthetic per-window values (the model passes faked)."""
    import geolens.sinks.controls as controls
    from geolens.interventions.sink_values import SinkEditSpec

    W, L, T, n_boot, seed = 9, 3, 8, 400, 2
    specs = [
        SinkEditSpec("scale", 0.0),
        SinkEditSpec("corpus_mean"),
        SinkEditSpec("rotate", seed=0),
        SinkEditSpec("rotate", seed=1),
    ]
    scopes = ["all", "0", "2"]
    g = np.random.default_rng(0)
    nll = 3 + g.normal(size=(W, len(scopes), len(specs))) * 0.3
    norm = 5 + g.normal(size=(W, len(scopes), len(specs)))
    cos = g.uniform(0.2, 0.8, size=(W, len(scopes), len(specs)))
    clean_nll, clean_norm, clean_cos = (
        3 + 0.1 * g.normal(size=W),
        5 + g.normal(size=(W, L)),
        g.uniform(0.2, 0.8, size=(W, L)),
    )

    def edited(model, window, specs_, scope_layers, corpus_means=None, position=None):
        w = int(window[0, 0])
        s = scopes.index("all" if len(scope_layers) > 1 else str(scope_layers[0]))
        return nll[w, s], norm[w, s], cos[w, s]

    class Model:
        class cfg:
            n_layers = L

    monkeypatch.setattr(controls, "corpus_pass", lambda model, tokens, **k: ({}, clean_nll, clean_norm, clean_cos))
    monkeypatch.setattr(controls, "edited_window", edited)
    monkeypatch.setattr(controls, "n_kv_heads", lambda m: 1)
    monkeypatch.setattr(controls, "model_mode", lambda m: "fake")
    tokens = torch.arange(W)[:, None].expand(W, T).clone()
    res = controls.sink_controls(Model(), tokens, conditions=specs, layers=[0, 2], n_boot=n_boot, seed=seed)

    # the former formula
    def pct(x):
        return np.nanpercentile(x, [(1 - 0.95) / 2 * 100, (1 + 0.95) / 2 * 100], axis=0)

    boot = np.random.default_rng(seed + 1).integers(0, W, size=(n_boot, W))
    cn_s = np.stack([clean_norm.mean(1), clean_norm[:, 0], clean_norm[:, 2]], 1)
    cc_s = np.stack([clean_cos.mean(1), clean_cos[:, 0], clean_cos[:, 2]], 1)
    dppl_b = np.exp(nll[boot].mean(1)) - np.exp(clean_nll[boot].mean(1))[:, None, None]
    labels = [s.label for s in specs]
    series = {lab: (dppl_b[:, :, i], norm[:, :, i], cos[:, :, i]) for i, lab in enumerate(labels)}
    series[controls.ROTATE_POOLED] = (dppl_b[:, :, 2:].mean(2), norm[:, :, 2:].mean(2), cos[:, :, 2:].mean(2))
    cond = res.conditions.set_index(["edit", "scope"])
    for lab, (db, nw, cw) in series.items():
        nb, cb = nw[boot].mean(1), cw[boot].mean(1)
        expect = {
            "delta_ppl": pct(db),
            "out_norm": pct(nb),
            "out_norm_ratio": pct(nb / cn_s[boot].mean(1)),
            "cos_cone": pct(cb),
            "delta_cos": pct(cb - cc_s[boot].mean(1)),
        }
        for s, scope in enumerate(scopes):
            row = cond.loc[(lab, scope)]
            for name, (lo, hi) in expect.items():
                assert (row[f"{name}_lo"], row[f"{name}_hi"]) == (lo[s], hi[s]), (lab, scope, name)
    pairs = res.pairs.set_index(["norm_edit", "control", "scope"])
    for ctrl in (controls.ROTATE_POOLED, "corpus_mean"):
        lo, hi = pct(series[labels[0]][0] - series[ctrl][0])
        for s, scope in enumerate(scopes):
            row = pairs.loc[(labels[0], ctrl, scope)]
            assert (row.diff_lo, row.diff_hi) == (lo[s], hi[s])
            assert row.verdict == ("norm edit larger" if lo[s] > 0 else "control larger" if hi[s] < 0 else "tie")


# ---------------------------------------------------------------------------------------------
# holm_family: verdicts decided by intervals within Holm's step-down (PROTOCOL.md §4)


def test_holm_family_levels_stop_and_not_testable():
    from geolens.stats import holm_family

    rng = np.random.default_rng(1)
    strong = rng.normal(1.0, 0.1, 4000)  # every sample > 0: p = 2/(B+1)
    weak = rng.normal(0.05, 0.1, 4000)  # p ≈ 0.6: undecided
    after = rng.normal(-1.0, 0.1, 4000)  # decided alone, but ranked after nothing undecided
    zero = np.zeros(4000)  # identical masks: not testable, out of the family
    tests = holm_family([1.0, 0.05, -1.0, 0.0], [strong, weak, after, zero], testable=[True, True, True, False])
    s, w, a, z = tests
    assert z.verdict == "not testable" and z.rank == 0 and np.isnan(z.p_adj)
    # m = 3 testable tests; strong and after tie at the smallest p and keep the input order
    assert (s.rank, a.rank, w.rank) == (1, 2, 3)
    assert (
        s.level == pytest.approx(1 - 0.05 / 3)
        and a.level == pytest.approx(1 - 0.05 / 2)
        and w.level == pytest.approx(0.95)
    )
    assert (s.verdict, a.verdict, w.verdict) == ("holds", "reversed", "tie")
    assert w.holm_stopped_at == 3 and s.holm_stopped_at == 0
    # Holm's adjusted p of the family of 3 (not 4)
    assert s.p_adj == pytest.approx(min(1, 3 * 2 / 4001))
    for t in (s, a, w):  # every verdict agrees with its interval
        assert (t.verdict == "holds") == (t.ci_low > 0) and (t.verdict == "reversed") == (t.ci_high < 0)


def test_holm_family_stops_at_the_first_undecided_rank():
    from geolens.stats import holm_family

    rng = np.random.default_rng(2)
    # rank 1 (smallest p, ≈ 0.1) is undecided at its level 1 − 0.05/2; rank 2 would be decided on
    # its own 95% interval only if it were alone, but the step-down stopped at rank 1
    first = np.concatenate([rng.normal(0.5, 0.2, 1900), -np.ones(100)])
    second = rng.normal(0.3, 0.1, 2000) * np.where(rng.random(2000) < 0.06, -1, 1)
    tests = holm_family([0.5, 0.3], [first, second])
    by_rank = sorted(tests, key=lambda t: t.rank)
    assert [t.verdict for t in by_rank] == ["tie", "tie"]
    assert [t.holm_stopped_at for t in by_rank] == [1, 1]
    assert by_rank[0].p < by_rank[1].p


def test_holm_family_refuses_bad_input():
    from geolens.stats import holm_family

    with pytest.raises(ValueError, match="estimates"):
        holm_family([0.1], [np.ones(10), np.ones(10)])
    with pytest.raises(ValueError, match="testable"):
        holm_family([0.1], [np.ones(10)], testable=[True, False])
