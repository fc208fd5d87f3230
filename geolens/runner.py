"""Drive :class:`geolens.streaming.CorpusAnalysis` objects over a corpus, batch by batch.

Only the hooks the analyses need are cached (``names_filter``), and each batch's cache is
dropped before the next forward pass, so peak memory does not grow with the corpus size.
"""

from __future__ import annotations

from typing import Sequence

import torch
from tqdm.auto import tqdm

from geolens.data import batches
from geolens.streaming import CorpusAnalysis


def run_corpus(
    model,
    tokens: torch.Tensor,
    analyses: Sequence[CorpusAnalysis],
    *,
    batch_size: int = 8,
    progress: bool = True,
    desc: str = "corpus",
) -> Sequence[CorpusAnalysis]:
    """Run ``model`` over ``tokens`` ``[n, seq]`` in batches and update every analysis."""
    wanted = frozenset(name for a in analyses for name in a.hook_names(model))
    n_batches = (tokens.shape[0] + batch_size - 1) // batch_size
    device = next(model.parameters()).device
    for batch in tqdm(batches(tokens, batch_size), total=n_batches, desc=desc, disable=not progress):
        batch = batch.to(device)
        with torch.no_grad():
            _, cache = model.run_with_cache(batch, names_filter=lambda n: n in wanted)
        for a in analyses:
            a.update(model, cache, batch)
        del cache
    return analyses
