"""Pre-registered studies: one home for reading a protocol, checking its registration and
labelling a run (``pre-registered`` or ``exploratory``).

A **protocol** is a text (``PROTOCOL.md``) and its machine-readable twin (``protocol.json``) in
one folder. It is **registered** by ``REGISTERED.json`` beside them (:func:`register`): the
SHA-256 of the text and of the twin as they were fixed, with the date and commit. The studies
that run under a protocol:

=====================  ==============================================  ===========================================
study                  command                                         code
=====================  ==============================================  ===========================================
faithfulness stages    ``geolens faithfulness --protocol P``           :mod:`geolens.faithfulness.preregistered`
multiple choice        ``geolens mc --protocol P``                     :mod:`geolens.faithfulness.multiple_choice`
sink controls          ``geolens sinks --controls-protocol P``         :mod:`geolens.sinks.controls_dose`
flow erasure           ``geolens flow --erasure --protocol P``         :mod:`geolens.flow.erasure`
=====================  ==============================================  ===========================================

(the first three under docs/faithfulness/protocol.json, the last under docs/flow/protocol.json).

A run is **pre-registered** only when both hashes match the registered pair *and* the run
follows the protocol (its models, sample sizes and settings: each study lists where it departs,
its ``differences``); otherwise it is **exploratory** and :func:`preregistration` names every
reason (which file was edited, which setting differs, which model is not in the protocol). An
exploratory run decides nothing: its pairs keep estimates and intervals, and their verdict is
:data:`NOT_DECIDED` (:func:`withhold_verdicts`), never ``holds``/``reversed``. Every summary
records ``preregistration: {status, text_sha256, json_sha256, reasons}``.

Resuming a run checks what it resumes: :mod:`geolens.resume`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from geolens.files import read_json

PRE_REGISTERED = "pre-registered"
EXPLORATORY = "exploratory"
NOT_DECIDED = "not decided (exploratory)"
REGISTERED = "REGISTERED.json"
DECIDED = ("holds", "reversed", "tie")


@dataclass(frozen=True)
class Preregistered:
    """A protocol's twin (``settings``, the parsed JSON), where it was read, the SHA-256 of its
    text (``sha256``) and of the twin (``json_sha256``), and its registration (``registered``:
    the content of ``REGISTERED.json``, None when there is none)."""

    settings: dict = field(repr=False)
    path: Path
    sha256: str  # of the text (PROTOCOL.md next to the twin)
    json_sha256: str = ""
    registered: dict | None = field(default=None, repr=False)

    @property
    def version(self) -> int:
        return int(self.settings["version"])

    @property
    def text_sha256(self) -> str:
        return self.sha256

    def __getitem__(self, key: str):
        return self.settings[key]

    def hash_reasons(self) -> list[str]:
        """Why the files are not the registered ones (empty: both hashes match ``REGISTERED.json``)."""
        reg = self.registered
        where = self.path.with_name(REGISTERED)
        if reg is None:
            return [f"the protocol is not registered (no {where})"]
        out = []
        if reg.get("text_sha256") != self.sha256:
            out.append(
                f"{self.path.with_name('PROTOCOL.md')} was edited after registration "
                f"(SHA-256 {self.sha256[:12]}…, registered {str(reg.get('text_sha256'))[:12]}…)"
            )
        if reg.get("json_sha256") != self.json_sha256:
            out.append(
                f"{self.path} was edited after registration "
                f"(SHA-256 {self.json_sha256[:12]}…, registered {str(reg.get('json_sha256'))[:12]}…)"
            )
        return out


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_protocol(path: str | Path) -> Preregistered:
    """The twin at ``path``, the SHA-256 of it and of the text ``PROTOCOL.md`` beside it, and the
    registration ``REGISTERED.json`` beside it (if any).

    Raises ValueError (one line) when either file is missing, the twin is not JSON or the
    registration is unreadable.

    >>> from pathlib import Path
    >>> p = load_protocol(Path(__file__).parents[1] / "docs" / "faithfulness" / "protocol.json")
    >>> p.version, len(p.sha256), p["primary"]["outcome"], p.hash_reasons()
    (2, 64, 'kl', [])
    """
    path = Path(path)
    text = path.with_name("PROTOCOL.md")
    if not path.is_file():
        raise ValueError(f"protocol {path}: no such file")
    if not text.is_file():
        raise ValueError(f"protocol {path}: its text {text} is missing (a protocol is the text and its twin)")
    settings = read_json(path, f"protocol {path}")
    record = path.with_name(REGISTERED)
    registered = read_json(record, f"registration {record}") if record.is_file() else None
    if registered is not None and not isinstance(registered, dict):
        raise ValueError(f"registration {record}: not a JSON object")
    return Preregistered(settings, path, _sha256(text), _sha256(path), registered)


def register(path: str | Path, *, registered_at: str, commit: str | None = None) -> dict:
    """Write ``REGISTERED.json`` beside the twin at ``path``: the SHA-256 of the text and of the
    twin as they are now, ``registered_at`` (a date) and ``commit`` (where they were fixed).
    Register a protocol once, before any run under it; a new version of a protocol is a new
    registration (bump ``version`` in the twin)."""
    path = Path(path)
    record = dict(
        protocol=path.name,
        text="PROTOCOL.md",
        text_sha256=_sha256(path.with_name("PROTOCOL.md")),
        json_sha256=_sha256(path),
        version=read_json(path, f"protocol {path}").get("version"),
        registered_at=registered_at,
    )
    if commit:
        record["commit"] = commit
    path.with_name(REGISTERED).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return record


def preregistration(protocol: Preregistered | None, differences=()) -> dict:
    """``{status, text_sha256, json_sha256, reasons}`` of a run: ``pre-registered`` when the
    protocol's files are the registered ones and the run has no ``differences`` from it, else
    ``exploratory`` with every reason (the edited files first). ``protocol`` None: a run under no
    protocol (exploratory)."""
    if protocol is None:
        return dict(status=EXPLORATORY, text_sha256=None, json_sha256=None, reasons=["run under no protocol"])
    reasons = protocol.hash_reasons() + [str(d) for d in differences]
    return dict(
        status=EXPLORATORY if reasons else PRE_REGISTERED,
        text_sha256=protocol.sha256,
        json_sha256=protocol.json_sha256,
        reasons=reasons,
    )


def run_label(protocol: Preregistered | None, differences=()) -> str:
    """``"pre-registered"`` or ``"exploratory"`` (:func:`preregistration`'s status)."""
    return preregistration(protocol, differences)["status"]


def withhold_verdicts(pairs: list[dict], *, key: str = "verdict") -> list[dict]:
    """The pairs of an exploratory run: a verdict that would decide (``holds``, ``reversed``,
    ``tie``) or none becomes :data:`NOT_DECIDED`; ``not testable`` and the like stay.

    >>> withhold_verdicts([{"verdict": "holds"}, {"verdict": None}, {"verdict": "not testable"}])
    [{'verdict': 'not decided (exploratory)'}, {'verdict': 'not decided (exploratory)'}, {'verdict': 'not testable'}]
    """
    return [dict(p, **{key: NOT_DECIDED}) if p.get(key) in DECIDED + (None,) else dict(p) for p in pairs]


def status_line(record: dict) -> str:
    """One printed line: ``pre-registered``, or ``exploratory (reason; reason)``."""
    if record["status"] == PRE_REGISTERED:
        return PRE_REGISTERED
    return f"{EXPLORATORY} ({'; '.join(record['reasons'])})"


__all__ = [
    "DECIDED",
    "EXPLORATORY",
    "NOT_DECIDED",
    "PRE_REGISTERED",
    "REGISTERED",
    "Preregistered",
    "load_protocol",
    "preregistration",
    "register",
    "run_label",
    "status_line",
    "withhold_verdicts",
]
