"""Atomic, resumable checkpoints of corpus-analysis states.

A checkpoint is one ``torch.save`` file holding

- ``next_batch``: the index of the first batch not yet folded into the states;
- ``states``: ``[analysis.state_dict() for analysis in analyses]``;
- ``fingerprint``: what the run was over (number of sequences, sequence length, batch size, a
  hash of the token ids, the shard), which model (:func:`model_fingerprint`: name, shape of its
  config, TL mode and a SHA-256 of a few weight tensors) and which analyses (class names and
  constructor arguments, ``CorpusAnalysis.config()``) — resuming against other data, another
  model or other analysis arguments would silently give wrong numbers, so a mismatch raises,
  naming the field, before any state is loaded;
- ``torch_rng``: the CPU generator state, so that analyses that draw random numbers (random
  controls) continue the same stream after a resume;
- ``digest``: :func:`state_digest` of ``next_batch`` and ``states``, checked on
  resume (a checkpoint saved before it was recorded is refused: nothing unchecked is resumed);
- ``writer``: :func:`writer_record`, the weights fingerprint of the model (the one
  :func:`geolens.run_with_cache` stamps) and the geolens version that wrote it: a resume with
  other weights is refused, one under another version carries ``resumed_across_versions``.

Writes are atomic: the file is written to a temporary file *in the same folder*, flushed and
``fsync``-ed, then moved over the old one with ``os.replace`` (atomic on POSIX and Windows for
paths on one file system). A crash at any point leaves either the previous complete checkpoint
or the new complete one, never a half-written file; a stale temporary file from a crash is
ignored by :func:`load_checkpoint` and overwritten later.

Before the first batch :func:`check_writable` makes sure the checkpoint can be written (a
read-only folder fails at once, not after the work), and :func:`load_checkpoint` refuses a file
that is not a geolens checkpoint without ever suggesting to unpickle it.

Because the accumulators of :mod:`geolens.streaming` are float64 and deterministic, a run that
is killed and resumed from a checkpoint gives bit-identical final numbers to an uninterrupted
run over the same batches.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from geolens.data import as_token_tensor
from geolens.errors import ResumeRefused
from geolens.files import umask

FORMAT_VERSION = 2  # 2: the fingerprint holds the model and the analyses' arguments


class WriteError(OSError):
    """A write that failed (full disk, permissions, read-only folder), said in one line that names
    the file and what was kept; ``errno`` is the original one."""

    def __init__(self, err: OSError, message: str):
        super().__init__(err.errno, err.strerror, err.filename)
        self.message = f"{message} ({err.strerror or type(err).__name__})"

    def __str__(self) -> str:
        return self.message


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: temp file in the same folder, fsync, ``os.replace``."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        os.fchmod(fd, 0o666 & ~umask())  # mkstemp's 0600 would hide the file from the user's group
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    """Make the rename durable (POSIX); a no-op where directories cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def json_default(value):
    """``json.dumps(..., default=json_default)``: what JSON cannot write by itself, a numpy or torch
    number as the Python number it holds (``.item()``), anything else as its ``str``.

    >>> import numpy as np
    >>> json.dumps({"n": np.int64(3), "x": np.float32(0.5), "ok": np.bool_(True)}, default=json_default)
    '{"n": 3, "x": 0.5, "ok": true}'
    """
    item = getattr(value, "item", None)
    return item() if callable(item) else str(value)


def plain_json(value):
    """``value`` as it reads back from JSON (tuples as lists, numbers through :func:`json_default`):
    what a record saved as JSON is compared with."""
    return json.loads(json.dumps(value, default=json_default))


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save(obj, path)`` that never leaves a half-written ``path`` (see module docstring)."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    atomic_write_bytes(path, buffer.getvalue())


def tokens_fingerprint(tokens, *, block: int = 4096) -> str:
    """SHA-256 (first 16 hex digits) of the token ids (as int64) and their shape.

    Read ``block`` rows at a time, so a memmapped corpus is hashed in bounded memory.
    """
    h = hashlib.sha256(repr(tuple(int(s) for s in tokens.shape)).encode())
    for start in range(0, int(tokens.shape[0]), block):
        rows = as_token_tensor(tokens[start : start + block]).to("cpu", torch.int64).contiguous()
        h.update(rows.numpy().tobytes())
    return h.hexdigest()[:16]


