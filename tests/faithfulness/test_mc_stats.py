"""The statistics of protocol 2's multiple-choice endpoint (geolens.faithfulness.mc_stats): eligibility
on constructed accuracies, a stratified bootstrap that keeps each task's count, and the pair tests
as one Holm family against a hand computation."""

from __future__ import annotations

import pytest


def test_eligibility_on_constructed_accuracies():
    """A task is eligible exactly when its accuracy CI lies above chance (mean 1/#choices)."""
    import numpy as np
    import pandas as pd

    from geolens.faithfulness.multiple_choice import eligibility
    from geolens.multiple_choice import mc_summary

    rng = np.random.default_rng(0)
    rows = []
    for task, n, p, n_choices in (
        ("clear", 120, 0.9, 2),
        ("chance", 150, 0.5, 2),
        ("four_way", 80, 0.3, 4),
        ("mixed", 60, 0.8, None),
    ):
        for i in range(n):
            k = n_choices or (2 if i % 2 else 5)
            rows.append(
                dict(
                    task=task,
                    qid=i,
                    correct=bool(rng.random() < p),
                    chance=1 / k,
                    logprob_correct=-1.0,
                    logprob_correct_norm=-0.5,
                )
            )
    per_q = pd.DataFrame(rows)
    e = eligibility(per_q, n_boot=2000, seed=0).set_index("task")
    s = mc_summary(per_q, n_boot=2000, seed=0).set_index("task")
    assert list(e.index) == ["clear", "chance", "four_way", "mixed"]
    for task in e.index:
        g = per_q[per_q.task == task]
        assert e.loc[task, "n_questions"] == len(g) and e.loc[task, "accuracy"] == pytest.approx(g.correct.mean())
        assert e.loc[task, "chance"] == pytest.approx(np.mean(g.chance))
        assert (e.loc[task, "ci_low"], e.loc[task, "ci_high"]) == (
            s.loc[task, "accuracy_lo"],
            s.loc[task, "accuracy_hi"],
        )
        assert e.loc[task, "eligible"] == (e.loc[task, "ci_low"] > e.loc[task, "chance"])
    assert e.loc["clear", "eligible"] and not e.loc["chance", "eligible"] and e.loc["mixed", "eligible"]
    assert e.loc["mixed", "chance"] == pytest.approx((1 / 2 + 1 / 5) / 2)


def test_stratified_bootstrap_keeps_each_task_count():
    import numpy as np

    from geolens.faithfulness.multiple_choice import stratified_indices
    from geolens.stats import bootstrap_indices

    tasks = np.array(["a"] * 5 + ["b"] * 3 + ["a"] * 2 + ["c"])
    idx = stratified_indices(tasks, 500, seed=3)
    assert idx.shape == (500, 11)
    for row in idx:
        for t in "abc":
            assert (tasks[row] == t).sum() == (tasks == t).sum()  # each task keeps its question count
        assert (tasks[row] == tasks).all()  # a task's positions hold its own questions
    # the draws are bootstrap_indices of one generator, tasks in order of first appearance
    rng = np.random.default_rng(3)
    a, b, c = (np.flatnonzero(tasks == t) for t in "abc")
    want = np.empty_like(idx)
    for rows in (a, b, c):
        want[:, rows] = rows[bootstrap_indices(len(rows), 500, rng)]
    np.testing.assert_array_equal(idx, want)
    assert len({tuple(r) for r in idx[:, a]}) > 400  # genuinely resampled


def test_pair_tests_one_holm_family_against_a_hand_computation():
    import numpy as np

    from geolens.faithfulness.multiple_choice import pair_tests, stratified_indices
    from geolens.stats import bootstrap_pvalue, holm

    rng = np.random.default_rng(1)
    tasks = np.array(["x"] * 40 + ["y"] * 25)
    base = rng.normal(0.2, 0.3, tasks.size)
    drops = {
        "a": base,
        "b": base + 0.5 + rng.normal(0, 0.1, tasks.size),
        "c": base + rng.normal(0, 0.3, tasks.size),
        "d": base - 0.4 + rng.normal(0, 0.1, tasks.size),
        "e": base.copy(),
    }
    pairs = [("a", "b"), ("a", "c"), ("a", "d"), ("a", "e")]
    got = pair_tests(drops, tasks, pairs, identical={("a", "e")}, n_boot=1000, seed=0).set_index("b")
    assert list(got.verdict) == ["holds", "tie", "reversed", "not testable"]
    idx = stratified_indices(tasks, 1000, seed=0)
    p = []
    for b in "bcd":
        d = drops[b] - drops["a"]
        samples = np.array([sum(d[j] for j in row) / len(row) for row in idx])  # loops: the stratified means
        assert got.loc[b, "estimate"] == pytest.approx(d.mean())
        p.append(bootstrap_pvalue(samples))
        assert got.loc[b, "p"] == pytest.approx(p[-1])
    np.testing.assert_allclose(got.loc[list("bcd"), "p_adj"], holm(p))
    assert got.loc["b", "ci_low"] > 0 and got.loc["d", "ci_high"] < 0
    assert got.loc["e", "identical_masks"] and np.isnan(got.loc["e", "p"])
    assert set(got.level.dropna()) <= {1 - 0.05 / 3, 1 - 0.05 / 2, 1 - 0.05}
    assert (got.n_questions == 65).all() and got.loc["b", "n_questions_by_task"] == {"x": 40, "y": 25}
