"""The reference set: protocol 3's published float64 per-term effects, shipped with geolens, so
that scoring a metric needs only forward passes (docs/evaluate.md).

Protocol 3 (docs/faithfulness/v3/PROTOCOL.md) removed every attention term α_ij^h ṽ_j^h of 200
(layer, query) positions of 100 Lee documents on SmolLM2-135M and of 100 positions on Gemma 3 270M,
one term at a time, and measured the KL of each removal in float64 (``per_term_terms.csv.gz`` of
docs/faithfulness/v3/<model>/). Measuring those effects again costs about 45 minutes a model on
two cores; scoring a method's values of the same terms costs one forward pass a document.

Each model's set (``reference_effects/<model>.npz`` beside this module) holds:

- ``tokens``: the 100 windows of token ids (BOS first), as protocol 3 cut them from the Lee corpus
  (:func:`geolens.faithfulness.preregistered.protocol_windows`), so no corpus is needed;
- ``positions``: one row per drawn position (document, position, layer, query, the numerical floor
  and the counts of the published table);
- ``terms``: one row per measured term (document, position, head, source), with its KL, its
  Δ log p of the next token, its norm ‖α ṽ‖ and raw attention α (the evaluation's reference rows),
  every float64 value as published (bit for bit: ``scripts/build_reference_set.py`` checks it).

``reference_effects/<model>.json`` records where it came from: the published files' SHA-256, the
protocol's hash, the sizes. :func:`load_reference` reads a set; ``evaluate_attribution(method,
"smollm2-135m")`` scores against it (:mod:`geolens.faithfulness.evaluation`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from geolens.resume import records_digest, sha256_bytes

DATA = Path(__file__).resolve().with_name("reference_effects")
MODELS = ("smollm2-135m", "gemma3-270m")
"""The models with a shipped reference set (protocol 3's two models)."""
TERM_COLUMNS = {
    "document": np.int16,
    "position": np.int8,
    "head": np.int8,
    "source": np.int16,
    "kl": np.float64,
    "delta_logp_next": np.float64,
    "norm": np.float64,
    "raw_attention": np.float64,
}
POSITION_COLUMNS = {
    "document": np.int16,
    "position": np.int8,
    "layer": np.int16,
    "query": np.int16,
    "n_terms": np.int32,
    "next_token": np.int64,
    "clean_top_prob": np.float64,
    "floor": np.float64,
    "reference_kl": np.float64,
    "floor_delta_logp_next": np.float64,
    "kl_max": np.float64,
    "kl_min": np.float64,
    "kl_sum": np.float64,
    "n_resolvable": np.int32,
}
NORM_RTOL = 1e-4
"""A model whose recomputed norms ‖α ṽ‖ differ from the set's by more than this (relative) is not
the model the set was measured on, and is refused. The bridge the set was measured on gives them
to 1e-12; TransformerLens 2.x's HookedTransformer of the same checkpoint (its RMS norms folded into
the weights in float32) to 3.1e-6; other weights differ by orders of magnitude more."""


@dataclass(frozen=True)
class ReferenceSet:
    """One model's shipped effects (module docstring).

    Attributes:
        model_name: the :func:`geolens.load_model` name the effects were measured on.
        tokens: the windows, ``[n_documents, seq_len]`` token ids.
        positions: one row per (document, position) with its layer and query.
        terms: one row per measured term, with ``layer`` and ``query`` joined from ``positions``.
        info: the provenance record (``reference_effects/<model>.json``).

    >>> ref = load_reference("smollm2-135m")
    >>> ref.tokens.shape, len(ref.positions), len(ref.terms)
    ((100, 128), 200, 122823)
    """

    model_name: str
    tokens: torch.Tensor
    positions: pd.DataFrame
    terms: pd.DataFrame
    info: dict

    @property
    def n_documents(self) -> int:
        return int(self.tokens.shape[0])

    def subset(self, n_documents: int) -> ReferenceSet:
        """The first ``n_documents`` documents (their positions and terms)."""
        n = int(n_documents)
        if not 1 <= n <= self.n_documents:
            raise ValueError(
                f"n_documents must be between 1 and {self.n_documents} (the {self.model_name} reference set), got {n_documents!r}"
            )
        keep_p, keep_t = self.positions.document < n, self.terms.document < n
        return ReferenceSet(
            self.model_name,
            self.tokens[:n],
            self.positions[keep_p].reset_index(drop=True),
            self.terms[keep_t].reset_index(drop=True),
            self.info,
        )


def _paths(model_name: str, folder: Path) -> tuple[Path, Path]:
    return folder / f"{model_name}.npz", folder / f"{model_name}.json"


def has_reference(model_name) -> bool:
    """Whether ``model_name`` has a shipped reference set."""
    return isinstance(model_name, str) and model_name in MODELS and _paths(model_name, DATA)[0].is_file()


_LOADED: dict[tuple[str, str], ReferenceSet] = {}


def load_reference(model_name: str, folder: Path | None = None) -> ReferenceSet:
    """The shipped reference set of ``model_name`` (one of :data:`MODELS`), read once per process.
    Its file's SHA-256 is checked against the provenance record: a changed file is refused."""
    if model_name not in MODELS:
        raise ValueError(f"no reference set for {model_name!r}: the shipped ones are {', '.join(MODELS)}")
    folder = DATA if folder is None else Path(folder)
    key = (model_name, str(folder))
    if key in _LOADED:
        return _LOADED[key]
    npz, record = _paths(model_name, folder)
    if not npz.is_file() or not record.is_file():
        raise FileNotFoundError(f"the {model_name} reference set is missing ({npz}): reinstall geolens")
    info = json.loads(record.read_text(encoding="utf-8"))
    if sha256_bytes(npz.read_bytes()) != info.get("npz_sha256"):
        raise ValueError(f"{npz} does not match its record {record.name} (SHA-256): reinstall geolens")
    with np.load(npz, allow_pickle=False) as data:
        tokens = torch.from_numpy(data["tokens"].astype(np.int64))
        positions = pd.DataFrame({c: data[f"positions.{c}"] for c in POSITION_COLUMNS})
        terms = pd.DataFrame({c: data[f"terms.{c}"] for c in TERM_COLUMNS})
    positions = positions.astype({c: np.int64 for c, t in POSITION_COLUMNS.items() if np.issubdtype(t, np.integer)})
    terms = terms.astype({c: np.int64 for c, t in TERM_COLUMNS.items() if np.issubdtype(t, np.integer)})
    terms = terms.merge(positions[["document", "position", "layer", "query"]], on=["document", "position"])
    order = ["document", "position", "layer", "query", "head", "source"]
    terms = terms[order + [c for c in terms.columns if c not in order]]
    ref = ReferenceSet(model_name, tokens, positions, terms, info)
    _LOADED[key] = ref
    return ref


def write_reference(
    folder: Path, model_name: str, tokens: torch.Tensor, positions: pd.DataFrame, terms: pd.DataFrame, info: dict
) -> Path:
    """Write ``<model>.npz`` and its record ``<model>.json`` into ``folder`` (scripts/build_reference_set.py)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    npz, record = _paths(model_name, folder)
    arrays = {"tokens": tokens.cpu().numpy().astype(np.int32)}
    for c, t in POSITION_COLUMNS.items():
        arrays[f"positions.{c}"] = positions[c].to_numpy().astype(t)
    for c, t in TERM_COLUMNS.items():
        arrays[f"terms.{c}"] = terms[c].to_numpy().astype(t)
    for name, values in arrays.items():  # the narrow integer types hold every value
        source = positions if name.startswith("positions.") else terms if name.startswith("terms.") else None
        if source is not None and not np.array_equal(values, source[name.split(".", 1)[1]].to_numpy()):
            raise ValueError(f"{name} does not fit {values.dtype}")
    np.savez_compressed(npz, **arrays)
    info = dict(info, npz_sha256=sha256_bytes(npz.read_bytes()), n_documents=int(tokens.shape[0]))
    info.update(n_positions=int(len(positions)), n_terms=int(len(terms)))
    record.write_text(json.dumps(info, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    _LOADED.pop((model_name, str(folder)), None)
    return npz


def check_norms(model_name: str, recomputed: np.ndarray, stored: np.ndarray) -> None:
    """Refuse, in one line, a model whose norms ‖α ṽ‖ of the reference terms differ from the set's
    (it is not the model the effects were measured on)."""
    scale = np.maximum(np.abs(stored), 1e-12)
    worst = float(np.max(np.abs(recomputed - stored) / scale)) if len(stored) else 0.0
    if not worst <= NORM_RTOL:
        raise ValueError(
            f"this model is not the one the {model_name} reference set was measured on (its terms' norms ‖α ṽ‖ "
            f"differ by up to {worst:.2g}, relative): load it with geolens.load_model({model_name!r}), or pass texts"
        )


def layers_key(weights: str, ref: ReferenceSet) -> str:
    """The cache key of the reference set's drawn layers' hook tensors (pattern, values, z: what a
    method's scores are read from, :func:`geolens.faithfulness.method_scores.layer_caches`) as
    ``weights`` (:func:`geolens.validation.weights_fingerprint`) compute them: the first scoring
    against the set runs each document's forward up to its last drawn layer and caches them
    (:func:`geolens.faithfulness.effects_cache.save_arrays`, float64: about 150 MB for SmolLM2, 80 MB
    for Gemma 3); every later method runs no forward."""
    record = dict(kind="reference layers", format=1, weights=str(weights), set=ref.info["npz_sha256"])
    return records_digest(record)


__all__ = [
    "MODELS",
    "ReferenceSet",
    "check_norms",
    "has_reference",
    "load_reference",
    "layers_key",
    "write_reference",
]
