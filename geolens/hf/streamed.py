"""Streamed mode of the HF-native backend: each layer's quantities computed inside the forward.

:func:`stream_layers` runs one forward and, as soon as a layer's attention has run, hands that
layer's :class:`~geolens.adapter.AttentionLayer` (pattern, v, W_O, read exactly as
:func:`~geolens.adapter.get_attention_layer` reads a cache) to a function; only what the function
returns is kept, and the layer's pattern is dropped before the next layer runs. A model therefore
never holds every layer's pattern at once: the peak is one layer's ``[batch, head, query, key]``
(plus the function's own temporaries), where a cached forward holds ``n_layers`` of them.
:func:`stream_corpus` does this batch by batch over a corpus, for functions that accumulate
(e.g. into :class:`geolens.streaming.Moments`).

:func:`update_layerwise` is what :func:`geolens.runner.run_corpus` does with
:class:`~geolens.streaming.CorpusAnalysis` objects on this backend: their ``update`` reads a
cache, all its layers in one call, so each analysis's ``update`` runs in a thread of its own
while the forward runs in the calling thread, and the two take turns (one thread runs at a time,
so nothing is computed concurrently and the numbers are those of the cached path). The cache an
analysis reads (:class:`LayerCache`) has the run's hook names; reading an entry of layer l waits
until block l has run. Once every analysis has moved on to a later layer (or finished), layer l's
entries are dropped and the forward goes on: the run holds one layer's entries at a time (the
analysis itself may still hold what it read of the previous layer while it asks for the next).

>>> import geolens, torch
>>> from geolens.hf.streamed import stream_layers
>>> from geolens.hf.tiny import tiny_family
>>> model = tiny_family("mistral")
>>> sums = stream_layers(model, torch.tensor([[0, 5, 9, 4, 7, 8]]), lambda layer: geolens.layer_metrics(layer).contribution.sum(-1))
>>> sorted(sums), tuple(sums[1].shape)  # per layer: Σ_j c_ij = 1 for each (batch, head, query)
([0, 1], (1, 4, 6))
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
from torch import Tensor
from tqdm.auto import tqdm

from geolens.adapter import AttentionLayer, adapter_for, get_attention_layer
from geolens.layout import hook_layer
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

    adapter = adapter_for(model)
    if adapter.model_mode != "hf":
        raise TypeError(
            f"streamed mode runs on the HF-native backend (a transformers model), got {type(model).__name__}"
        )
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
        tl_forward(
            model,
            tokens,
            return_type=None,
            attention_mask=attention_mask,
            stop_at_layer=stop if stop < n_layers else None,
        )
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
    from geolens.data import n_batches, unpadded_groups
    from geolens.validation import check_context

    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if adapter_for(model).model_mode == "hf":
        from geolens.hf.backend import prepare

        prepare(model, check=False)  # the entry points the corpus helpers read (model.cfg, model.tokenizer)
    if tokens.ndim != 2:
        raise ValueError(f"tokens must be [n_sequences, seq_len], got shape {tuple(tokens.shape)}")
    check_context(model, int(tokens.shape[1]), name="a token window")
    total = n_batches(int(tokens.shape[0]), batch_size)
    for index in tqdm(range(total), desc="streamed corpus", disable=not progress):
        batch = tokens[index * batch_size : (index + 1) * batch_size]
        for group in unpadded_groups(model, batch, None):
            stream_layers(model, group, fn, layers=layers, dtype=dtype)
    return total


# ---------------------------------------------------------------------------------------------
# CorpusAnalysis objects inside the forward (geolens.runner.run_corpus)


def hf_native(model) -> bool:
    """Whether ``model`` is a ``transformers`` model (the HF-native backend); it is then prepared
    for geolens (:func:`geolens.hf.prepare`: ``model.cfg`` and the other entry points the analyses
    call; the load-time check runs at the first forward). False for a TransformerLens model."""
    try:
        from transformers import PreTrainedModel
    except ImportError:  # pragma: no cover - transformers is a dependency
        return False
    if not isinstance(model, PreTrainedModel):
        return False
    from geolens.hf.backend import prepare

    if adapter_for(model).model_mode != "hf":
        return False
    prepare(model, check=False)
    return True


def layerwise(analysis, model) -> bool:
    """Whether :func:`update_layerwise` can run ``analysis``: it declares ``layerwise``
    (:class:`~geolens.streaming.CorpusAnalysis`) and reads block hooks only (``blocks.{l}.…``;
    not the logits or the unembedding input, which exist only once the forward has ended)."""
    return bool(getattr(analysis, "layerwise", False)) and all(
        hook_layer(name) is not None for name in analysis.hook_names(model)
    )


_PRODUCER = -1  # the turn of the thread that runs the forward


class _Cancelled(BaseException):
    """Ends an analysis thread whose forward was abandoned (not an Exception: no ``except
    Exception`` of the analysis catches it)."""


class _Abort(Exception):
    """Ends a forward after an analysis raised."""


class _Feed:
    """One forward's captured entries, handed layer by layer to analysis threads that take turns
    with the forward (:func:`update_layerwise`)."""

    def __init__(self, names: frozenset[str], n_consumers: int):
        self.names = names
        self.order = sorted(names, key=lambda n: (hook_layer(n), n))
        self.entries: dict[str, Tensor] = {}  # the run's cache: the capture writes here
        self.cond = threading.Condition()
        self.layer = -1  # the last layer whose block has run
        self.dropped = -1  # entries of layers up to this one are gone
        self.final = self.cancelled = False
        self.turn = _PRODUCER
        self.waiting = [-1] * n_consumers  # the layer each analysis waits for
        self.done = [False] * n_consumers
        self.errors: list[BaseException | None] = [None] * n_consumers

    def _hand(self, i: int) -> None:
        """Give analysis ``i`` the turn and wait until it hands it back (lock held)."""
        self.turn = i
        self.cond.notify_all()
        self.cond.wait_for(lambda: self.turn == _PRODUCER)

    def publish(self, layer: int | None) -> None:
        """Block ``layer`` has run (None: the forward has ended): each analysis waiting for it
        runs in turn, then that layer's entries are dropped."""
        with self.cond:
            if layer is None:
                self.final = True
            else:
                self.layer = layer
            for i in range(len(self.done)):
                if not self.done[i] and (self.final or self.waiting[i] <= self.layer):
                    self._hand(i)
                if self.errors[i] is not None:
                    raise _Abort
            if layer is not None:
                for name in [n for n in self.entries if hook_layer(n) == layer]:
                    del self.entries[name]
                self.dropped = layer

    def cancel(self) -> None:
        """End every analysis thread still running (after an error or an abandoned forward)."""
        with self.cond:
            self.cancelled = True
            while not all(self.done):
                self._hand(self.done.index(False))

    def read(self, i: int, name: str) -> Tensor:
        """``cache[name]`` for analysis ``i`` (it holds the turn): waits until ``name``'s block has run."""
        if name not in self.names:
            raise KeyError(name)
        layer = hook_layer(name)
        with self.cond:
            if self.cancelled:
                raise _Cancelled
            if layer > self.layer and not self.final:
                self.waiting[i] = layer
                self.turn = _PRODUCER
                self.cond.notify_all()
                self.cond.wait_for(lambda: self.turn == i)
                if self.cancelled:
                    raise _Cancelled
            if layer <= self.dropped:
                raise RuntimeError(
                    f"streamed corpus run: {name!r} was read after layer {self.dropped}'s entries were dropped; an analysis "
                    "run inside the forward reads its layers in order (set layerwise = False on its class to run it from a cache)"
                )
            found = self.entries.get(name)
        if found is None:
            raise KeyError(name)
        return found

    def consume(
        self, i: int, analysis, model, tokens: Tensor, modes: Callable[[], contextlib.AbstractContextManager]
    ) -> None:
        """The body of analysis ``i``'s thread: its ``update`` over a :class:`LayerCache`."""
        with self.cond:
            self.cond.wait_for(lambda: self.turn == i)
        try:
            if self.cancelled:
                raise _Cancelled
            with modes():
                analysis.update(model, LayerCache(self, i), tokens)
        except _Cancelled:
            pass
        except BaseException as error:  # handed to the calling thread, which raises it
            self.errors[i] = error
        finally:
            with self.cond:
                self.done[i] = True
                self.turn = _PRODUCER
                self.cond.notify_all()


