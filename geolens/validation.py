"""Argument checks shared by every public function: one place, one-line messages.

Each check either returns the normalised value or raises a ``ValueError`` / ``TypeError`` whose
message names the argument and the problem, so that bad input never turns into a plausible but
wrong number (a wrapped layer index, NaN rows from a negative eps, silent zeros from an integer
dtype, a padded batch read as real tokens).

>>> check_layer(-1, 30)
29
>>> check_eps(1e-6)
1e-06
>>> check_dtype(torch.float64)
torch.float64
"""

from __future__ import annotations

import math
import operator
import weakref
from typing import Iterable, Mapping

import torch
from jaxtyping import Bool
from torch import Tensor

from geolens.layout import hook_layer


def out_of_range(arg: str, count: int, what: str, *, allow_negative: bool = True) -> str:
    """The one message for an index outside ``[-count, count)`` (``[0, count)`` without negative
    indices), in every entry point: ``arg`` is the argument as its caller spells it (``"layer=99"``
    in Python, ``"--layer 99"`` on the command line), the rest of the text is the same. Python
    raises it as an ``IndexError`` (:func:`check_layer`, :func:`check_head`), the command line as
    a :class:`~geolens.errors.UsageError` (exit 2).

    >>> out_of_range("layer=99", 30, "layers")
    'layer=99 is out of range: the model has 30 layers (0…29, or -30…-1 from the end)'
    """
    span = f"0…{count - 1}, or -{count}…-1 from the end" if allow_negative else f"0…{count - 1}"
    return f"{arg} is out of range: the model has {count} {what} ({span})"


def _check_index(value, count: int, *, name: str, what: str, allow_negative: bool) -> int:
    """``value`` as an index in ``[0, count)``: TypeError for a non-integer (``True``, ``1.0``,
    ``"1"`` are refused rather than coerced), IndexError (:func:`out_of_range`) outside the range."""
    if isinstance(value, (bool, float)):
        raise TypeError(f"{name} must be an integer {what[:-1]} index, got {value!r}")
    try:
        index = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer {what[:-1]} index, got {value!r}") from None
    low = -count if allow_negative else 0
    if not low <= index < count:
        raise IndexError(out_of_range(f"{name}={index}", count, what, allow_negative=allow_negative))
    return index % count


def check_layer(layer, n_layers: int, *, name: str = "layer", allow_negative: bool = True) -> int:
    """An integer layer index in ``[-n_layers, n_layers)``, returned in ``[0, n_layers)``.

    Negative indices count from the end, as in Python (``-1`` is the last layer), everywhere in
    the API; the command line passes ``allow_negative=False`` (it never wraps). ``True``,
    ``1.0`` or ``"1"`` are refused rather than coerced. The error vocabulary of every entry point:
    a wrong type is a ``TypeError``, an index out of range an ``IndexError`` (:func:`out_of_range`).

    >>> check_layer(3, 30)
    3
    >>> check_layer(30, 30)
    Traceback (most recent call last):
    ...
    IndexError: layer=30 is out of range: the model has 30 layers (0…29, or -30…-1 from the end)
    """
    return _check_index(layer, n_layers, name=name, what="layers", allow_negative=allow_negative)


def check_head(head, n_heads: int, *, name: str = "head", allow_negative: bool = True) -> int:
    """An integer head index in ``[-n_heads, n_heads)``, returned in ``[0, n_heads)``: as
    :func:`check_layer` (TypeError for a wrong type, IndexError out of range).

    >>> check_head(-1, 9)
    8
    """
    return _check_index(head, n_heads, name=name, what="heads", allow_negative=allow_negative)


def check_text(text, *, name: str = "text", empty_ok: bool = False) -> str:
    """One text: a ``str`` (non-empty unless ``empty_ok``). Several texts (a list or tuple) get the
    one message of every entry point that takes a single text: a TypeError saying what to use for
    a batch; any other type a TypeError, an empty text a ValueError.

    >>> check_text(["a", "b"])
    Traceback (most recent call last):
    ...
    TypeError: text takes one text per call, got a list of 2 texts: call it once per text (a loop), or for a batch use the functional API (tokens = model.to_tokens(texts); _, cache = geolens.run_with_cache(model, tokens); geolens.contribution_weights(model, cache, layer))
    """
    if isinstance(text, str):
        if not text and not empty_ok:
            raise ValueError(f"{name} must be a non-empty string, got {text!r}")
        return text
    if isinstance(text, (list, tuple)):
        raise TypeError(
            f"{name} takes one text per call, got a {type(text).__name__} of {len(text)} text"
            f"{'' if len(text) == 1 else 's'}: call it once per "
            "text (a loop), or for a batch use the functional API (tokens = model.to_tokens(texts); "
            "_, cache = geolens.run_with_cache(model, tokens); geolens.contribution_weights(model, cache, layer))"
        )
    raise TypeError(f"{name} must be a string, got {type(text).__name__}")


