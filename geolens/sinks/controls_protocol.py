"""The dose-matched sink controls of docs/faithfulness/PROTOCOL.md §6: what is edited and measured.

**Dose-matched controls** (:func:`geolens.sinks.controls_dose.dose_controls`), the pre-registered test of
docs/faithfulness/PROTOCOL.md §6 (the ``"sink_controls"`` block of protocol.json, read by
:func:`read_protocol`). The sink's value vector v_0 (position 0) is edited at every sixth layer
(0, 6, 12, …, all in the same forward pass):

- norm edits v_0 ← λ v_0, λ ∈ {0, 0.5, 1.5, 2}, which move v_0 by ‖Δv_0‖ = |1 − λ|·‖v_0‖;
- rotations v_0 ← cos θ v_0 + sin θ ‖v_0‖ u by θ ∈ {30°, 60°, 90°, 180°} in the plane spanned by
  v_0 and u, the seeded Gaussian direction g of (seed, layer, kv head)
  (:func:`geolens.interventions.sink_values.rotation_direction`) orthogonalised against v_0 and
  normalised; they keep ‖v_0‖ and move it by 2 sin(θ/2)·‖v_0‖. Seeds 0–19 at 60°, 0–4 at the other
  angles; seed s gives the same plane at every angle.

The **dose** of an edit is ‖Δv_0‖/‖v_0‖ (:func:`edit_dose`): λ = 0, λ = 2 and the 60° rotation
all have dose 1. Each edit is applied to the v_0 of the forward pass it runs in: v_0 of layer 6 is
the one that layer computes after the edit of layer 0 (position 0 attends only to itself, so the
edit of layer 0 reaches it).

Scopes (:data:`SCOPES`):

- ``all_heads``: every query head of the edited layers;
- ``sink_heads``: only the query heads that are sink heads by geolens' criterion
  (:func:`geolens.sinks.controls_dose.gu_sink_heads`): Gu et al. (2024) call a head a sink head in a window when its mean
  attention on the first token, (1/T) Σ_i α_i0, exceeds ε = 0.3
  (:func:`geolens.sinks.geometry.layer_sink_statistics`), and a sink head here is one that is a
  sink head in more than half of the sample's windows (``gu_sink_share > 0.5``, the heads that
  ``geolens sinks`` counts as sink heads), found at each edited layer on the clean windows of the
  run itself.

Grouped-query attention: v_0 lives per kv head, shared by the query heads of a group, and a
group may hold sink heads and other heads. The edit is made per *query* head, exactly:
replacing v_0 by v_0' for head h alone changes its output z_i^h = Σ_j α_ij^h v_j into
z_i^h + α_i0^h (v_0' − v_0) and nothing else
(:func:`geolens.interventions.sink_values.sink_edit_query_heads`). v_0' is the same vector in
both scopes (the edit of the kv head's v_0); the ``sink_heads`` scope gives it to the sink heads
only. With every head selected this equals editing ``hook_v`` (tested).

**Sample** (:func:`geolens.sinks.controls_dose.controls_sample`): 100 windows of 64 tokens, two from each of the first 50
Lee documents that the model's tokenizer turns into at least 126 tokens (special tokens not
counted), in corpus order. Document d gives the windows [BOS] + t_0 … t_62 and
[BOS] + t_63 … t_125 (consecutive, no overlap, the rest of the document unused).

**Outcomes** per window and edit, over the window's 63 next-token predictions, in float64:
ΔPPL = exp(mean NLL edited) − exp(mean NLL clean), and the mean of KL(p_clean ‖ p_edited) of the
next-token distributions.

The statistics and verdicts are :mod:`geolens.sinks.controls_summary`'s.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal, Mapping, get_args

from geolens.interventions.sink_values import SinkEditSpec

SinkScope = Literal["all_heads", "sink_heads"]
SCOPES: tuple[str, ...] = get_args(SinkScope)
SINK_HEAD_SHARE = 0.5
"""A sink head is one that is a Gu et al. sink head (ε = 0.3) in more than this share of the windows."""
OUTCOMES: tuple[str, ...] = ("delta_ppl", "kl")
MIN_WINDOWS, MIN_DOCUMENTS = 100, 50
"""The smallest sample a verdict may come from (PROTOCOL.md §6)."""
WINDOW_COLUMNS = (
    "window",
    "document",
    "scope",
    "edit",
    "lam",
    "degrees",
    "seed",
    "dose",
    "nll_clean",
    "nll",
    "delta_ppl",
    "kl",
)
_ORDINALS = {
    "first": 1,
    "second": 2,
    "third": 3,
    "fourth": 4,
    "fifth": 5,
    "sixth": 6,
    "seventh": 7,
    "eighth": 8,
    "ninth": 9,
    "tenth": 10,
}


def edit_dose(spec: SinkEditSpec) -> float:
    """‖Δv_0‖/‖v_0‖ of an edit of v_0: |1 − λ| for ``scale``, 1 for ``remove``, 2 sin(θ/2) for a
    rotation by θ (``rotate``; 90° without ``degrees``), rounded to 12 decimals.

    >>> [edit_dose(s) for s in (SinkEditSpec("scale", 0.0), SinkEditSpec("scale", 1.5), SinkEditSpec("rotate", degrees=60))]
    [1.0, 0.5, 1.0]
    """
    if spec.kind == "scale":
        return round(abs(1.0 - float(spec.lam)), 12)
    if spec.kind == "remove":
        return 1.0
    if spec.kind == "rotate":
        theta = math.radians(90.0 if spec.degrees is None else float(spec.degrees))
        return round(2.0 * abs(math.sin(theta / 2.0)), 12)
    raise ValueError(
        f"the dose of a {spec.kind!r} edit depends on the data (it is defined for scale, remove and rotate)"
    )


@dataclass(frozen=True)
class DoseProtocol:
    """Settings of :func:`geolens.sinks.controls_dose.dose_controls`; the defaults are those of protocol v2 (PROTOCOL.md §6).

    ``layer_step``: v_0 is edited at layers 0, step, 2·step, …; ``lambdas``: the norm edits;
    ``seeds_by_angle``: ((θ in degrees, number of seeds), …), seeds 0 … n − 1 at each angle;
    ``n_documents`` × ``windows_per_document`` windows of ``seq_len`` tokens (:func:`~geolens.sinks.controls_dose.controls_sample`);
    ``matched_dose``: the dose of the verdict; ``n_boot``, ``seed``, ``alpha``: the bootstrap and
    Holm's level; ``corpus``: where the documents come from.

    >>> p = DoseProtocol()
    >>> p.layers(30), p.n_windows, p.matched_lambdas, p.matched_degrees, len(p.edits())
    ([0, 6, 12, 18, 24], 100, (0.0, 2.0), (60.0,), 39)
    """

    layer_step: int = 6
    lambdas: tuple[float, ...] = (0.0, 0.5, 1.5, 2.0)
    seeds_by_angle: tuple[tuple[float, int], ...] = ((30.0, 5), (60.0, 20), (90.0, 5), (180.0, 5))
    n_documents: int = 50
    windows_per_document: int = 2
    seq_len: int = 64
    scopes: tuple[str, ...] = SCOPES
    matched_dose: float = 1.0
    n_boot: int = 2000
    seed: int = 0
    alpha: float = 0.05
    corpus: str = "lee"

    def __post_init__(self):
        def put(name, value):
            object.__setattr__(self, name, value)

        put("lambdas", tuple(float(x) for x in self.lambdas))
        put("seeds_by_angle", tuple(sorted((float(a), int(n)) for a, n in self.seeds_by_angle)))
        put("scopes", tuple(str(x) for x in self.scopes))
        for name in ("layer_step", "n_documents", "windows_per_document", "n_boot"):
            if int(getattr(self, name)) != getattr(self, name) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be an integer ≥ 1, got {getattr(self, name)!r}")
        if self.seq_len < 3:
            raise ValueError(f"seq_len must be at least 3 (BOS and two tokens), got {self.seq_len}")
        if (
            not self.lambdas
            or not all(math.isfinite(x) for x in self.lambdas)
            or 1.0 in self.lambdas
            or len(set(self.lambdas)) < len(self.lambdas)
        ):
            raise ValueError(
                f"lambdas must be distinct finite numbers other than 1 (λ = 1 edits nothing), got {list(self.lambdas)}"
            )
        angles = [a for a, _ in self.seeds_by_angle]
        if not angles or len(set(angles)) < len(angles) or not all(0 < a <= 360 and math.isfinite(a) for a in angles):
            raise ValueError(f"rotation angles must be distinct degrees in (0, 360], got {angles}")
        if any(n < 1 for _, n in self.seeds_by_angle):
            raise ValueError(f"every angle needs at least one seed, got {dict(self.seeds_by_angle)}")
        if not self.scopes or len(set(self.scopes)) < len(self.scopes) or any(x not in SCOPES for x in self.scopes):
            raise ValueError(f"scopes must be distinct names from {', '.join(SCOPES)}, got {list(self.scopes)}")
        if not (math.isfinite(self.matched_dose) and self.matched_dose > 0):
            raise ValueError(f"matched_dose must be a positive number, got {self.matched_dose}")
        if not self.matched_lambdas or not self.matched_degrees:
            raise ValueError(
                f"the verdict needs a norm edit and a rotation of dose {self.matched_dose:g}: "
                f"lambdas {list(self.lambdas)} and angles {angles} give none for one of them"
            )
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha}")

    @property
    def degrees(self) -> tuple[float, ...]:
        return tuple(a for a, _ in self.seeds_by_angle)

    @property
    def n_windows(self) -> int:
        return self.n_documents * self.windows_per_document

    def seeds(self, degrees: float) -> tuple[int, ...]:
        """The rotation seeds at ``degrees``: 0 … n − 1."""
        return tuple(range(dict(self.seeds_by_angle)[float(degrees)]))

    def layers(self, n_layers: int) -> list[int]:
        """The edited layers of a model with ``n_layers`` layers: 0, step, 2·step, …"""
        return list(range(0, int(n_layers), self.layer_step))

    def _matched(self, spec: SinkEditSpec) -> bool:
        return math.isclose(edit_dose(spec), self.matched_dose, rel_tol=1e-9)

    @property
    def matched_lambdas(self) -> tuple[float, ...]:
        return tuple(x for x in self.lambdas if self._matched(SinkEditSpec("scale", x)))

    @property
    def matched_degrees(self) -> tuple[float, ...]:
        return tuple(a for a in self.degrees if self._matched(SinkEditSpec("rotate", degrees=a)))

    def edits(self) -> list[SinkEditSpec]:
        """Every edit of one scope: the norm edits by λ, then the rotations by angle and seed."""
        specs = [SinkEditSpec("scale", x) for x in self.lambdas]
        return specs + [SinkEditSpec("rotate", seed=s, degrees=a) for a in self.degrees for s in self.seeds(a)]

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["lambdas"], out["scopes"] = list(self.lambdas), list(self.scopes)
        out["seeds_by_angle"] = {f"{a:g}": n for a, n in self.seeds_by_angle}
        return out

    @classmethod
    def from_dict(cls, d: Mapping) -> "DoseProtocol":
        """The inverse of :meth:`to_dict` (e.g. from a saved ``controls_summary.json``'s ``settings``)."""
        d = dict(d)
        d["seeds_by_angle"] = tuple((float(a), int(n)) for a, n in dict(d["seeds_by_angle"]).items())
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})

    def differences(self, other: "DoseProtocol") -> list[str]:
        """The settings in which this protocol differs from ``other``, one phrase each."""
        mine, theirs = self.to_dict(), other.to_dict()
        return [f"{k} {mine[k]!r} instead of {theirs[k]!r}" for k in mine if mine[k] != theirs[k]]