class LayerCache(Mapping):
    """The cache an analysis reads inside a streamed forward: every hook name of the run, in layer
    order; ``cache[name]`` waits until that layer's block has run, and an entry is readable until
    every analysis has moved past its layer (reading it later raises a clear error)."""

    def __init__(self, feed: _Feed, index: int):
        self._feed, self._index = feed, index

    def __getitem__(self, name: str) -> Tensor:
        return self._feed.read(self._index, name)

    def __contains__(self, name) -> bool:
        return name in self._feed.names

    def __iter__(self) -> Iterator[str]:
        return iter(self._feed.order)

    def __len__(self) -> int:
        return len(self._feed.names)


def _caller_modes() -> Callable[[], contextlib.AbstractContextManager]:
    """The calling thread's grad, inference and autocast modes and devices (thread-local in
    PyTorch), as a context manager to enter in an analysis thread: its ``update`` then computes
    as it would in the calling thread."""
    grad, inference = torch.is_grad_enabled(), torch.is_inference_mode_enabled()
    autocast = [(d, torch.get_autocast_dtype(d)) for d in ("cpu", "cuda") if torch.is_autocast_enabled(d)]
    cuda = torch.cuda.current_device() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    default = torch.get_default_device()

    @contextlib.contextmanager
    def modes():
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.inference_mode(inference))
            stack.enter_context(torch.set_grad_enabled(grad))
            for device_type, dtype in autocast:
                stack.enter_context(torch.autocast(device_type, dtype=dtype))
            if cuda is not None:
                stack.enter_context(torch.cuda.device(cuda))
            if default.type != "cpu":
                stack.enter_context(torch.device(default))
            yield

    return modes