MODEL_CONFIG_FIELDS = (
    "n_layers",
    "n_heads",
    "n_key_value_heads",
    "d_model",
    "d_head",
    "d_mlp",
    "d_vocab",
    "n_ctx",
    "act_fn",
    "normalization_type",
    "positional_embedding_type",
)


def _weights_sha256(tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().to("cpu", torch.float32).contiguous()
        h.update(repr(tuple(t.shape)).encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()[:16]


def state_digest(obj: Any) -> str:
    """SHA-256 of nested dicts / lists / tensors / numbers: tensors by dtype, shape and bytes
    (bit-exact), everything else by its JSON text. What a corpus checkpoint's states are checked by."""
    import numpy as np

    h = hashlib.sha256()

    def walk(x) -> None:
        if isinstance(x, torch.Tensor):
            t = x.detach().to("cpu").contiguous()
            h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        elif isinstance(x, np.ndarray):
            a = np.ascontiguousarray(x)
            h.update(f"A{a.dtype.str}{a.shape}".encode())
            h.update(a.tobytes() if a.dtype != object else repr(a.tolist()).encode())
        elif isinstance(x, Mapping):
            h.update(b"{")
            for k in sorted(x, key=str):
                h.update(repr(str(k)).encode())
                walk(x[k])
            h.update(b"}")
        elif isinstance(x, (list, tuple)):
            h.update(b"[")
            for v in x:
                walk(v)
            h.update(b"]")
        else:
            item = getattr(x, "item", None)
            h.update(repr(item() if callable(item) and not isinstance(x, (str, bytes)) else x).encode())

    walk(obj)
    return h.hexdigest()


def model_fingerprint(model) -> dict[str, Any]:
    """The model's identity: name, config shape, TL mode and a checksum of a few weights.

    The checksum covers ``W_O`` of the first and last layers and the first 16 rows of the
    embedding, so two models of the same architecture with other weights (another seed, another
    checkpoint, compatibility mode's centred ``W_O``) differ.
    """
    from geolens.adapter import model_mode, output_weights

    cfg = model.cfg
    name = str(getattr(cfg, "model_name", None) or type(model).__name__)
    if os.path.isabs(name):  # a local checkpoint folder: its name, so a moved cache still resumes
        name = os.path.basename(os.path.normpath(name))
    out: dict[str, Any] = {"name": name}
    for key in MODEL_CONFIG_FIELDS:
        value = getattr(cfg, key, None)
        out[key] = value if value is None or isinstance(value, (bool, int, float)) else str(value)
    out["mode"] = model_mode(model)
    tensors = [output_weights(model, 0)[0], output_weights(model, int(cfg.n_layers) - 1)[0]]
    try:
        tensors.append(model.embed.W_E[:16])
    except AttributeError:
        pass
    out["weights_sha256"] = _weights_sha256(tensors)
    return out


def writer_record(model=None) -> dict[str, Any]:
    """Who writes saved work: ``{"geolens_version", "weights_fingerprint"}``, the latter the
    fingerprint :func:`geolens.run_with_cache` stamps its caches with
    (:func:`geolens.validation.weights_fingerprint`; None without a model, or where its weights
    cannot be read). Every progress record and checkpoint keeps it (``writer``)."""
    from geolens._version import __version__
    from geolens.validation import weights_fingerprint

    weights = None
    if model is not None:
        try:
            weights = weights_fingerprint(model)
        except (NotImplementedError, RuntimeError, AttributeError, TypeError, ValueError):
            weights = None
    return {"geolens_version": __version__, "weights_fingerprint": weights}


def versions_crossed(writer: Any) -> list[str]:
    """The geolens versions a piece of saved work was resumed across (``"0.2.0 → 0.3.0"``): those
    its ``writer`` carries (``resumed_across_versions``), then its writer's version → this one
    when they differ. What a summary reports as ``resumed_across_versions``."""
    from geolens._version import __version__

    writer = writer if isinstance(writer, dict) else {}
    crossed = [str(v) for v in writer.get("resumed_across_versions") or []]
    old = writer.get("geolens_version")
    if old and str(old) != __version__:
        crossed.append(f"{old} → {__version__}")
    return crossed


def check_writer(path, saved: Any, model, *, vouch: Sequence = (), again: str) -> dict[str, Any]:
    """The ``writer`` of saved work at ``path`` (``saved``, a :func:`writer_record`) checked against
    this run's ``model``; returns the writer this run records when it saves again (its version,
    with the versions crossed carried: :func:`versions_crossed`). :class:`ResumeRefused` in one
    line, ending with ``again``, when the saved work names other weights, or names none (saved
    before geolens kept them) unless git vouches for the files ``vouch``
    (:func:`geolens.preregistration.committed_unchanged`: a finished run published in docs/). A
    model whose weights cannot be read is not checked."""
    mine = writer_record(model)
    saved = saved if isinstance(saved, dict) else {}
    theirs = saved.get("weights_fingerprint")
    if mine["weights_fingerprint"] is not None and theirs != mine["weights_fingerprint"]:
        if theirs is not None:
            raise ResumeRefused(
                f"cannot resume from {path}: it was written by a model with other weights (weights fingerprint "
                f"{theirs}, this model's is {mine['weights_fingerprint']}: other weights under the same --model?); {again}"
            )
        from geolens.preregistration import committed_unchanged

        if not (vouch and committed_unchanged(vouch)):
            raise ResumeRefused(
                f"cannot resume from {path}: it does not record the weights of the model that wrote it (saved before "
                f"geolens kept them), so this model cannot be checked against them; {again}"
            )
    crossed = versions_crossed(saved)
    return dict(mine, resumed_across_versions=crossed) if crossed else mine


def analyses_fingerprint(analyses: Sequence) -> list[dict[str, Any]]:
    """Class name and constructor arguments (``config()``) of every analysis, in order."""
    from geolens.streaming import plain_config

    out = []
    for a in analyses:
        config = a.config() if callable(getattr(a, "config", None)) else {}
        out.append({"class": type(a).__qualname__, "args": plain_config(config)})
    return out


def run_fingerprint(
    tokens, analyses: Sequence, batch_size: int, shard: tuple[int, int] = (0, 1), model=None
) -> dict[str, Any]:
    """What a checkpoint must agree with to be resumed (see module docstring)."""
    shape = tuple(int(s) for s in tokens.shape)
    out = {
        "n_sequences": shape[0],
        "seq_len": shape[1] if len(shape) > 1 else None,
        "batch_size": int(batch_size),
        "tokens_sha256": tokens_fingerprint(tokens),
        "analyses": analyses_fingerprint(analyses),
        "shard": [int(shard[0]), int(shard[1])],
    }
    if model is not None:
        out["model"] = model_fingerprint(model)
    return out


def check_writable(path) -> None:
    """Make sure a checkpoint can be written at ``path`` (its folder is created if needed).

    A probe file is created and removed in the folder, which tests what :func:`save_checkpoint`
    will do (permission bits alone say nothing for root or on read-only mounts).
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"checkpoint {path} is a folder; pass a file path")
    folder = path.parent if str(path.parent) else Path(".")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=folder)
    except OSError as err:
        raise ValueError(f"checkpoint folder {folder} is not writable ({err.strerror or type(err).__name__})") from err
    os.close(fd)
    os.unlink(probe)


def save_checkpoint(
    path, analyses: Sequence, next_batch: int, fingerprint: dict[str, Any], writer: dict | None = None
) -> None:
    """Atomically write the states of ``analyses`` after ``next_batch`` batches, with ``writer``
    (:func:`writer_record` of the model: its weights fingerprint and the geolens version).

    A failed write (full disk, permissions) raises :class:`WriteError` naming the checkpoint;
    the checkpoint saved before stays intact (the write goes to a temporary file first).
    """
    states = [a.state_dict() for a in analyses]
    state = {
        "format": FORMAT_VERSION,
        "next_batch": int(next_batch),
        "states": states,
        "fingerprint": fingerprint,
        "torch_rng": torch.get_rng_state(),
        "digest": state_digest({"next_batch": int(next_batch), "states": states}),
        "writer": writer if writer is not None else writer_record(),
    }
    try:
        atomic_torch_save(state, path)
    except OSError as err:
        kept = "the checkpoint saved before is intact" if Path(path).exists() else "no checkpoint was saved yet"
        raise WriteError(err, f"cannot write the checkpoint {path}; {kept}") from err


def _not_a_checkpoint(path, reason: str) -> ValueError:
    return ResumeRefused(
        f"{path} is not a readable geolens checkpoint ({reason}); delete it or pass another checkpoint path"
    )


def load_checkpoint(path, *, trusted: bool = False) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint`.

    By default only tensors and plain containers are unpickled (``weights_only=True``); pass
    ``trusted=True`` for states that hold other Python objects (only for files you wrote).
    A file that is not a ``torch.save`` archive, or cannot be read, is refused as such: the
    message never suggests ``trusted=True`` for it.
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"checkpoint {path} is a folder; pass a file path")
    if not zipfile.is_zipfile(path):
        raise _not_a_checkpoint(path, "not a torch.save archive")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=not trusted)
    except Exception as err:  # noqa: BLE001 - re-raised with the file named
        text = str(err)
        if not trusted and "Unsupported global" in text:  # a real archive with Python objects in it
            name = text.split("Unsupported global:", 1)[1].split(" was not", 1)[0].strip()
            raise ValueError(
                f"checkpoint {path} holds Python objects ({name}) besides tensors and plain containers; "
                "if you wrote it yourself, load it with trusted=True (run_corpus(..., trusted_checkpoint=True))"
            ) from err
        reason = (
            type(err).__name__
            if "weights_only" in text
            else f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"
        )
        raise _not_a_checkpoint(path, reason) from err
    if not isinstance(ckpt, dict) or "format" not in ckpt:
        raise _not_a_checkpoint(path, "no geolens checkpoint format")
    if ckpt.get("format") != FORMAT_VERSION:
        raise ResumeRefused(
            f"checkpoint {path} has format {ckpt.get('format')!r}, this geolens writes format {FORMAT_VERSION} "
            "(it records the model and the analyses' arguments); delete it to start again"
        )
    return ckpt


def check_fingerprint(path, saved: dict[str, Any], expected: dict[str, Any]) -> None:
    """Raise a ValueError naming every field where the checkpoint disagrees with this run."""
    from geolens.streaming import config_differences

    def short(value) -> str:
        text = repr(value)
        return text if len(text) <= 120 else text[:119] + "…"

    diffs = [f"{p}: checkpoint {short(a)}, this run {short(b)}" for p, a, b in config_differences(saved, expected)]
    if diffs:
        raise ResumeRefused(
            f"checkpoint {path} was written by a different run ({'; '.join(diffs)}); delete it or "
            "pass another checkpoint path"
        )


def restore(path, analyses: Sequence, fingerprint: dict[str, Any], *, trusted: bool = False, model=None) -> int:
    """Load the states of ``analyses`` from ``path`` and return the batch index to resume at
    (:func:`restore_checked`)."""
    return restore_checked(path, analyses, fingerprint, trusted=trusted, model=model)[0]


def restore_checked(
    path, analyses: Sequence, fingerprint: dict[str, Any], *, trusted: bool = False, model=None
) -> tuple[int, dict]:
    """Load the states of ``analyses`` from ``path``: (the batch index to resume at, the writer the
    resumed run records, :func:`check_writer`). Refused (:class:`ResumeRefused`, one line) when the
    checkpoint was written for another run, has no digest of its states (saved before digests were
    kept: never trusted), does not match its digest, or names other weights than ``model``'s, or
    none. A resume under another geolens version is said in a warning and carried in the
    checkpoint (``writer.resumed_across_versions``)."""
    import warnings

    ckpt = load_checkpoint(path, trusted=trusted)
    check_fingerprint(path, ckpt["fingerprint"], fingerprint)
    again = "delete it or pass another checkpoint path"
    if not isinstance(ckpt.get("states"), list) or not isinstance(ckpt.get("next_batch"), int):
        raise ResumeRefused(
            f"cannot resume from {path}: the checkpoint is malformed (no states or batch index); {again}"
        )
    if "digest" not in ckpt:
        raise ResumeRefused(
            f"cannot resume from {path}: it has no digest of its batch index and states (saved before geolens "
            f"kept one), so they cannot be checked; {again}"
        )
    if ckpt["digest"] != state_digest({"next_batch": ckpt["next_batch"], "states": ckpt["states"]}):
        raise ResumeRefused(
            f"cannot resume from {path}: its batch index or states were changed after it was saved (digest differs); "
            + again
        )
    if len(ckpt["states"]) != len(analyses):
        raise ValueError(f"checkpoint {path} has {len(ckpt['states'])} analysis states, this run has {len(analyses)}")
    writer = check_writer(path, ckpt.get("writer"), model, again=again)
    if writer.get("resumed_across_versions"):
        warnings.warn(
            f"resuming {path} across geolens versions ({', '.join(writer['resumed_across_versions'])})", stacklevel=3
        )
    for analysis, state in zip(analyses, ckpt["states"]):
        analysis.load_state_dict(state)
    torch.set_rng_state(ckpt["torch_rng"])
    return int(ckpt["next_batch"]), writer
