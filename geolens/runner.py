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

On the HF-native backend (a ``transformers`` model) the analyses run inside the forward, layer
by layer, when each of them can (:func:`geolens.hf.streamed.update_layerwise`): the run then
never holds every layer's pattern, only the one layer its forward has reached.
"""

from __future__ import annotations

import os
from typing import Sequence

import torch
from tqdm.auto import tqdm

from geolens import checkpoint as ckpt_io
from geolens.adapter import hook_layer
from geolens.data import as_token_tensor, n_batches, unpadded_groups
from geolens.streaming import CorpusAnalysis
from geolens.validation import check_attention_mask, check_context, check_token_dtype, check_tokens


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


def stop_layer(model, hook_names) -> int | None:
    """The first layer no analysis reads, when all cached hooks are block hooks, else None.

    The runner discards the logits, so the forward pass can stop there
    (``run_with_cache(..., stop_at_layer=k)`` runs blocks ``0 … k−1``): an analysis of the
    first layers costs only those layers.
    """
    layers = []
    for name in hook_names:
        layer = hook_layer(name)
        if layer is None:
            return None
        layers.append(layer)
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
    attention_mask: torch.Tensor | None = None,
) -> Sequence[CorpusAnalysis]:
    """Run ``model`` over ``tokens`` ``[n, seq]`` in batches and update every analysis.

    Args:
        model: a TransformerBridge or HookedTransformer, or a ``transformers`` causal LM (the
            HF-native backend, prepared here if it is not yet).
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
        attention_mask: ``[n_sequences, seq_len]``, 1 = real token (TransformerLens' convention),
            for padded token rows (left or right padding). Each row's padding is stripped and
            rows of equal real length in a batch run together, so every analysis sees only real
            tokens, each row's first real token is its sink, and results equal each prompt run
            alone. Without it, a batch that looks padded (rows starting or ending with different
            numbers of the tokenizer's pad id) is refused.

    Memory: each batch's forward caches only the hooks the analyses read, and the cache is
    dropped before the next batch. On TransformerLens that cache holds every layer the analyses
    read. On the HF-native backend a batch is streamed instead when every analysis can be:
    one forward runs while each analysis's ``update``, in a thread of its own that takes turns
    with the forward, reads the layers as they are computed
    (:func:`geolens.hf.streamed.update_layerwise`); a layer's pattern, v and z are dropped before
    the next layer runs, so the run holds one layer's entries whatever the depth (what an
    analysis keeps of the previous layer while it asks for the next is its own). An
    analysis can be streamed when its ``hook_names`` are all block hooks (``blocks.{l}.…``) and it
    declares ``layerwise`` (:class:`~geolens.streaming.CorpusAnalysis`, True by default: its
    ``update`` reads the layers in order). One that reads the logits or the unembedding input
    (only there once the forward has ended), or sets ``layerwise = False`` (it reads several
    layers at once), puts the whole run on the cached path, one forward serving every analysis as
    on TransformerLens. Both paths give the same numbers.

    >>> from geolens.sinks.norm_curve import NormCurve
    >>> from geolens.testing import tiny_bridge
    >>> model = tiny_bridge("gqa")
    >>> tokens = model.to_tokens(["a cat", "the dog sat"], padding_side="left")
    >>> mask = (tokens != model.tokenizer.pad_token_id).long()
    >>> [curve] = run_corpus(model, tokens, [NormCurve(model.cfg.n_layers, model.cfg.n_heads)], attention_mask=mask, progress=False)
    >>> int(curve.per_head.counts[0, 0].sum())  # queries 1… of each prompt: 5 + 11
    16
    """
    from geolens.hf.streamed import hf_native, layerwise, update_layerwise

    _check_inputs(tokens, analyses, batch_size, checkpoint_every)
    check_token_dtype(tokens)  # float ids are refused, never cut to integers
    if 0 in tuple(tokens.shape):
        raise ValueError(f"tokens is empty (shape {tuple(tokens.shape)}): give at least one token id per row")
    hf = hf_native(model)  # a transformers model, prepared for geolens now
    check_context(model, int(tokens.shape[-1]), name="a token window")
    if attention_mask is not None:
        attention_mask = check_attention_mask(as_token_tensor(attention_mask), *map(int, tokens.shape))
    total = n_batches(int(tokens.shape[0]), batch_size)
    start = 0
    fingerprint = None
    if checkpoint is not None:
        ckpt_io.check_writable(checkpoint)  # a read-only folder fails now, not after the work
        fingerprint = ckpt_io.run_fingerprint(tokens, analyses, batch_size, shard, model=model)
        writer = ckpt_io.writer_record(model)  # the weights fingerprint and the geolens version
        if os.path.exists(checkpoint):
            start, writer = ckpt_io.restore_checked(
                checkpoint, analyses, fingerprint, trusted=trusted_checkpoint, model=model
            )
    wanted = frozenset(name for a in analyses for name in a.hook_names(model))
    device = model_device(model)
    stop = stop_layer(model, wanted) if stop_early else None
    extra = {} if stop is None else {"stop_at_layer": stop}
    streamed = hf and all(layerwise(a, model) for a in analyses)
    bar = tqdm(
        total=total, initial=start, desc=desc, disable=not progress, miniters=1, mininterval=0
    )  # redrawn every batch
    for index in range(start, total):
        rows = slice(index * batch_size, (index + 1) * batch_size)
        batch = check_tokens(model, as_token_tensor(tokens[rows]))  # ids inside the vocabulary
        for group in unpadded_groups(model, batch, None if attention_mask is None else attention_mask[rows]):
            group = group.to(device)
            if streamed:
                update_layerwise(model, group, analyses, wanted, stop_at_layer=stop)
                continue
            with torch.no_grad():
                _, cache = model.run_with_cache(group, names_filter=lambda n: n in wanted, **extra)
            for a in analyses:
                a.update(model, cache, group)
            del cache
        bar.update(1)
        done = index + 1
        if checkpoint is not None and (done % checkpoint_every == 0 or done == total):
            ckpt_io.save_checkpoint(checkpoint, analyses, done, fingerprint, writer)
    bar.close()
    return analyses


def run_analysis(
    model,
    tokens: torch.Tensor,
    analysis_class,
    *args,
    batch_size: int = 8,
    progress: bool = False,
    desc: str = "corpus",
    result_kwargs: dict | None = None,
    **kwargs,
):
    """Build one analysis, run it over ``tokens`` with :func:`run_corpus` and return its result.

    ``analysis_class(*args, **kwargs)`` makes the analysis (a :class:`CorpusAnalysis` class, or a
    factory such as ``TaxonomyAnalysis.for_model`` with the model among ``args``);
    ``batch_size``, ``progress`` and ``desc`` go to :func:`run_corpus`, ``result_kwargs`` to
    ``result()``. The one-call functions of the topics (``sink_geometry``, ``head_taxonomy``,
    ``mean_head_z``, …) are this call.

    >>> from geolens.sinks.norm_curve import NormCurve
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")
    >>> tokens = tiny_tokens(model, length=8)
    >>> curve = run_analysis(model, tokens, NormCurve, model.cfg.n_layers, model.cfg.n_heads, batch_size=1)
    >>> pooled = curve.curves.query("scope == 'layer' and layer == 0")
    >>> int(pooled["count"].sum()) == tokens.shape[0] * 7 * model.cfg.n_heads  # queries 1…7 of every window and head
    True
    """
    analysis = analysis_class(*args, **kwargs)
    run_corpus(model, tokens, [analysis], batch_size=batch_size, progress=progress, desc=desc)
    return analysis.result(**(result_kwargs or {}))