def update_layerwise(
    model, tokens: Tensor, analyses: Sequence, names: Iterable[str], *, stop_at_layer: int | None = None
) -> None:
    """Run one forward of ``tokens`` (unpadded ``[batch, seq]`` ids) and call every analysis's
    ``update(model, cache, tokens)`` inside it, layer by layer (module docstring). ``names``:
    the block hooks the analyses read (the keys of each analysis's :class:`LayerCache`);
    ``stop_at_layer``: the forward runs blocks ``0 … stop_at_layer − 1`` only. An exception of an
    analysis ends the forward and is raised here, after every hook of the run is removed and
    every analysis thread has ended.

    >>> import torch
    >>> from geolens.pruning import AttentionEntropy
    >>> from geolens.hf.tiny import tiny_family
    >>> model = tiny_family("qwen3")
    >>> entropy = AttentionEntropy(2, 4)
    >>> update_layerwise(model, torch.tensor([[0, 5, 9, 4, 7, 8]]), [entropy], entropy.hook_names(model))
    >>> int(entropy.moments.count[0, 0])  # queries 1 … 5 of the one window
    5
    """
    from geolens.hf.backend import sites, tl_forward
    from geolens.hf.capture import Run

    adapter = adapter_for(model)
    names = frozenset(names)
    if any(hook_layer(n) is None for n in names):
        raise ValueError(
            f"a streamed forward hands out block hooks only, got {sorted(n for n in names if hook_layer(n) is None)[:4]}"
        )
    feed = _Feed(names, len(analyses))
    modes = _caller_modes()
    n = adapter.n_layers
    last = (
        n
        if stop_at_layer is None
        else min(n, max(0, int(stop_at_layer) + n if int(stop_at_layer) < 0 else int(stop_at_layer)))
    )
    publish = [lambda x, site: feed.publish(site.layer())]
    run = Run(
        hooks={adapter.resid_post_hook(l): publish for l in range(last)},
        cache=feed.entries,
        names_filter=names.__contains__,
    )
    threads = []
    try:
        for i, analysis in enumerate(analyses):
            thread = threading.Thread(
                target=feed.consume,
                args=(i, analysis, model, tokens, modes),
                name=f"geolens-layerwise-{i}",
                daemon=True,
            )
            thread.start()
            threads.append(thread)
        with torch.no_grad(), sites(model).active(run):
            tl_forward(model, tokens, return_type=None, stop_at_layer=stop_at_layer)
        feed.publish(None)
    except _Abort:
        pass
    finally:
        feed.done[len(threads) :] = [True] * (len(analyses) - len(threads))  # threads that never started
        feed.cancel()
        for thread in threads:
            thread.join()
    error = next((e for e in feed.errors if e is not None), None)
    if error is not None:
        raise error
