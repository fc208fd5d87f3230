"""An on-disk cache of protocol 3's per-term effects, one file per document, so that scoring a
second metric on the same texts reuses the effects the first one measured (docs/evaluate.md).

:func:`geolens.evaluate_attribution` measures, per document, the float64 KL of removing each
attention term of its drawn positions (:func:`geolens.faithfulness.norm_controlled.norm_controlled_document`):
tens of seconds a document on two cores, and the same for every metric. The effects depend on the
weights, the protocol, the document's tokens, its index (which draws the positions), the positions
per document, the query range and the batch size of the removals (batched forwards can round
differently), never on the metric. :func:`effects_key` hashes exactly those; the file
``<cache>/effects/<key>.npz`` (:func:`geolens.model_cache.cache_dir`) keeps the document's
``terms`` and ``positions`` tables, the key inside it. A file whose key, columns or arrays do not
read back is measured again and replaced, never trusted; a cache folder that cannot be written is
skipped with a warning.
"""

from __future__ import annotations

import os
import tempfile
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from geolens.resume import records_digest

PROTOCOL = "docs/faithfulness/v3/PROTOCOL.md"
FORMAT = 1
FOLDER: Path | None = None
"""A folder of one's own for the cache (None: ``<cache>/effects``); the test suite sets it so that
its runs never touch the user's cache."""


def protocol_sha256() -> str:
    """Protocol 3's registered text hash (geolens/registered_protocols.json, installed with geolens)."""
    from geolens.preregistration import registry

    return str(registry()["faithfulness/v3"]["text_sha256"])


def effects_key(
    weights: str, tokens: torch.Tensor, document_index: int, n_positions: int, queries, batch_size: int
) -> str:
    """The cache key of one document's effects: SHA-256 of what they depend on (module docstring).

    >>> t = torch.tensor([[1, 2, 3]])
    >>> effects_key("w", t, 0, 2, (8, 126), 128) == effects_key("w", t.clone(), 0, 2, (8, 126), 128)
    True
    >>> effects_key("w", t, 0, 2, (8, 126), 128) == effects_key("w", t, 1, 2, (8, 126), 128)
    False
    """
    record = dict(
        format=FORMAT,
        weights=str(weights),
        protocol=protocol_sha256(),
        tokens=[int(x) for x in tokens.reshape(-1).tolist()],
        document=int(document_index),
        n_positions=int(n_positions),
        queries=[int(q) for q in queries],
        batch_size=int(batch_size),
    )
    return records_digest(record)


def cache_folder() -> Path:
    """:data:`FOLDER`, else ``effects`` in :func:`geolens.model_cache.cache_dir` (``$GEOLENS_CACHE``, ...)."""
    from geolens.model_cache import cache_dir

    return FOLDER if FOLDER is not None else cache_dir() / "effects"


def _pack(frames: dict[str, pd.DataFrame], key: str) -> dict[str, np.ndarray]:
    arrays = {"key": np.array(key)}
    for name, frame in frames.items():
        arrays[f"{name}.columns"] = np.array(list(frame.columns))
        for c in frame.columns:
            arrays[f"{name}.{c}"] = frame[c].to_numpy()
    return arrays


def load_effects(key: str, folder: Path | None = None) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """The cached ``(terms, positions)`` of ``key``, or None (absent, or not readable as written)."""
    data = load_arrays(key, folder)
    if data is None:
        return None
    try:
        terms, positions = (
            pd.DataFrame({str(c): data[f"{name}.{c}"] for c in data[f"{name}.columns"]})
            for name in ("terms", "positions")
        )
    except KeyError:  # foreign arrays under this key: measured again
        return None
    if terms.empty or positions.empty or not {"kl", "norm", "layer", "query"} <= set(terms.columns):
        return None
    return terms, positions


def save_effects(key: str, terms: pd.DataFrame, positions: pd.DataFrame, folder: Path | None = None) -> Path | None:
    """Write one document's effects under ``key`` (atomically: a temporary file renamed over the
    final name); None, with a warning, where the cache folder cannot be written."""
    return _write(folder or cache_folder(), key, _pack({"terms": terms, "positions": positions}, key), compressed=True)


def _write(folder: Path, key: str, arrays: dict[str, np.ndarray], *, compressed: bool) -> Path | None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, tmp = tempfile.mkstemp(dir=folder, prefix=".effects-", suffix=".npz")
        try:
            with os.fdopen(handle, "wb") as f:
                (np.savez_compressed if compressed else np.savez)(f, **arrays)
            os.replace(tmp, folder / f"{key}.npz")
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError as err:
        warnings.warn(
            f"geolens could not cache to {folder} ({err.strerror}): set GEOLENS_CACHE to a writable folder",
            stacklevel=3,
        )
        return None
    return folder / f"{key}.npz"


def load_arrays(key: str, folder: Path | None = None) -> dict[str, np.ndarray] | None:
    """The arrays cached under ``key`` by :func:`save_arrays` or :func:`save_effects` (None: absent, a
    link, another key's, or not readable as written: truncated, foreign, damaged)."""
    path = (folder or cache_folder()) / f"{key}.npz"
    if not path.is_file() or path.is_symlink():
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            if str(data["key"]) != key:
                return None
            return {name: data[name] for name in data.files if name != "key"}
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile):
        return None


def save_arrays(key: str, arrays: dict[str, np.ndarray], folder: Path | None = None) -> Path | None:
    """Write ``arrays`` under ``key``, uncompressed (they read back several times faster so), atomically; None, with a warning, where the folder cannot be written."""
    return _write(folder or cache_folder(), key, dict(arrays, key=np.array(key)), compressed=False)


__all__ = [
    "cache_folder",
    "effects_key",
    "load_arrays",
    "load_effects",
    "protocol_sha256",
    "save_arrays",
    "save_effects",
]
