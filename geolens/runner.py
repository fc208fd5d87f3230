"""Drive :class:`geolens.streaming.CorpusAnalysis` objects over a corpus, batch by batch.

Only the hooks the analyses need are cached (``names_filter``), and each batch's cache is
dropped before the next forward pass, so peak memory does not grow with the corpus size
(``benchmarks/corpus_scale.py`` measures it).

Resumable runs: with ``checkpoint=path`` the analyses' states are written atomically to ``path``
every ``checkpoint_every`` batches (and after the last one, see :mod:`geolens.checkpoint`). Run
the same call again after an interrupt and it resumes at the saved batch index with the saved
states: the final numbers are identical to an uninterrupted run.

Data-parallel runs: :func:`geolens.distributed.run_corpus_distributed` gives each process a
contiguous shard of whole batches (:func:`shard_bounds`) and merges the states at the end.
"""

from __future__ import annotations

import os
import re
from typing import Sequence

import torch
from tqdm.auto import tqdm

from geolens.streaming import CorpusAnalysis


def n_batches(n_sequences: int, batch_size: int) -> int:
    """⌈n_sequences / batch_size⌉."""
    return (n_sequences + batch_size - 1) // batch_size


def shard_bounds(n_sequences: int, batch_size: int, rank: int, world_size: int) -> tuple[int, int]:
    """Sequence range ``[start, stop)`` of ``rank``'s shard: a contiguous block of whole batches.

    Batches are split as evenly as possible (the first ``n_batches % world_size`` ranks get one
    more). Because shards are made of whole batches, every rank runs exactly the batches a
    single process would run, so merged results equal single-process results up to the float64
    rounding of the merge.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    total = n_batches(n_sequences, batch_size)
    per, extra = divmod(total, world_size)
    first = rank * per + min(rank, extra)
    count = per + (1 if rank < extra else 0)
    return min(first * batch_size, n_sequences), min((first + count) * batch_size, n_sequences)


_BLOCK_HOOK = re.compile(r"^blocks\.(\d+)\.")


def stop_layer(model, hook_names) -> int | None:
    """The first layer no analysis reads, when all cached hooks are block hooks, else None.

    The runner discards the logits, so the forward pass can stop there
    (``run_with_cache(..., stop_at_layer=k)`` runs blocks ``0 … k−1``): an analysis of the
    first layers costs only those layers.
    """
    layers = []
    for name in hook_names:
        match = _BLOCK_HOOK.match(name)
        if match is None:
            return None
        layers.append(int(match.group(1)))
    if not layers:
        return None
    stop = max(layers) + 1
    return stop if stop < model.cfg.n_layers else None


def model_device(model) -> torch.device:
    """Where input ids go: the embedding's device (the first one under a ``device_map``)."""
    try:
        return model.embed.W_E.device
    except AttributeError:
        return next(model.parameters()).device


def as_token_tensor(rows) -> torch.Tensor:
    """A batch of token ids as an int64 tensor (numpy slices and memmaps are copied)."""
    if isinstance(rows, torch.Tensor):
        return rows
    import numpy as np

    return torch.from_numpy(np.array(rows, dtype=np.int64))


def _check_inputs(tokens, analyses, batch_size: int, checkpoint_every: int) -> None:
    if batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size}")
    if checkpoint_every < 1:
        raise ValueError(f"checkpoint_every must be a positive integer (batches), got {checkpoint_every}")
    if len(getattr(tokens, "shape", ())) != 2:
        raise ValueError(f"tokens must be [n_sequences, seq_len], got shape {tuple(getattr(tokens, 'shape', ()))}")
    for a in analyses:
        if not all(callable(getattr(a, m, None)) for m in ("hook_names", "update", "state_dict", "load_state_dict")):
            raise TypeError(f"{type(a).__name__} does not implement the CorpusAnalysis protocol (geolens.streaming)")


def run_corpus(
    model,
    tokens: torch.Tensor,
    analyses: Sequence[CorpusAnalysis],
    *,
    batch_size: int = 8,
    progress: bool = True,
    desc: str = "corpus",
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: int = 1,
    trusted_checkpoint: bool = False,
    shard: tuple[int, int] = (0, 1),
    stop_early: bool = True,
) -> Sequence[CorpusAnalysis]:
    """Run ``model`` over ``tokens`` ``[n, seq]`` in batches and update every analysis.

    Args:
        model: a TransformerBridge or HookedTransformer.
        tokens: ``[n_sequences, seq_len]`` token ids (a tensor, or any array that slices, e.g. a
            numpy memmap for corpora larger than memory).
        analyses: :class:`CorpusAnalysis` objects, updated in place and returned.
        batch_size: sequences per forward pass.
        checkpoint: file to save the states to every ``checkpoint_every`` batches; if it exists
            the run resumes from it (its fingerprint must match this run's tokens, batch size,
            model and analyses with their constructor arguments). Its folder must be writable:
            this is checked before the first batch.
        trusted_checkpoint: allow states that hold arbitrary Python objects (pickle).
        shard: ``(rank, world_size)``, recorded in the checkpoint fingerprint (set by
            :mod:`geolens.distributed`; ``tokens`` is then already the rank's shard).
        stop_early: stop each forward pass after the last layer whose hooks are read
            (:func:`stop_layer`); the cached values are the same.
    """
    from geolens import checkpoint as ckpt_io

    _check_inputs(tokens, analyses, batch_size, checkpoint_every)
    total = n_batches(int(tokens.shape[0]), batch_size)
    start = 0
    fingerprint = None
    if checkpoint is not None:
        ckpt_io.check_writable(checkpoint)  # a read-only folder fails now, not after the work
        fingerprint = ckpt_io.run_fingerprint(tokens, analyses, batch_size, shard, model=model)
        if os.path.exists(checkpoint):
            start = ckpt_io.restore(checkpoint, analyses, fingerprint, trusted=trusted_checkpoint)
    wanted = frozenset(name for a in analyses for name in a.hook_names(model))
    device = model_device(model)
    stop = stop_layer(model, wanted) if stop_early else None
    extra = {} if stop is None else {"stop_at_layer": stop}
    bar = tqdm(total=total, initial=start, desc=desc, disable=not progress)
    for index in range(start, total):
        batch = as_token_tensor(tokens[index * batch_size : (index + 1) * batch_size]).to(device)
        with torch.no_grad():
            _, cache = model.run_with_cache(batch, names_filter=lambda n: n in wanted, **extra)
        for a in analyses:
            a.update(model, cache, batch)
        del cache
        bar.update(1)
        done = index + 1
        if checkpoint is not None and (done % checkpoint_every == 0 or done == total):
            ckpt_io.save_checkpoint(checkpoint, analyses, done, fingerprint)
    bar.close()
    return analyses
