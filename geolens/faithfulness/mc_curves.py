"""Multiple choice under protocol 1's masking-curve masks (docs/method.md §3 downstream task;
superseded by the pre-registered multiple choice of :mod:`geolens.faithfulness.multiple_choice`).

Each (question, choice) sequence BOS + prompt + " " + choice gets its own metric scores and masks
under a :class:`~geolens.faithfulness.MaskingConfig` (:func:`geolens.faithfulness.metric_scores`,
:func:`~geolens.faithfulness.curve_masks`: every masked layer at once, the top-k fraction of each
ranking unit), and all masks of one sequence run batched
(:func:`geolens.interventions.masking.masked_token_nll`), scoring only the choice tokens.
:func:`mc_under_masks_per_question` gives one row per (question, condition) with the columns of
:func:`geolens.multiple_choice.score_questions`; :func:`mc_conditions` the accuracy and mean
log p(correct) per condition, :func:`mc_pairs` the paired verdicts of the metric pairs, as the
language-modelling curves'; :func:`questions_in_blocks` runs a long set block by block, saved as
it goes and resumable. Questions and their scoring are :mod:`geolens.multiple_choice`'s.

The published run (``docs/faithfulness/protocol1/smollm2-135m-mc``) was made by ``geolens
faithfulness --mc-task``, an option since removed: multiple choice runs with ``geolens mc``, and
``geolens faithfulness --replot`` still rewrites such a folder's tables from its
``mc_questions.csv``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from geolens.checkpoint import atomic_write_bytes, plain_json
from geolens.faithfulness.masks import curve_masks, metric_scores
from geolens.faithfulness.preregistered import write_table
from geolens.faithfulness.protocol import (
    DIRECTIONS,
    PAIRS,
    MaskingConfig,
    faithfulness_sign,
    same_ranking_by_construction,
    verdict,
)
from geolens.interventions.masking import masked_token_nll, tail_nll
from geolens.multiple_choice import Question, choice_tokens, mc_summary, question_row
from geolens.resume import ResumeRefused as ResumeError
from geolens.stats import bootstrap_indices, mean_ci


def choice_loglik(model, tokens: torch.Tensor, n_choice: int) -> float:
    """log p(choice | prompt) = −Σ NLL of the last ``n_choice`` tokens of ``tokens`` ``[1, pos]``."""
    with torch.no_grad():
        logits = model(tokens, return_type="logits")
    return -float(tail_nll(logits[:, -1 - n_choice : -1], tokens).sum())


def mc_under_masks_per_question(
    model,
    questions: Sequence[Question],
    protocol: MaskingConfig,
    metrics: Sequence[str],
    *,
    normalize: str = "sum",
    seed: int = 0,
    chunk_size: int = 18,
    progress: bool = True,
    first_question: int = 0,
    qids: Sequence[int] | None = None,
) -> pd.DataFrame:
    """One row per (question, condition): the :func:`~geolens.multiple_choice.score_questions`
    columns plus ``metric, direction, fraction`` (``metric="clean"``, ``direction="none"`` for the
    unmasked model).

    ``first_question`` (the index of ``questions[0]`` in the whole set) and ``qids`` (each
    question's index within its task) let a long set run in blocks with the same random-metric
    seeds and question ids as one call.

    Each (question, choice) sequence gets its own metric scores and masks under ``protocol``
    (:func:`geolens.faithfulness.metric_scores`, :func:`~geolens.faithfulness.curve_masks`); its
    choice tokens are scored under every mask (:func:`~geolens.interventions.masking.masked_token_nll`).
    """
    if normalize not in ("sum", "mean"):
        raise ValueError(f"normalize must be 'sum' or 'mean', got {normalize!r}")
    layers = protocol.resolved_layers(model)
    n_k, n_d = len(protocol.fractions), len(DIRECTIONS)
    n_heads = model.cfg.n_heads
    out, seen = [], {}
    for qi, q in enumerate(tqdm(questions, desc="multiple choice", disable=not progress), start=first_question):
        qid = seen.get(q.task, 0) if qids is None else int(qids[qi - first_question])
        seen[q.task] = qid + 1
        rows = choice_tokens(model, q)
        lengths = [n for _, n in rows]
        clean_ll, masked_ll = [], []
        for ci, (tokens, n) in enumerate(rows):
            clean_ll.append(choice_loglik(model, tokens, n))
            scores = metric_scores(model, tokens, protocol, metrics, seed=seed + 1000 * qi + ci)
            masks = torch.cat(
                [curve_masks(scores[m], protocol).expand(-1, -1, n_heads, -1, -1) for m in metrics], dim=1
            )
            nll = masked_token_nll(model, tokens, masks, layers, chunk_size=chunk_size, n_scored=n)
            masked_ll.append(-nll.to(torch.float64).sum(-1).reshape(len(metrics), n_d, n_k))
        out.append(
            dict(metric="clean", direction="none", fraction=0.0, **question_row(q, qid, clean_ll, lengths, normalize))
        )
        ll = torch.stack(masked_ll, dim=-1)  # [metric, direction, k, choice]
        for mi, m in enumerate(metrics):
            for di, d in enumerate(DIRECTIONS):
                for ki, k in enumerate(protocol.fractions):
                    row = question_row(q, qid, ll[mi, di, ki].tolist(), lengths, normalize)
                    out.append(dict(metric=m, direction=d, fraction=float(k), **row))
    return pd.DataFrame(out)


def mc_conditions(per_question: pd.DataFrame, *, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Accuracy and mean log p(correct) [95% CI over questions] per (metric, direction, fraction)
    of :func:`mc_under_masks_per_question` rows (all tasks together)."""
    rows = []
    for (m, d, k), g in per_question.groupby(["metric", "direction", "fraction"], sort=False):
        sm = mc_summary(g.assign(task="all"), n_boot=n_boot, seed=seed).iloc[0]
        rows.append(
            dict(
                metric=m,
                direction=d,
                fraction=float(k),
                accuracy=float(sm.accuracy),
                n_questions=int(sm.n_questions),
                accuracy_lo=float(sm.accuracy_lo),
                accuracy_hi=float(sm.accuracy_hi),
                logprob_correct=float(sm.logprob_correct),
                logprob_correct_lo=float(sm.logprob_correct_lo),
                logprob_correct_hi=float(sm.logprob_correct_hi),
            )
        )
    return pd.DataFrame(rows)


def mc_pairs(
    per_question: pd.DataFrame,
    pairs: Sequence[tuple[str, str]] = PAIRS,
    *,
    n_boot: int = 2000,
    seed: int = 0,
    protocol: dict | None = None,
) -> pd.DataFrame:
    """Paired verdicts of multiple choice under masks, as the language-modelling ones.

    For every (a, b) of ``pairs`` whose metrics both ran, each direction and fraction k: the mean
    over questions of sign · (log p_b(correct) − log p_a(correct)), signed by
    :func:`~geolens.faithfulness.faithfulness_sign` so that + means b is more faithful (removing
    b's top-k lowers the correct answer's log-prob more, or keeping b's top-k keeps more of it),
    its 95% percentile CI over the same question resamples (``n_boot``), the paired accuracy
    difference with its CI, and the :func:`~geolens.faithfulness.verdict`. The range check: the
    random ranking's mean change of log p(correct) at the largest k under comprehensiveness
    (``random_delta_logprob`` [lo, hi]); when its CI contains 0 the masks do not move the answer
    and every verdict is ``no range``. With the masks' ``protocol``, a pair that masks identically
    by construction (:func:`~geolens.faithfulness.same_ranking_by_construction`) is ``not testable``.
    """
    identical = (
        {frozenset(("value_weighted", "output_normalized"))}
        if protocol and same_ranking_by_construction(protocol)
        else set()
    )
    key = ["task", "qid"]
    clean = per_question[per_question.metric == "clean"].set_index(key)
    n_q = len(clean)
    idx = bootstrap_indices(n_q, n_boot, seed)  # the same question resamples for every pair and k
    order = clean.index

    def column(metric, direction, k, col="logprob_correct"):
        g = per_question[
            (per_question.metric == metric)
            & (per_question.direction == direction)
            & np.isclose(per_question.fraction, k)
        ]
        return g.set_index(key).reindex(order)[col].astype(float).to_numpy()

    def ci_of(x):
        m, lo, hi = mean_ci(x, indices=idx)
        return float(m), float(lo), float(hi)

    ran = set(per_question.metric)
    fractions = sorted(set(per_question.fraction[per_question.metric != "clean"]))
    has_range, rand = True, (float("nan"),) * 3
    if "random" in ran and fractions:
        rand = ci_of(
            column("random", "comprehensiveness", fractions[-1]) - clean["logprob_correct"].astype(float).to_numpy()
        )
        has_range = not (rand[1] <= 0 <= rand[2])
    rows = []
    for a, b in pairs:
        if a not in ran or b not in ran:
            continue
        for d in DIRECTIONS:
            sign = faithfulness_sign(d, "delta_logprob")
            for k in fractions:
                diff, lo, hi = ci_of(sign * (column(b, d, k) - column(a, d, k)))
                acc = ci_of(np.sign(sign) * (column(b, d, k, "correct") - column(a, d, k, "correct")))
                rows.append(
                    dict(
                        a=a,
                        b=b,
                        direction=d,
                        fraction=float(k),
                        quantity="logprob_correct",
                        diff=diff,
                        ci_low=lo,
                        ci_high=hi,
                        verdict=verdict(lo, hi, has_range, n_q, testable=frozenset((a, b)) not in identical),
                        accuracy_diff=acc[0],
                        accuracy_diff_lo=acc[1],
                        accuracy_diff_hi=acc[2],
                        n_questions=n_q,
                        n_boot=n_boot,
                        random_delta_logprob=rand[0],
                        random_delta_logprob_lo=rand[1],
                        random_delta_logprob_hi=rand[2],
                    )
                )
    return pd.DataFrame(rows)


def questions_in_blocks(
    run_block,
    model,
    questions,
    protocol,
    metrics,
    out_dir,
    *,
    task: str,
    seed: int,
    chunk_size: int,
    block: int,
    resume: bool,
    progress=print,
) -> pd.DataFrame:
    """Multiple choice under masks in blocks of ``block`` questions: ``run_block(model, questions,
    protocol, metrics, seed=, chunk_size=, first_question=, qids=)`` (as
    :func:`mc_under_masks_per_question`) for each block, whose rows are
    appended to ``mc_questions.csv`` in ``out_dir`` as they land; ``mc_progress.json`` records the
    task, the question count, the protocol, the metrics and the seed. With ``resume`` the questions
    already saved under the same record are kept and the rest run (:class:`~geolens.resume.ResumeRefused` when
    the record differs). Each file is written atomically. Returns the rows of every question."""
    out = Path(out_dir)
    seen: dict[str, int] = {}
    qids = []
    for q in questions:
        qids.append(seen.get(q.task, 0))
        seen[q.task] = qids[-1] + 1
    path, info_path = out / "mc_questions.csv", out / "mc_progress.json"
    info = dict(
        task=task, n_questions=len(questions), protocol=protocol.to_dict(model), metrics=list(metrics), seed=seed
    )
    done = pd.DataFrame()
    if resume and path.exists() and info_path.exists():
        if json.loads(info_path.read_text()) != plain_json(info):
            raise ResumeError(
                f"--resume: {out}/mc_questions.csv was made with other tasks, metrics or protocol; use a new --out"
            )
        done = pd.read_csv(path)
    atomic_write_bytes(info_path, json.dumps(info, indent=2).encode())
    n_done = done[done.metric == "clean"].shape[0] if len(done) else 0
    if n_done:
        progress(f"multiple choice: resuming after {n_done} questions already in {path}")
    parts = [done] if len(done) else []
    for start in range(n_done, len(questions), max(1, int(block))):
        stop = min(start + max(1, int(block)), len(questions))
        part = run_block(
            model,
            questions[start:stop],
            protocol,
            metrics,
            seed=seed,
            chunk_size=chunk_size,
            first_question=start,
            qids=qids[start:stop],
        )
        parts.append(part)
        write_table(pd.concat(parts, ignore_index=True), path)
        progress(f"  {stop} / {len(questions)} questions (saved)")
    return pd.concat(parts, ignore_index=True)