def _need(block: dict, key: str, where: str):
    if key not in block:
        raise ValueError(f"{where} has no {key!r}")
    return block[key]


def _layer_step(text) -> int:
    """6 from "every sixth layer" (or "every 6th layer", or 6)."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    m = re.fullmatch(r"every (\w+) layer", str(text).strip())
    word = m.group(1) if m else ""
    if word in _ORDINALS:
        return _ORDINALS[word]
    digits = re.fullmatch(r"(\d+)(st|nd|rd|th)", word)
    if digits:
        return int(digits.group(1))
    raise ValueError(f"sink_controls.layers: expected 'every <ordinal> layer' (e.g. 'every sixth layer'), got {text!r}")


def read_protocol(source) -> tuple[DoseProtocol, dict]:
    """The dose-matched controls of a pre-registered protocol: ``source`` is the path of its
    machine-readable twin (``docs/faithfulness/protocol.json``) or the twin already read by
    :func:`geolens.faithfulness.preregistered.load_protocol`, which also hashes the text
    ``PROTOCOL.md`` beside it.

    Returns (:class:`DoseProtocol`, provenance): ``protocol_file``, ``protocol_version``,
    ``protocol_sha256`` (SHA-256 of the text), ``pre_registered`` (the text and the twin are the
    ones registered in ``REGISTERED.json`` beside them: :mod:`geolens.preregistration`), and the protocol's ``models``, ``model_mode`` and
    ``dtype``. The ``"sink_controls"`` block gives the edits, seeds, sample and scopes;
    ``"statistics"`` ``n_boot``, ``seed`` and ``alpha``; ``"data"`` the corpus. Anything missing or
    of the wrong kind is a ``ValueError`` naming it.
    """
    from geolens.preregistration import Preregistered, load_protocol

    twin = source if isinstance(source, Preregistered) else load_protocol(source)
    path, raw = Path(twin.path), twin.settings
    if not isinstance(raw, dict) or not isinstance(raw.get("sink_controls"), dict):
        raise ValueError(f'{path}: no "sink_controls" block (a protocol.json of geolens\' faithfulness protocol)')
    block, where = raw["sink_controls"], f"{path}: sink_controls"
    stats = raw.get("statistics") if isinstance(raw.get("statistics"), dict) else {}
    data = raw.get("data") if isinstance(raw.get("data"), dict) else {}
    try:
        by_angle = _need(block, "rotation_seeds_by_angle", where)
        if not isinstance(by_angle, dict):
            raise ValueError(f"{where}.rotation_seeds_by_angle must map angles to seed counts")
        seeds = tuple((float(a), int(n)) for a, n in by_angle.items())
        listed = sorted(float(a) for a in _need(block, "rotation_degrees", where))
        if listed != sorted(a for a, _ in seeds):
            raise ValueError(f"{where}: rotation_degrees {listed} and the angles of rotation_seeds_by_angle differ")
        n_windows, n_documents = int(_need(block, "n_windows", where)), int(_need(block, "n_documents", where))
        if n_documents < 1 or n_windows % n_documents:
            raise ValueError(
                f"{where}: n_windows {n_windows} is not a whole number of windows per document ({n_documents} documents)"
            )
        outcomes = list(block.get("outcomes", OUTCOMES))
        if sorted(outcomes) != sorted(OUTCOMES):
            raise ValueError(f"{where}.outcomes: this code measures {list(OUTCOMES)}, the protocol asks for {outcomes}")
        if block.get("multiple_comparison", "holm") != "holm":
            raise ValueError(
                f"{where}.multiple_comparison: only holm is implemented, got {block['multiple_comparison']!r}"
            )
        protocol = DoseProtocol(
            layer_step=_layer_step(_need(block, "layers", where)),
            lambdas=tuple(float(x) for x in _need(block, "lambdas", where)),
            seeds_by_angle=seeds,
            n_documents=n_documents,
            windows_per_document=n_windows // n_documents,
            seq_len=int(_need(block, "seq_len", where)),
            scopes=tuple(_need(block, "scopes", where)),
            matched_dose=float(_need(block, "matched_dose", where)),
            n_boot=int(stats.get("n_boot", 2000)),
            seed=int(stats.get("seed", 0)),
            alpha=float(stats.get("alpha", 0.05)),
            corpus=str(data.get("corpus", "lee")),
        )
    except (TypeError, AttributeError) as err:
        raise ValueError(f"{where}: a setting has the wrong type ({err})") from None
    info = {
        "protocol_file": str(path),
        "protocol_version": raw.get("version"),
        "protocol_sha256": twin.sha256,
        "pre_registered": not twin.hash_reasons(),
        "models": list(data.get("models", [])),
        "model_mode": data.get("model_mode"),
        "dtype": data.get("dtype"),
    }
    return protocol, info


def protocol_deviations(
    protocol: DoseProtocol, registered: DoseProtocol, info: dict, *, model: str, mode: str, dtype: str
) -> list[str]:
    """Where a run departs from the protocol's settings (empty: it runs the protocol): settings
    other than the registered ones, a model, TransformerLens mode or dtype other than the
    protocol's. Whether the protocol's files are the registered ones is checked by
    :func:`geolens.preregistration.preregistration`, which adds these reasons to its own."""
    out = protocol.differences(registered)
    if info.get("models") and model not in info["models"]:
        out.append(f"model {model} is not one of the protocol's ({', '.join(info['models'])})")
    if info.get("model_mode") and mode != info["model_mode"]:
        out.append(f"model mode {mode} instead of {info['model_mode']}")
    if info.get("dtype") and dtype != info["dtype"]:
        out.append(f"dtype {dtype} instead of {info['dtype']}")
    if protocol.n_windows < MIN_WINDOWS or protocol.n_documents < MIN_DOCUMENTS:
        out.append(
            f"{protocol.n_windows} windows from {protocol.n_documents} documents, fewer than {MIN_WINDOWS} from {MIN_DOCUMENTS}"
        )
    return out


__all__ = [
    "MIN_DOCUMENTS",
    "MIN_WINDOWS",
    "OUTCOMES",
    "SCOPES",
    "SINK_HEAD_SHARE",
    "WINDOW_COLUMNS",
    "DoseProtocol",
    "edit_dose",
    "protocol_deviations",
    "read_protocol",
]
