"""Constructed inputs shared by tests of several files: a faithfulness result with known metric
gaps, a small text corpus on disk, three multiple-choice questions and per-question masked
multiple-choice rows with a known metric difference."""

from __future__ import annotations

import numpy as np
import pandas as pd

from geolens.faithfulness import FaithfulnessResult
from geolens.multiple_choice import Question

QUESTIONS = [
    Question("the cat sat on the", ("mat", "dog", "sky"), 0),
    Question("a dog ran far", ("away", "cat"), 0),
    Question("one two three", ("four", "ten", "a"), 1),
]


def synthetic_result(gaps, *, n=40, random_shift=1.0, seed=0, fractions=(0.1, 0.5, 0.9)):
    """Per-document NLLs: metric m's comprehensiveness NLL = clean + gaps[m]·k + noise."""
    rng = np.random.default_rng(seed)
    clean = rng.normal(3.0, 0.3, size=n)
    rows = []
    for m, g in gaps.items():
        for d in ("comprehensiveness", "sufficiency"):
            for k in fractions:
                shift = (g if d == "comprehensiveness" else -g + 1.0) * k
                noise = rng.normal(0, 0.02, size=n)
                for s in range(n):
                    rows.append(
                        dict(
                            sequence=s, metric=m, direction=d, fraction=k, nll=clean[s] + shift + noise[s], n_removed=1
                        )
                    )
    protocol = dict(
        layers=[0, 1],
        masking_scope="all",
        ranking="query",
        allow_sink=True,
        allow_current=True,
        mode="inter",
        fractions=tuple(fractions),
        skip_prefix=8,
    )
    cl = pd.DataFrame(dict(sequence=range(n), nll=clean, n_scored=100, sink_nll=clean + 0.5))
    return FaithfulnessResult(protocol=protocol, per_sequence=pd.DataFrame(rows), clean=cl, n_boot=1000)


def write_corpus(path, seed):
    """A small local text corpus (blank-line separated documents; works without gensim)."""
    rng = np.random.default_rng(seed)
    words = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "far", "away", "news", "today"]
    path.write_text("\n\n".join(" ".join(rng.choice(words, 40)) + "." for _ in range(6)), encoding="utf-8")
    return str(path)


def mc_per_question(n=40, seed=0, random_shift=-0.5):
    """Synthetic mc_under_masks_per_question rows: metric b lowers log p(correct) by 1 more than a
    under comprehensiveness at every k; under sufficiency they are equal."""
    rng = np.random.default_rng(seed)
    clean = rng.normal(-5, 1, n)
    rows = [
        dict(task="t", qid=q, metric="clean", direction="none", fraction=0.0, logprob_correct=clean[q], correct=1)
        for q in range(n)
    ]
    for k in (0.1, 0.5):
        noise = rng.normal(0, 0.3, n)
        for metric, comp in (("raw_attention", -1.0), ("contribution", -2.0), ("random", random_shift)):
            for q in range(n):
                rows.append(
                    dict(
                        task="t",
                        qid=q,
                        metric=metric,
                        direction="comprehensiveness",
                        fraction=k,
                        logprob_correct=clean[q] + comp * k + (noise[q] if metric != "random" else 0.0),
                        correct=int(metric != "contribution"),
                    )
                )
                rows.append(
                    dict(
                        task="t",
                        qid=q,
                        metric=metric,
                        direction="sufficiency",
                        fraction=k,
                        logprob_correct=clean[q] - 0.1 + noise[q],
                        correct=1,
                    )
                )
    df = pd.DataFrame(rows)
    return df.assign(chance=1 / 3, logprob_correct_norm=df.logprob_correct, n_choices=3)
