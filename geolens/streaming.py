"""Online accumulators for corpus-level statistics (bounded memory, mergeable, resumable).

Every corpus analysis in geolens accumulates per-batch statistics into objects of this module
instead of keeping caches: memory does not grow with the number of sequences, two accumulators of
different shards merge exactly (data-parallel runs), and ``state_dict`` / ``load_state_dict``
let a run be checkpointed and resumed.

- :class:`Moments`: count, mean and variance (Welford / Chan et al. parallel update), elementwise
  over a fixed shape (e.g. ``[layer, head]``).
- :class:`Histogram`: fixed-edge counts (and per-bin sums of a second quantity) over a shape.
- :class:`Sum`: running sums (exact for integers, float64 for floats).

All tensors are kept in float64 on the CPU.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import inspect
import math
from typing import Any

import torch
from torch import Tensor


def _f64(x) -> Tensor:
    return torch.as_tensor(x).detach().to("cpu", torch.float64)


class Accumulator:
    """MaskingConfig: ``update`` with data, ``merge`` another, ``state_dict``/``load_state_dict``."""

    def merge(self, other: "Accumulator") -> "Accumulator":  # pragma: no cover - interface
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        return {k: (v.clone() if isinstance(v, Tensor) else v) for k, v in vars(self).items()}

    def load_state_dict(self, state: dict[str, Any]) -> "Accumulator":
        for k, v in state.items():
            setattr(self, k, v.clone() if isinstance(v, Tensor) else v)
        return self


class Moments(Accumulator):
    """Elementwise count / mean / M2 over a fixed ``shape``; samples are reduced over ``dim``.

    ``update(x, dim=0)`` adds the samples of ``x`` along ``dim`` (e.g. x ``[batch, layer, head]``
    with ``dim=0``). NaNs are ignored (counted per element), so ragged data can be masked with NaN.
    """

    def __init__(self, shape: tuple[int, ...] = ()):
        self.count = torch.zeros(shape, dtype=torch.float64)
        self.mean = torch.zeros(shape, dtype=torch.float64)
        self.m2 = torch.zeros(shape, dtype=torch.float64)

    def update(self, x, dim: int | tuple[int, ...] = 0) -> "Moments":
        x = _f64(x)
        valid = ~torch.isnan(x)
        n = valid.sum(dim)
        safe = torch.where(valid, x, torch.zeros_like(x))
        s = safe.sum(dim)
        mean_b = torch.where(n > 0, s / n.clamp_min(1), torch.zeros_like(s))
        keep = dim if isinstance(dim, tuple) else (dim,)
        centred = torch.where(valid, x - _unsqueeze(mean_b, keep, x.ndim), torch.zeros_like(x))
        m2_b = (centred**2).sum(dim)
        return self._combine(n.to(torch.float64), mean_b, m2_b)

    def _combine(self, n_b: Tensor, mean_b: Tensor, m2_b: Tensor) -> "Moments":
        n_a = self.count
        total = n_a + n_b
        delta = mean_b - self.mean
        w = torch.where(total > 0, n_b / total.clamp_min(1), torch.zeros_like(total))
        self.mean = self.mean + delta * w
        self.m2 = self.m2 + m2_b + delta**2 * n_a * w
        self.count = total
        return self

    def merge(self, other: "Moments") -> "Moments":
        return self._combine(other.count.clone(), other.mean.clone(), other.m2.clone())

    @property
    def var(self) -> Tensor:
        """Unbiased sample variance (NaN where fewer than 2 samples)."""
        return torch.where(
            self.count > 1, self.m2 / (self.count - 1).clamp_min(1), torch.full_like(self.m2, float("nan"))
        )

    @property
    def std(self) -> Tensor:
        return self.var.sqrt()

    @property
    def sem(self) -> Tensor:
        """Standard error of the mean."""
        return self.std / self.count.clamp_min(1).sqrt()


def _unsqueeze(t: Tensor, dims: tuple[int, ...], ndim: int) -> Tensor:
    for d in sorted(d % ndim for d in dims):
        t = t.unsqueeze(d)
    return t


class Sum(Accumulator):
    """Running elementwise sum of a fixed shape."""

    def __init__(self, shape: tuple[int, ...] = (), dtype: torch.dtype = torch.float64):
        self.total = torch.zeros(shape, dtype=dtype)

    def update(self, x, dim: int | tuple[int, ...] | None = None) -> "Sum":
        x = torch.as_tensor(x).detach().to("cpu", self.total.dtype)
        self.total += x.sum(dim) if dim is not None else x
        return self

    def merge(self, other: "Sum") -> "Sum":
        self.total += other.total
        return self


class Histogram(Accumulator):
    """Counts of a value in fixed bins, elementwise over ``shape``, with per-bin sums of a payload.

    ``update(values, payload=None, dim=0)``: ``values`` ``[..., *shape]`` reduced over ``dim``;
    bins are ``edges[k] ≤ x < edges[k+1]`` (the last bin includes its right edge). ``payload``
    (same shape as values) is summed and square-summed per bin, which gives per-bin means and
    standard errors (e.g. mean output norm per sink-rate bin).
    """

    def __init__(self, edges, shape: tuple[int, ...] = ()):
        self.edges = _f64(edges)
        n_bins = self.edges.numel() - 1
        self.counts = torch.zeros(shape + (n_bins,), dtype=torch.float64)
        self.payload_sum = torch.zeros(shape + (n_bins,), dtype=torch.float64)
        self.payload_sq = torch.zeros(shape + (n_bins,), dtype=torch.float64)

    def bin_index(self, x: Tensor) -> Tensor:
        n_bins = self.edges.numel() - 1
        idx = torch.bucketize(x.contiguous(), self.edges, right=True) - 1
        idx = torch.where(x == self.edges[-1], torch.full_like(idx, n_bins - 1), idx)
        return idx

    def update(self, values, payload=None, dim: int = 0) -> "Histogram":
        x = _f64(values).movedim(dim, -1)  # [*shape, n]
        p = _f64(payload).movedim(dim, -1) if payload is not None else torch.zeros_like(x)
        idx = self.bin_index(x)
        inside = (idx >= 0) & (idx < self.counts.shape[-1]) & ~torch.isnan(x)
        idx = idx.clamp(0, self.counts.shape[-1] - 1)
        ones = inside.to(torch.float64)
        self.counts.scatter_add_(-1, idx, ones)
        self.payload_sum.scatter_add_(-1, idx, p * ones)
        self.payload_sq.scatter_add_(-1, idx, p * p * ones)
        return self

    def merge(self, other: "Histogram") -> "Histogram":
        if not torch.equal(self.edges, other.edges):
            raise ValueError("cannot merge histograms with different bin edges")
        self.counts += other.counts
        self.payload_sum += other.payload_sum
        self.payload_sq += other.payload_sq
        return self

    @property
    def payload_mean(self) -> Tensor:
        return torch.where(
            self.counts > 0, self.payload_sum / self.counts.clamp_min(1), torch.full_like(self.counts, float("nan"))
        )

    @property
    def payload_sem(self) -> Tensor:
        n = self.counts
        var = (self.payload_sq - n * self.payload_mean.nan_to_num() ** 2) / (n - 1).clamp_min(1)
        return torch.where(n > 1, var.clamp_min(0).sqrt() / n.clamp_min(1).sqrt(), torch.full_like(n, float("nan")))


class CorpusAnalysis(Accumulator):
    """A corpus-level analysis that streams over batches (the protocol of :mod:`geolens.runner`).

    Subclasses hold only accumulators (no caches of earlier batches) and implement:

    - ``hook_names(model) -> list[str]``: the cache entries ``update`` reads (the runner caches
      only those, through ``names_filter``);
    - ``update(model, cache, tokens)``: add one batch;
    - ``merge(other)``: add another shard's state (data-parallel runs);
    - ``result()``: the final numbers (tensors, dicts or pandas DataFrames).

    ``state_dict``/``load_state_dict`` (inherited) must round-trip every accumulator: the default
    copies all attributes, which works when they are tensors, numbers, strings, Accumulators, or
    lists / tuples / dicts of these (packed recursively, so checkpoints load with
    ``torch.load(weights_only=True)``). The default ``merge`` merges every Accumulator attribute
    (also inside lists and dicts) and leaves the other attributes (configuration) as they are.

    Configuration: the arguments a subclass's ``__init__`` was called with are recorded
    automatically (``config()``, defaults filled in, as plain JSON-like values) and saved in the
    state under ``_init_config``. ``load_state_dict`` and ``merge`` refuse a state or a shard built
    with other arguments, naming the argument, so loading never replaces an analysis's
    configuration (e.g. its ``layers``); checkpoints record ``config()`` in their fingerprint.

    Streamed mode (the HF-native backend, :func:`geolens.runner.run_corpus`): ``layerwise``
    (True by default) says that ``update`` reads the cache layer by layer, every entry it reads of
    a layer before any entry of a later one, and never an earlier layer again, so that it can run
    inside the forward while each layer's pattern is dropped before the next layer runs (it must
    then not run the model itself). A subclass that reads several layers at once (or out of
    order) sets ``layerwise = False`` and is run from a cache of every layer, as on TransformerLens.
    """

    layerwise: bool = True

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "__init__" in cls.__dict__:
            cls.__init__ = _recording_init(cls.__dict__["__init__"])
        if "load_state_dict" in cls.__dict__:
            cls.load_state_dict = _checked_load(cls.__dict__["load_state_dict"])
        if "merge" in cls.__dict__:
            cls.merge = _checked_merge(cls.__dict__["merge"])

    def config(self) -> dict[str, Any]:
        """The constructor arguments of this analysis (defaults included) as plain values."""
        return vars(self).get(CONFIG_KEY, {})

    def hook_names(self, model) -> list[str]:  # pragma: no cover - interface
        raise NotImplementedError

    def update(self, model, cache, tokens) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def result(self):  # pragma: no cover - interface
        raise NotImplementedError

    def merge(self, other: "CorpusAnalysis") -> "CorpusAnalysis":
        if type(other) is not type(self):
            raise TypeError(f"cannot merge {type(other).__name__} into {type(self).__name__}")
        check_config(self, other.config(), "cannot merge: the other shard")
        for k, v in vars(self).items():
            if k != CONFIG_KEY:
                _merge_into(v, vars(other)[k], k)
        return self

    def state_dict(self) -> dict[str, Any]:
        return {k: _pack(v) for k, v in vars(self).items()}

    def load_state_dict(self, state: dict[str, Any]) -> "CorpusAnalysis":
        check_config(self, state.get(CONFIG_KEY), "cannot load: the state")
        for k, v in state.items():
            if k != CONFIG_KEY:
                setattr(self, k, _unpack(getattr(self, k, None), v))
        return self


CONFIG_KEY = "_init_config"


def plain_config(value) -> Any:
    """A constructor argument as a plain, comparable value that ``torch.load(weights_only=True)``
    reads back equal: numbers, strings, lists and dicts (tensors by value when small, else by
    SHA-256; dataclasses and named tuples field by field; NaN and ±inf as strings)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if isinstance(value, torch.dtype):
        return str(value)
    if type(value).__module__ == "numpy" and hasattr(value, "tolist"):  # numpy scalars and arrays
        return plain_config(value.tolist())
    if isinstance(value, Tensor):
        t = value.detach().cpu()
        if t.numel() <= 64:
            return {"tensor": plain_config(t.tolist()), "dtype": str(t.dtype)}
        data = t.contiguous().view(-1).view(torch.uint8) if t.numel() else t
        digest = hashlib.sha256(data.numpy().tobytes()).hexdigest()[:16]
        return {"tensor_sha256": digest, "shape": list(t.shape), "dtype": str(t.dtype)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            "class": type(value).__qualname__,
            **{f.name: plain_config(getattr(value, f.name)) for f in dataclasses.fields(value)},
        }
    if isinstance(value, tuple) and hasattr(value, "_asdict"):
        return {"class": type(value).__qualname__, **{k: plain_config(v) for k, v in value._asdict().items()}}
    if isinstance(value, dict):
        return {str(k): plain_config(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, range)):
        return [plain_config(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((plain_config(v) for v in value), key=repr)
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{getattr(value, '__module__', '')}.{value.__qualname__}"
    text = repr(value)
    return type(value).__qualname__ if " at 0x" in text else text


def _recording_init(init):
    """Wrap a subclass ``__init__`` so that its bound arguments are kept (see ``config()``).

    The outermost ``__init__`` finishes last, so a subclass that calls ``super().__init__``
    records its own arguments.
    """
    signature = inspect.signature(init)

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        config = {}
        for i, (name, value) in enumerate(bound.arguments.items()):
            if i == 0:
                continue  # self
            kind = signature.parameters[name].kind
            if kind is inspect.Parameter.VAR_KEYWORD:
                config.update({str(k): plain_config(v) for k, v in value.items()})
            else:
                config[name] = plain_config(value)
        self.__dict__[CONFIG_KEY] = config

    return __init__


def _checked_load(load):
    """Wrap a subclass ``load_state_dict``: refuse a state built with other arguments, keep ours."""

    @functools.wraps(load)
    def load_state_dict(self, state):
        check_config(self, state.get(CONFIG_KEY) if isinstance(state, dict) else None, "cannot load: the state")
        mine = vars(self).get(CONFIG_KEY)
        out = load(self, state)
        if mine is not None:
            self.__dict__[CONFIG_KEY] = mine
        return out

    return load_state_dict


def _checked_merge(merge):
    """Wrap a subclass ``merge``: refuse a shard of the same class built with other arguments."""

    @functools.wraps(merge)
    def checked(self, other):
        if type(other) is type(self):
            check_config(self, other.config(), "cannot merge: the other shard")
        return merge(self, other)

    return checked


def config_differences(saved: Any, current: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """``(path, saved, current)`` for every leaf where two plain values differ."""
    if isinstance(saved, dict) and isinstance(current, dict):
        out = []
        for k in list(current) + [k for k in saved if k not in current]:
            out += config_differences(
                saved.get(k, "<absent>"), current.get(k, "<absent>"), f"{path}.{k}" if path else str(k)
            )
        return out
    if isinstance(saved, list) and isinstance(current, list) and len(saved) == len(current):
        return [d for i, (a, b) in enumerate(zip(saved, current)) for d in config_differences(a, b, f"{path}[{i}]")]
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (saved, current))
    if saved != current or (type(saved) is not type(current) and not numbers):
        return [(path or "value", saved, current)]
    return []


def _short(value, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def check_config(analysis, saved: dict[str, Any] | None, what: str) -> None:
    """Raise a ValueError naming every constructor argument where ``saved`` differs."""
    if saved is None:  # a state saved before configurations were recorded
        return
    diffs = config_differences(saved, analysis.config())
    if diffs:
        detail = "; ".join(f"{p}={_short(a)} there, {_short(b)} here" for p, a, b in diffs)
        raise ValueError(
            f"{type(analysis).__name__}: {what} was built with other constructor arguments ({detail}); "
            "construct the analysis with the same arguments"
        )


def _merge_into(mine, theirs, name: str) -> None:
    if isinstance(mine, Accumulator):
        mine.merge(theirs)
    elif isinstance(mine, dict):
        if mine.keys() != theirs.keys():
            raise ValueError(f"cannot merge {name!r}: the two states have different keys")
        for key in mine:
            _merge_into(mine[key], theirs[key], f"{name}[{key!r}]")
    elif isinstance(mine, (list, tuple)):
        if len(mine) != len(theirs):
            raise ValueError(f"cannot merge {name!r}: lengths {len(mine)} and {len(theirs)} differ")
        for i, (a, b) in enumerate(zip(mine, theirs)):
            _merge_into(a, b, f"{name}[{i}]")


def _pack(v):
    """State of one attribute in plain containers and tensors (Accumulators as {"__acc__": ...})."""
    if isinstance(v, Accumulator):
        return {"__acc__": v.state_dict()}
    if isinstance(v, Tensor):
        return v.clone()
    if isinstance(v, dict):
        return {k: _pack(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return type(v)(_pack(x) for x in v) if type(v) in (list, tuple) else v
    return v


def _unpack(current, saved):
    if isinstance(saved, dict) and "__acc__" in saved:
        if not isinstance(current, Accumulator):
            raise ValueError(
                "state holds an accumulator where the analysis has none: construct the analysis with the same arguments"
            )
        current.load_state_dict(saved["__acc__"])
        return current
    if isinstance(saved, Tensor):
        return saved.clone()
    if isinstance(saved, dict):
        cur = current if isinstance(current, dict) else {}
        return {k: _unpack(cur.get(k), x) for k, x in saved.items()}
    if isinstance(saved, (list, tuple)) and type(saved) in (list, tuple):
        cur = current if isinstance(current, (list, tuple)) and len(current) == len(saved) else [None] * len(saved)
        return type(saved)(_unpack(c, x) for c, x in zip(cur, saved))
    return saved