def check_choice(value, choices, *, name: str):
    """``value`` when it is one of ``choices``; ValueError naming the argument and the choices otherwise.

    ``choices``: the allowed strings, or a mapping from each to what it means (shown in the message).

    >>> check_choice("intra", ("intra", "inter"), name="mode")
    'intra'
    >>> check_choice("all", {"value": "α‖v‖", "projected": "α‖vW_O‖"}, name="space")
    Traceback (most recent call last):
    ...
    ValueError: space must be one of 'value' (α‖v‖), 'projected' (α‖vW_O‖), got 'all'
    """
    if isinstance(value, str) and value in choices:
        return value
    listed = ", ".join(f"{c!r} ({choices[c]})" if isinstance(choices, Mapping) else repr(c) for c in choices)
    raise ValueError(f"{name} must be one of {listed}, got {value!r}")


def check_context(model, n_positions: int, *, name: str = "sequence") -> int:
    """``n_positions``, or ValueError when it exceeds the model's context (``cfg.n_ctx``).

    Beyond its context a rotary model still runs, silently extrapolating positions it was never
    trained on (and a learned-position model fails); geolens refuses such sequences where it runs
    the model itself (:func:`geolens.run_corpus`, :func:`geolens.data.token_windows`, the CLI).
    Contribution weights computed from a cache the caller made are exact for that forward
    whatever its length.

    >>> from geolens.testing import tiny_bridge
    >>> check_context(tiny_bridge("gqa"), 128)
    128
    """
    n_ctx = getattr(model.cfg, "n_ctx", None)
    n = int(n_positions)
    if n_ctx is not None and n > int(n_ctx):
        raise ValueError(f"{name} of {n} tokens is longer than the model's context (n_ctx = {int(n_ctx)})")
    return n


def text_tokens(model, text: str, *, prepend_bos: bool = True, truncate: bool = False) -> Tensor:
    """The token ids ``[1, pos]`` of one text, never cut silently.

    ``model.to_tokens`` of TransformerLens cuts a text longer than the model's context
    (``cfg.n_ctx``) to its first ``n_ctx`` tokens without a word, and every position after that is
    silently lost. Here such a text raises ``ValueError`` giving its token count and the limit;
    ``truncate=True`` keeps the first ``n_ctx`` tokens and says so in a ``UserWarning``.

    >>> from geolens.testing import tiny_bridge
    >>> model = tiny_bridge("gqa")  # n_ctx = 128, a tokenizer of characters
    >>> tuple(text_tokens(model, "the cat sat").shape)
    (1, 12)
    >>> text_tokens(model, "the cat sat " * 50)
    Traceback (most recent call last):
    ...
    ValueError: the text is 601 tokens long (BOS included), longer than the model's context of 128 tokens: shorten it, or pass truncate=True to keep its first 128 tokens
    """
    tokens, n = checked_text_tokens(model, text, prepend_bos=prepend_bos, truncate=truncate)
    if tokens.shape[-1] < n:
        import warnings

        warnings.warn(
            f"the text is {n} tokens long: truncated to the model's context, its first {tokens.shape[-1]} tokens",
            stacklevel=2,
        )
    return tokens


