"""Atomic, resumable checkpoints of corpus-analysis states (issue 7, "Resumable runs").

A checkpoint is one ``torch.save`` file holding

- ``next_batch``: the index of the first batch not yet folded into the states;
- ``states``: ``[analysis.state_dict() for analysis in analyses]``;
- ``fingerprint``: what the run was over (number of sequences, sequence length, batch size, a
  hash of the token ids, the analyses' class names, the shard) — resuming against other data
  would silently give wrong numbers, so a mismatch raises;
- ``torch_rng``: the CPU generator state, so that analyses that draw random numbers (random
  controls) continue the same stream after a resume.

Writes are atomic: the file is written to a temporary file *in the same folder*, flushed and
``fsync``-ed, then moved over the old one with ``os.replace`` (atomic on POSIX and Windows for
paths on one file system). A crash at any point leaves either the previous complete checkpoint
or the new complete one, never a half-written file; a stale temporary file from a crash is
ignored by :func:`load_checkpoint` and overwritten later.

Because the accumulators of :mod:`geolens.streaming` are float64 and deterministic, a run that
is killed and resumed from a checkpoint gives bit-identical final numbers to an uninterrupted
run over the same batches.
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
from pathlib import Path
from typing import Any, Sequence

import torch

FORMAT_VERSION = 1


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: temp file in the same folder, fsync, ``os.replace``."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
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


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save(obj, path)`` that never leaves a half-written ``path`` (see module docstring)."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    atomic_write_bytes(path, buffer.getvalue())


def tokens_fingerprint(tokens, *, block: int = 4096) -> str:
    """SHA-256 (first 16 hex digits) of the token ids (as int64) and their shape.

    Read ``block`` rows at a time, so a memmapped corpus is hashed in bounded memory.
    """
    from geolens.runner import as_token_tensor

    h = hashlib.sha256(repr(tuple(int(s) for s in tokens.shape)).encode())
    for start in range(0, int(tokens.shape[0]), block):
        rows = as_token_tensor(tokens[start : start + block]).to("cpu", torch.int64).contiguous()
        h.update(rows.numpy().tobytes())
    return h.hexdigest()[:16]


def run_fingerprint(tokens, analyses: Sequence, batch_size: int, shard: tuple[int, int] = (0, 1)) -> dict[str, Any]:
    """What a checkpoint must agree with to be resumed (see module docstring)."""
    shape = tuple(int(s) for s in tokens.shape)
    return {
        "n_sequences": shape[0],
        "seq_len": shape[1] if len(shape) > 1 else None,
        "batch_size": int(batch_size),
        "tokens_sha256": tokens_fingerprint(tokens),
        "analyses": [type(a).__qualname__ for a in analyses],
        "shard": [int(shard[0]), int(shard[1])],
    }


def save_checkpoint(path, analyses: Sequence, next_batch: int, fingerprint: dict[str, Any]) -> None:
    """Atomically write the states of ``analyses`` after ``next_batch`` batches."""
    atomic_torch_save(
        {
            "format": FORMAT_VERSION,
            "next_batch": int(next_batch),
            "states": [a.state_dict() for a in analyses],
            "fingerprint": fingerprint,
            "torch_rng": torch.get_rng_state(),
        },
        path,
    )


def load_checkpoint(path, *, trusted: bool = False) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint`.

    By default only tensors and plain containers are unpickled (``weights_only=True``); pass
    ``trusted=True`` for states that hold other Python objects (only for files you wrote).
    """
    path = Path(path)
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=not trusted)
    except Exception as err:  # noqa: BLE001 - re-raised with the file named
        if not trusted and "weights_only" in str(err):
            raise ValueError(
                f"checkpoint {path} holds objects other than tensors and plain containers; if you "
                "wrote it yourself, load it with trusted=True (run_corpus(..., trusted_checkpoint=True))"
            ) from err
        raise ValueError(f"checkpoint {path} could not be read ({type(err).__name__}: {err})") from err
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT_VERSION:
        raise ValueError(f"{path} is not a geolens checkpoint (format {FORMAT_VERSION})")
    return ckpt


def check_fingerprint(path, saved: dict[str, Any], expected: dict[str, Any]) -> None:
    """Raise a ValueError naming every field where the checkpoint disagrees with this run."""
    diffs = [f"{k}: checkpoint {saved.get(k)!r}, this run {v!r}" for k, v in expected.items() if saved.get(k) != v]
    if diffs:
        raise ValueError(
            f"checkpoint {path} was written by a different run ({'; '.join(diffs)}); delete it or "
            "pass another checkpoint path"
        )


def restore(path, analyses: Sequence, fingerprint: dict[str, Any], *, trusted: bool = False) -> int:
    """Load the states of ``analyses`` from ``path`` and return the batch index to resume at."""
    ckpt = load_checkpoint(path, trusted=trusted)
    check_fingerprint(path, ckpt["fingerprint"], fingerprint)
    if len(ckpt["states"]) != len(analyses):
        raise ValueError(f"checkpoint {path} has {len(ckpt['states'])} analysis states, this run has {len(analyses)}")
    for analysis, state in zip(analyses, ckpt["states"]):
        analysis.load_state_dict(state)
    torch.set_rng_state(ckpt["torch_rng"])
    return int(ckpt["next_batch"])
