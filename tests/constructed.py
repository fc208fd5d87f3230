"""Constructed inputs shared by tests of several files: a faithfulness result with known metric
gaps, and a small text corpus on disk."""

from __future__ import annotations

import numpy as np
import pandas as pd

from geolens.faithfulness import FaithfulnessResult


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