def checked_text_tokens(model, text: str, *, prepend_bos: bool = True, truncate: bool = False) -> tuple[Tensor, int]:
    """:func:`text_tokens` without its warning, and the text's full token count: ``(tokens, n)``,
    ``tokens`` cut to the context only when ``truncate`` (then ``tokens.shape[-1] < n``).

    >>> from geolens.testing import tiny_bridge
    >>> tokens, n = checked_text_tokens(tiny_bridge("gqa"), "x" * 200, truncate=True)
    >>> tokens.shape[-1], n
    (128, 201)
    """
    check_text(text, empty_ok=True)
    tokens, n = _full_text_tokens(model, text, prepend_bos=prepend_bos)
    n_ctx = getattr(model.cfg, "n_ctx", None)
    if n_ctx is None or n <= int(n_ctx):
        return tokens, n
    n_ctx = int(n_ctx)
    if not truncate:
        raise ValueError(
            f"the text is {n} tokens long{' (BOS included)' if prepend_bos else ''}, longer than the model's "
            f"context of {n_ctx} tokens: shorten it, or pass truncate=True to keep its first {n_ctx} tokens"
        )
    return tokens[:, :n_ctx], n


def _full_text_tokens(model, text: str, *, prepend_bos: bool) -> tuple[Tensor, int]:
    """``model.to_tokens(text)`` without TransformerLens' cut to the context, and its length."""
    try:
        tokens = model.to_tokens(text, prepend_bos=prepend_bos, truncate=False)
    except TypeError:  # a to_tokens without the truncate keyword
        tokens = model.to_tokens(text, prepend_bos=prepend_bos)
    return tokens, int(tokens.shape[-1])


def check_eps(eps, *, name: str = "eps") -> float:
    """A finite, non-negative float (a zero-norm threshold).

    >>> check_eps(0)
    0.0
    """
    if isinstance(eps, bool):
        raise TypeError(f"{name} must be a finite number ≥ 0, got {eps!r}")
    try:
        value = float(eps)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a finite number ≥ 0, got {eps!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number ≥ 0, got {eps!r}")
    return value


def check_dtype(dtype, *, name: str = "dtype") -> torch.dtype:
    """A floating-point ``torch.dtype`` (an integer dtype would truncate every ratio to 0).

    >>> check_dtype(torch.float32)
    torch.float32
    """
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"{name} must be a torch floating dtype such as torch.float32, got {dtype!r}")
    if not dtype.is_floating_point:
        raise ValueError(f"{name} must be a floating-point dtype (torch.float32 or torch.float64), got {dtype}")
    return dtype


def _memory_span(x: Tensor) -> tuple[int, int]:
    """The byte range of ``x``'s whole storage."""
    storage = x.untyped_storage()
    return storage.data_ptr(), storage.data_ptr() + storage.nbytes()


def check_out(
    out,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device,
    *,
    inputs: Iterable[Tensor | None] = (),
    dtype_from: str = "the dtype argument",
) -> Tensor:
    """An ``out=`` tensor for a result of ``shape``: a tensor of exactly that shape, dtype and
    device, whose elements do not overlap one another (an expanded tensor) and whose memory
    overlaps none of ``inputs`` (it would overwrite them while they are read, or a cache the
    caller keeps).

    >>> import torch
    >>> check_out(torch.empty(2, 3), (2, 3), torch.float32, torch.device("cpu")).shape
    torch.Size([2, 3])
    """
    if not isinstance(out, Tensor):
        raise TypeError(f"out must be a tensor, got {type(out).__name__}")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"out has shape {tuple(out.shape)}, the result has shape {tuple(shape)}")
    if out.dtype != dtype:
        raise ValueError(f"out has dtype {out.dtype}, the result is computed in {dtype} ({dtype_from})")
    if out.device != torch.device(device):
        raise ValueError(f"out is on {out.device}, the result is on {device}")
    if out.requires_grad:
        raise ValueError("out requires grad: pass a plain tensor (results are computed without autograd)")
    if any(size > 1 and stride == 0 for size, stride in zip(out.shape, out.stride())):
        raise ValueError(
            "out has elements that share memory (an expanded tensor): pass a tensor of its own, e.g. torch.empty(shape)"
        )
    start, end = _memory_span(out)
    for x in inputs:
        if x is not None and x.numel() and x.device == out.device:
            x_start, x_end = _memory_span(x)
            if x_start < end and start < x_end:
                raise ValueError(
                    "out shares memory with the cached activations the result is computed from: pass a separate tensor"
                )
    return out


