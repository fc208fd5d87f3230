"""Streamed mode of the HF-native backend: each layer's quantities computed inside the forward.

:func:`stream_layers` runs one forward and, as soon as a layer's attention has run, hands that
layer's :class:`~geolens.adapter.AttentionLayer` (pattern, v, W_O, read exactly as
:func:`~geolens.adapter.get_attention_layer` reads a cache) to a function; only what the function
returns is kept, and the layer's pattern is dropped before the next layer runs. A model therefore
never holds every layer's pattern at once: the peak is one layer's ``[batch, head, query, key]``
(plus the function's own temporaries), where a cached forward holds ``n_layers`` of them.
:func:`stream_corpus` does this batch by batch over a corpus, for functions that accumulate
(e.g. into :class:`geolens.streaming.Moments`).

>>> import geolens, torch
>>> from geolens.hf.streamed import stream_layers
>>> from geolens.hf.tiny import tiny_family
>>> model = tiny_family("mistral")
>>> sums = stream_layers(model, torch.tensor([[0, 5, 9, 4, 7, 8]]), lambda layer: geolens.layer_metrics(layer).contribution.sum(-1))
>>> sorted(sums), tuple(sums[1].shape)  # per layer: Σ_j c_ij = 1 for each (batch, head, query)
([0, 1], (1, 4, 6))
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch
from torch import Tensor
from tqdm.auto import tqdm

from geolens.adapter import AttentionLayer, adapter_for, get_attention_layer
from geolens.validation import check_layer


def stream_layers(
    model,
    tokens: Tensor,
    fn: Callable[[AttentionLayer], Any],
    *,
    layers: Iterable[int] | None = None,
    attention_mask: Tensor | None = None,
    dtype: torch.dtype = torch.float32,
) -> dict[int, Any]:
    """``{layer: fn(attention_layer)}`` for one forward of a ``transformers`` model (module
    docstring). ``layers`` (default: all) picks the layers handed to ``fn``; the forward stops
    after the last of them. ``attention_mask`` (1 = real token) runs a padded batch, as
    ``geolens.run_with_cache`` does, and is passed on to the layer view. ``dtype``: the compute
    dtype of the view (float32 by default)."""
    from geolens.hf.backend import sites, tl_forward
    from geolens.hf.capture import Run
    from geolens.hf.families import HFAdapter

    adapter = adapter_for(model)
    if not isinstance(adapter, HFAdapter):
        raise TypeError(f"streamed mode runs on the HF-native backend (a transformers model), got {type(model).__name__}")
    n_layers = adapter.n_layers
    wanted_layers = sorted({check_layer(l, n_layers) for l in (range(n_layers) if layers is None else layers)})
    if not wanted_layers:
        raise ValueError("layers names no layer")
    names = {n for l in wanted_layers for n in (adapter.pattern_hook(l), adapter.value_hook(l), adapter.z_hook(l))}
    buffer: dict[str, Tensor] = {}
    results: dict[int, Any] = {}

    def on_layer(l: int) -> None:
        if l not in wanted_layers:
            return
        view = get_attention_layer(model, buffer, l, dtype=dtype, attention_mask=attention_mask)
        buffer.clear()  # the cached pattern goes now; the view's goes with it after fn
        results[l] = fn(view)

    run = Run(cache=buffer, names_filter=lambda name: name in names, on_layer=on_layer)
    stop = wanted_layers[-1] + 1
    with torch.no_grad(), sites(model).active(run):
        tl_forward(model, tokens, return_type=None, attention_mask=attention_mask, stop_at_layer=stop if stop < n_layers else None)
    return results


def stream_corpus(
    model,
    tokens: Tensor,
    fn: Callable[[AttentionLayer], None],
    *,
    batch_size: int = 8,
    layers: Iterable[int] | None = None,
    dtype: torch.dtype = torch.float32,
    progress: bool = False,
) -> int:
    """Call ``fn(attention_layer)`` for every layer of every batch of ``tokens`` ``[n, seq]``
    (unpadded windows, e.g. :func:`geolens.data.corpus_windows`), inside each forward
    (:func:`stream_layers`); ``fn`` accumulates what it needs (``attention_layer.layer`` says
    which layer). Returns the number of batches run.

    >>> import torch
    >>> from geolens.hf.tiny import tiny_family
    >>> model = tiny_family("gpt2")
    >>> tokens = torch.randint(4, 64, (6, 10), generator=torch.Generator().manual_seed(0))
    >>> sink = torch.zeros(2, 4)  # Σ α_i0 over queries i ≥ 1, per (layer, head)
    >>> add = lambda layer: sink[layer.layer].add_(layer.pattern[:, :, 1:, 0].sum((0, 2)))
    >>> stream_corpus(model, tokens, add, batch_size=4)  # batches run
    2
    >>> bool(((sink > 0) & (sink <= 6 * 9)).all())
    True
    """
    from geolens.runner import n_batches, unpadded_groups
    from geolens.validation import check_context

    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    adapter_for(model)  # prepares a plain transformers model (model.cfg)
    if tokens.ndim != 2:
        raise ValueError(f"tokens must be [n_sequences, seq_len], got shape {tuple(tokens.shape)}")
    check_context(model, int(tokens.shape[1]), name="a token window")
    total = n_batches(int(tokens.shape[0]), batch_size)
    for index in tqdm(range(total), desc="streamed corpus", disable=not progress):
        batch = tokens[index * batch_size : (index + 1) * batch_size]
        for group in unpadded_groups(model, batch, None):
            stream_layers(model, group, fn, layers=layers, dtype=dtype)
    return total
