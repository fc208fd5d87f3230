"""The statistics of multiple choice under the pre-registered protocol (docs/faithfulness/PROTOCOL.md
§5): which tasks are above chance (:func:`eligibility`), the bootstrap stratified by task
(:func:`stratified_indices`) and the Holm family of metric pairs (:func:`pair_tests`). The run
itself is :mod:`geolens.faithfulness.multiple_choice`."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from geolens.multiple_choice import mc_summary
from geolens.stats import bootstrap_indices, holm_family, resample_means


def eligibility(per_question: pd.DataFrame, *, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Per task: ``task, n_questions, accuracy, ci_low, ci_high, chance, eligible``.

    accuracy and its 95% percentile CI come from :func:`geolens.multiple_choice.mc_summary`
    (bootstrap over the task's questions); chance is the mean of 1/#choices; ``eligible`` when
    ci_low > chance, the whole interval above chance.
    """
    s = mc_summary(per_question, n_boot=n_boot, seed=seed)
    tasks = list(dict.fromkeys(per_question.task))
    s = s[s.task.isin(tasks)].set_index("task").loc[tasks].reset_index()
    out = s[["task", "n_questions", "accuracy", "accuracy_lo", "accuracy_hi", "chance"]].rename(
        columns={"accuracy_lo": "ci_low", "accuracy_hi": "ci_high"}
    )
    return out.assign(eligible=out.ci_low > out.chance).reset_index(drop=True)


def stratified_indices(strata, n_boot: int, seed=0) -> np.ndarray:
    """``[n_boot, n]`` resamples drawn within strata: each resample takes, for every stratum s
    with n_s rows, n_s of its rows with replacement, placed at that stratum's positions, so each
    stratum keeps its row count. The draws are :func:`geolens.stats.bootstrap_indices` of one
    generator (``numpy.random.default_rng(seed)``), strata in order of first appearance.

    >>> idx = stratified_indices(["a", "a", "b"], 4, seed=0)
    >>> idx.shape, bool((idx[:, 2] == 2).all()), bool((idx[:, :2] < 2).all())
    ((4, 3), True, True)
    """
    strata = np.asarray(strata)
    if strata.ndim != 1 or strata.size < 1:
        raise ValueError(f"strata must label every row (a non-empty 1-D array), got shape {strata.shape}")
    rng = np.random.default_rng(seed)
    out = np.empty((int(n_boot), strata.size), dtype=np.int64)
    for s in dict.fromkeys(strata.tolist()):
        rows = np.flatnonzero(strata == s)
        out[:, rows] = rows[bootstrap_indices(rows.size, n_boot, rng)]
    return out


def pair_tests(
    drops: Mapping[str, np.ndarray],
    tasks: Sequence[str],
    pairs: Sequence[tuple[str, str]],
    *,
    identical: set | frozenset = frozenset(),
    n_boot: int = 2000,
    seed=0,
    alpha: float = 0.05,
) -> pd.DataFrame:
    """One Holm family of paired comparisons of the per-question margin drops.

    For (a, b): Δ = mean over questions of drop_b − drop_a (> 0: b more faithful); its bootstrap
    distribution on the same task-stratified resamples for every pair (:func:`stratified_indices`);
    :func:`geolens.stats.holm_family` gives p, p_adj, the interval at the pair's Holm level and
    the verdict. A pair in ``identical`` (masks identical in every condition) is ``not testable``
    and left out of the family. Columns: ``a, b, estimate, ci_low, ci_high, level, p, p_adj,
    rank, verdict, holm_stopped_at, rules_differ, identical_masks, n_questions, n_questions_by_task``.
    """
    tasks = np.asarray(tasks)
    idx = stratified_indices(tasks, n_boot, seed)
    estimates, samples, testable = [], [], []
    for a, b in pairs:
        d = np.asarray(drops[b], dtype=np.float64) - np.asarray(drops[a], dtype=np.float64)
        if d.shape != tasks.shape:
            raise ValueError(f"pair {a} → {b}: {d.size} drops for {tasks.size} questions")
        estimates.append(float(d.mean()))
        samples.append(resample_means(d, idx))
        testable.append((a, b) not in identical and (b, a) not in identical)
    by_task = {str(t): int((tasks == t).sum()) for t in dict.fromkeys(tasks.tolist())}
    rows = []
    for (a, b), t, ok in zip(pairs, holm_family(estimates, samples, testable=testable, alpha=alpha), testable):
        rows.append(
            dict(
                a=a,
                b=b,
                **t._asdict(),
                identical_masks=not ok,
                n_questions=int(tasks.size),
                n_questions_by_task=by_task,
            )
        )
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# A whole run, resumable