def check_attention_mask(attention_mask, batch: int, n_pos: int) -> Bool[Tensor, "batch pos"]:
    """``attention_mask`` as a bool ``[batch, pos]`` tensor (True = real token, TL's convention).

    Every row needs at least one real token; values must be 0/1 (or bool).

    >>> check_attention_mask(torch.tensor([[0, 1, 1]]), 1, 3).tolist()
    [[False, True, True]]
    """
    mask = torch.as_tensor(attention_mask)
    if tuple(mask.shape) != (batch, n_pos):
        raise ValueError(f"attention_mask has shape {tuple(mask.shape)}, expected [batch, pos] = {(batch, n_pos)}")
    if mask.dtype != torch.bool:
        if mask.is_floating_point() or mask.is_complex():
            if not bool(((mask == 0) | (mask == 1)).all()):
                raise ValueError("attention_mask must hold only 0 (padding) and 1 (real token)")
        elif not bool(((mask == 0) | (mask == 1)).all()):
            raise ValueError("attention_mask must hold only 0 (padding) and 1 (real token)")
        mask = mask != 0
    if not bool(mask.any(dim=1).all()):
        rows = (~mask.any(dim=1)).nonzero().flatten().tolist()
        raise ValueError(f"attention_mask rows {rows[:8]} have no real token")
    return mask


def pad_runs(tokens: Tensor, pad_id: int) -> tuple[Tensor, Tensor]:
    """Per row, the length of the leading and of the trailing run of ``pad_id`` tokens."""
    is_pad = tokens == pad_id
    n = tokens.shape[1]
    lead = torch.where(is_pad.all(1), n, (~is_pad).int().argmax(1))
    trail = torch.where(is_pad.all(1), n, (~is_pad).flip(1).int().argmax(1))
    return lead, trail


def refuse_unmasked_padding(model, tokens: Tensor) -> None:
    """Refuse a batch that looks padded when no ``attention_mask`` was given.

    A batch is padded when a row starts with pad tokens (the tokenizer's pad id) before its first
    real token or its BOS, whatever the other rows (an equally left-padded batch, one row), or
    when its rows differ in how many pad tokens they end with, as ``model.to_tokens([...])``
    makes them. When the pad id is also the BOS
    id (GPT-2), one leading pad token is the BOS itself. Without the mask those pad tokens would
    be read as real tokens (and the first of them as the sink).
    """
    tokenizer = getattr(model, "tokenizer", None)
    pad_id = getattr(tokenizer, "pad_token_id", None)
    if pad_id is None or tokens.ndim != 2 or tokens.shape[0] < 1:
        return
    lead, trail = pad_runs(tokens, int(pad_id))
    if getattr(tokenizer, "bos_token_id", None) == pad_id:
        lead = (lead - 1).clamp_min(0)
    if bool((lead > 0).any()):  # pad tokens before a row's first real token (or its BOS), in any batch
        rows = (lead > 0).nonzero().flatten().tolist()
        raise ValueError(
            f"the batch looks padded (rows {rows[:8]} start with pad tokens, id {pad_id}, before their first real "
            "token or BOS) and no attention_mask was given: pass attention_mask= (1 = real token, as "
            "model.to_tokens / the tokenizer returns it) so that pad tokens are excluded and each row's first "
            "real token is its sink"
        )
    if bool((lead != lead[0]).any() or (trail != trail[0]).any()):
        rows = ((lead != lead.min()) | (trail != trail.min())).nonzero().flatten().tolist()
        raise ValueError(
            f"the batch looks padded (rows {rows[:8]} start or end with more pad tokens, id {pad_id}, "
            "than the others) and no attention_mask was given: pass attention_mask= (1 = real token, "
            "as model.to_tokens / the tokenizer returns it) so that pad tokens are excluded and each "
            "row's first real token is its sink"
        )


def vocab_size(model) -> int | None:
    """The number of token ids the model embeds (``cfg.d_vocab``, or a ``transformers`` config's
    ``vocab_size``), or None when it does not say."""
    for owner, key in ((getattr(model, "cfg", None), "d_vocab"), (getattr(model, "config", None), "vocab_size")):
        value = getattr(owner, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def check_token_dtype(tokens, *, name: str = "tokens") -> None:
    """TypeError unless ``tokens`` (a tensor or a numpy array) holds integers: float ids would be
    cut to integers, or fail deep inside torch's embedding."""
    dtype = getattr(tokens, "dtype", None)
    if isinstance(dtype, torch.dtype):
        integer = not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)
    elif dtype is not None:
        import numpy as np

        integer = np.issubdtype(dtype, np.integer)
    else:
        return
    if not integer:
        raise TypeError(
            f"{name} must hold integer token ids, got a {dtype} {type(tokens).__name__}: "
            "pass model.to_tokens(text), or ids converted with .long()"
        )


def check_tokens(model, tokens, *, name: str = "tokens"):
    """``tokens`` if it is a tensor of token ids the model can read: integer (TypeError), not
    empty (ValueError) and inside the vocabulary (IndexError naming the first id outside it and
    where it is); one line each, instead of an error from deep inside torch. Anything but a
    tensor (a text, for TransformerLens' own ``run_with_cache``) is returned unchecked.

    >>> from geolens.testing import tiny_bridge
    >>> model = tiny_bridge("gqa")  # 64 token ids
    >>> check_tokens(model, torch.tensor([[0, 70, 3]]))
    Traceback (most recent call last):
    ...
    IndexError: tokens holds the id 70 at [0, 1], outside the model's vocabulary of 64 ids (0…63)
    """
    if not isinstance(tokens, Tensor):
        return tokens
    check_token_dtype(tokens, name=name)
    if tokens.numel() == 0:
        raise ValueError(f"{name} is empty (shape {tuple(tokens.shape)}): give at least one token id per row")
    n = vocab_size(model)
    bad = tokens < 0 if n is None else (tokens < 0) | (tokens >= n)
    if bool(bad.any()):
        where = [int(i) for i in bad.nonzero()[0].tolist()]
        value = int(tokens[tuple(where)])
        vocab = "" if n is None else f" of {n} ids (0…{n - 1})"
        raise IndexError(f"{name} holds the id {value} at {where}, outside the model's vocabulary{vocab}")
    return tokens


# id(cache) -> (weak reference to the cache, its number of entries, its deepest block index): a
# full ActivationCache has over a thousand names, and every layer read checks them.
_DEEPEST: dict[int, tuple[weakref.ref, int, int]] = {}


def _deepest_block(cache: Mapping) -> int:
    """The largest ``blocks.{l}.`` index among the cache's names (-1 without any), remembered per
    cache object while its number of entries is unchanged."""
    n_keys = len(cache)
    entry = _DEEPEST.get(id(cache))
    if entry is not None and entry[0]() is cache and entry[1] == n_keys:
        return entry[2]
    deepest = max((layer for k in cache.keys() if (layer := hook_layer(k)) is not None), default=-1)
    try:
        ref = weakref.ref(cache, lambda _, key=id(cache): _DEEPEST.pop(key, None))
    except TypeError:  # a plain dict cannot be weakly referenced: not remembered
        return deepest
    _DEEPEST[id(cache)] = (ref, n_keys, deepest)
    return deepest


# --- which model made a cache ---------------------------------------------------------------------
# geolens.run_with_cache stamps its cache with the fingerprint of the model's weights; every analysis
# that reads (model, cache) checks it here (check_cache_layers, called by get_attention_layer). A
# cache from TransformerLens' own model.run_with_cache carries no stamp and cannot be checked.

FINGERPRINT_SAMPLE = 4096  # elements read from each fingerprinted tensor


class CacheStamp:
    """What :func:`geolens.run_with_cache` records in its cache: the model object (weakly), the
    fingerprint of its weights (:func:`weights_fingerprint`) and its dtype."""

    __slots__ = ("model", "fingerprint", "dtype")

    def __init__(self, model):
        try:
            self.model = weakref.ref(model)
        except TypeError:
            self.model = lambda: None
        self.fingerprint = _fingerprint_or_none(model)
        self.dtype = _model_dtype(model)

    def __repr__(self) -> str:
        return f"CacheStamp(fingerprint={self.fingerprint!r}, dtype={self.dtype})"


def _model_dtype(model):
    try:
        return next(model.parameters()).dtype
    except (StopIteration, AttributeError, TypeError):
        return None


_FINGERPRINTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _fingerprint_or_none(model) -> str | None:
    """:func:`weights_fingerprint`, or None where the weights cannot be read (offloaded to the
    ``meta`` device, a model without parameters): such a cache is not checked."""
    try:
        return weights_fingerprint(model)
    except (NotImplementedError, RuntimeError, AttributeError, TypeError, ValueError):
        return None


def weights_fingerprint(model) -> str:
    """A cheap fingerprint of a model's weights (16 hex digits).

    The SHA-256 of the shapes, dtypes and a strided sample of ``FINGERPRINT_SAMPLE`` elements
    (as float32) of the model's first 6 and last 2 parameter tensors: the embedding and layer 0's
    first weights, the final norm and the unembedding. Two loads of the same weights in the same
    dtype agree; a model of the same architecture with other weights (another checkpoint, another
    seed, a fine-tune that moved any of those tensors) or another dtype differs. It is not a digest
    of every weight: a change confined to the middle layers goes unseen. Memoised per model object
    while those tensors are unchanged (their version counters), so checking costs nothing per layer.

    >>> from geolens.testing import tiny_bridge
    >>> weights_fingerprint(tiny_bridge("gqa")) == weights_fingerprint(tiny_bridge("gqa"))
    True
    >>> weights_fingerprint(tiny_bridge("gqa")) == weights_fingerprint(tiny_bridge("gqa", seed=1))
    False
    """
    import hashlib

    params = list(model.parameters())
    chosen = params[:6] + params[6:][-2:]
    versions = tuple((p.data_ptr(), p._version) for p in chosen)
    try:
        memo = _FINGERPRINTS.get(model)
    except TypeError:
        memo = None
    if memo is not None and memo[0] == versions:
        return memo[1]
    h = hashlib.sha256()
    with torch.no_grad():
        for p in chosen:
            flat = p.detach().reshape(-1)
            step = max(1, flat.numel() // FINGERPRINT_SAMPLE)
            sample = flat[::step][:FINGERPRINT_SAMPLE].to("cpu", torch.float32).contiguous()
            h.update(f"{tuple(p.shape)}|{p.dtype}|".encode())
            h.update(sample.numpy().tobytes())
    fingerprint = h.hexdigest()[:16]
    try:
        _FINGERPRINTS[model] = (versions, fingerprint)
    except TypeError:
        pass
    return fingerprint


def stamp_cache(model, cache):
    """``cache`` stamped with the model that made it (:class:`CacheStamp`); a plain ``dict`` is
    returned as a :class:`StampedCache` (a dict) holding the stamp."""
    stamp = CacheStamp(model)
    if type(cache) is dict:
        cache = StampedCache(cache)
    try:
        cache.geolens_stamp = stamp
    except (AttributeError, TypeError):
        pass
    return cache


class StampedCache(dict):
    """The activation cache of :func:`geolens.run_with_cache` on the HF-native backend: a dict of
    hook names to tensors that also records which model made it (``geolens_stamp``)."""

    geolens_stamp: CacheStamp | None = None


def check_cache_model(model, cache) -> None:
    """Refuse a cache stamped by :func:`geolens.run_with_cache` with another model's weights
    (ValueError, one line). Unstamped caches (TransformerLens' own ``model.run_with_cache``, a
    copied dict) pass: they cannot be checked."""
    stamp = getattr(cache, "geolens_stamp", None)
    if not isinstance(stamp, CacheStamp) or stamp.fingerprint is None or stamp.model() is model:
        return
    mine = _fingerprint_or_none(model)
    if mine is None or mine == stamp.fingerprint:
        return
    dtype = _model_dtype(model)
    if stamp.dtype is not None and dtype is not None and stamp.dtype != dtype:
        raise ValueError(
            f"the cache was made by a model in {stamp.dtype}, this model is {dtype}: its activations are not "
            "this model's; run the cache with this model (geolens.run_with_cache(model, tokens))"
        )
    raise ValueError(
        f"the cache was made by another model: its weights fingerprint is {stamp.fingerprint}, this model's is "
        f"{mine} (same architecture, other weights); run the cache with this model (geolens.run_with_cache(model, tokens))"
    )


def check_cache_layers(model, cache: Mapping, n_layers: int | None = None) -> None:
    """Refuse a cache holding blocks the model does not have (a cache of another model), or one
    stamped by :func:`geolens.run_with_cache` with another model's weights (:func:`check_cache_model`).
    ``n_layers``: the model's depth (default ``model.cfg.n_layers``)."""
    check_cache_model(model, cache)
    if not hasattr(cache, "keys"):
        return
    n_layers = model.cfg.n_layers if n_layers is None else int(n_layers)
    deepest = _deepest_block(cache)
    if deepest >= n_layers:
        raise ValueError(
            f"the cache holds layer {deepest} but the model has {n_layers} layers: the cache comes from another model"
        )
