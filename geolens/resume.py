"""Resume that checks what it resumes: the one implementation behind every resumable run.

A resumable run saves its work as it goes and, with ``--resume``, continues after the work saved.
Resuming blindly from an edited or damaged progress record gives a run that finishes as
complete with work missing, so every resume here checks the record against the files on disk
first and refuses, in one line (:class:`ResumeRefused`, a :class:`~geolens.errors.UsageError`:
``geolens <cmd>: error: ...``, exit 2), anything that does not add up: it names what is wrong
and which file, and says how to start again. It never resumes silently.

Three shapes of saved work, one rule each:

- **Per-document tables** (:func:`run_document_stage`: the faithfulness stages, through
  :func:`run_protocol_stage`, and the flow erasure test): ``<stage>_<table>.csv.gz`` plus
  ``<stage>_progress.json``, which names the documents done (``documents``), each table's row
  count and the SHA-256 of its file (``rows``). On resume the settings (``fingerprint``:
  protocol, model, sample) must be the same, every table file must be readable with the recorded
  count and digest, and the documents in the rows must be exactly the documents done.
- **Records in one JSON file** (:func:`write_records` / :func:`read_records`: the multiple-choice
  checkpoint, the sink controls' checkpoint): the file records how many records it holds, their
  ids and the SHA-256 of their canonical JSON; a record edited, added or removed is refused.
- **Analysis states** (:mod:`geolens.checkpoint`, ``run_corpus(..., checkpoint=...)``): the
  checkpoint records :func:`state_digest` of its batch index and states, checked on load.

Saved work is bound to its content and to the model that made it:

- A record without digests (saved before geolens kept them, or stripped of them) is refused in
  one line, never trusted as legacy. The one exception is re-summarising a run that git vouches
  for (:func:`geolens.preregistration.committed_unchanged`: every file tracked and unchanged since
  the last commit, a stage finished): the published runs in docs/, which ``scripts/regenerate_check.py``
  re-summarises with ``--resume``; reading a finished folder for analysis is not a resume.
- Every record keeps its ``writer`` (:func:`geolens.checkpoint.writer_record`): the weights
  fingerprint that :func:`geolens.run_with_cache` stamps its caches with, and the geolens
  version. A record of other weights (new weights saved under the same ``--model`` path) is
  refused in one line, and so is one that names no weights (with the same exception). A resume
  under another geolens version goes on, and the run's summary says so
  (``resumed_across_versions``: :func:`versions_note`).

Every refusal is raised before any work is redone, and every write is atomic
(:func:`geolens.checkpoint.atomic_write_bytes`), so ``kill -9`` then ``--resume`` gives the same
bytes as an uninterrupted run.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Callable

from geolens.checkpoint import state_digest
from geolens.errors import ResumeRefused

AGAIN = "rerun with --overwrite (or a new --out) to start again"


def refuse(path, what: str, again: str = AGAIN) -> ResumeRefused:
    """The one-line refusal: ``cannot resume from PATH: WHAT; AGAIN``."""
    return ResumeRefused(f"cannot resume from {path}: {what}; {again}")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def records_digest(records: Any) -> str:
    """SHA-256 of ``records`` as canonical JSON (sorted keys, no spaces; numpy and torch numbers
    as Python numbers).

    >>> records_digest({"b": 1, "a": [1.5, None]}) == records_digest({"a": [1.5, None], "b": 1})
    True
    """
    from geolens.checkpoint import json_default

    text = json.dumps(records, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=json_default)
    return sha256_bytes(text.encode("utf-8"))


def read_json(path: Path, what: str = "progress record") -> dict:
    """A JSON object saved by a resumable run; a missing, truncated or unreadable one is refused."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise refuse(
            path, f"its {what} is unreadable ({type(err).__name__}: {str(err).splitlines()[0][:120]})"
        ) from None
    if not isinstance(data, dict):
        raise refuse(path, f"its {what} is not a JSON object")
    return data


def fingerprint_differences(saved: Any, current: Any) -> list[str]:
    """``"field: saved there, this run here"`` for every setting that differs (a model first)."""
    from geolens.checkpoint import plain_json
    from geolens.streaming import config_differences

    def short(value) -> str:
        text = json.dumps(value, ensure_ascii=False, default=str) if not isinstance(value, str) else value
        return text if len(text) <= 60 else text[:59] + "…"

    diffs = config_differences(saved, plain_json(current))
    diffs.sort(key=lambda d: not d[0].startswith("model"))
    return [f"{p} {short(b)}, not {short(a)}" for p, a, b in diffs]


def check_fingerprint(path, saved: Any, current: dict) -> None:
    """Refuse saved work made under other settings (the model first, in one line)."""
    diffs = fingerprint_differences(saved, current)
    if diffs:
        more = f" (and {len(diffs) - 3} more)" if len(diffs) > 3 else ""
        raise refuse(path, f"it was written by a run with other settings: this run has {'; '.join(diffs[:3])}{more}")


# ---------------------------------------------------------------------------------------------
# Per-document tables


def write_table_bytes(frame) -> bytes:
    """``frame`` as gzipped CSV without a timestamp (the same bytes for the same rows)."""
    import io

    buffer = io.BytesIO()
    frame.to_csv(buffer, index=False, compression={"method": "gzip", "mtime": 0})
    return buffer.getvalue()


def _read_rows(path: Path, recorded: dict | None):
    """The table at ``path``, checked against its ``recorded`` count and digest (None: legacy)."""
    import io

    import pandas as pd

    try:
        data = path.read_bytes()
    except OSError as err:
        raise refuse(path, f"its rows file is missing or unreadable ({err.strerror or type(err).__name__})") from None
    if recorded is not None and sha256_bytes(data) != recorded.get("sha256"):
        raise refuse(path, "the rows file is not the one its progress record names (SHA-256 differs)")
    try:
        frame = pd.read_csv(io.BytesIO(data), compression="gzip" if path.suffix == ".gz" else None)
    except Exception as err:  # noqa: BLE001 - gzip, EOF, parser errors: one line naming the file
        raise refuse(
            path, f"the rows file is damaged ({type(err).__name__}: {str(err).splitlines()[0][:100]})"
        ) from None
    if recorded is not None and len(frame) != int(recorded.get("n_rows", -1)):
        raise refuse(path, f"the rows file has {len(frame)} rows, its progress record says {recorded.get('n_rows')}")
    return frame


def load_stage(
    stage: str, out: Path, fingerprint: dict, *, id_column: str = "document", model=None
) -> tuple[list[int], dict, float]:
    """``(documents done, {table: DataFrame}, seconds)`` of the stage saved in ``out``, checked
    (module docstring) against this run's settings (``fingerprint``) and ``model``'s weights;
    ``([], {}, 0.0)`` when nothing was saved. :class:`ResumeRefused` otherwise."""
    return _load_stage(stage, out, fingerprint, id_column=id_column, model=model)[:3]


def _load_stage(stage: str, out: Path, fingerprint: dict, *, id_column: str, model) -> tuple:
    """:func:`load_stage`, and the writer the resumed stage records (:func:`geolens.checkpoint.check_writer`)."""
    from geolens.checkpoint import check_writer, writer_record

    progress_path = out / f"{stage}_progress.json"
    if not progress_path.is_file():
        if any(out.glob(f"{stage}_*.csv.gz")):
            raise refuse(progress_path, "rows are saved but their progress record is missing")
        return [], {}, 0.0, writer_record(model)
    saved = read_json(progress_path)
    check_fingerprint(progress_path, saved.get("fingerprint"), fingerprint)
    try:
        done = int(saved["documents_done"])
        names = [str(n) for n in saved["tables"]]
        seconds = float(saved.get("seconds", 0.0))
        documents = [int(d) for d in saved["documents"]] if "documents" in saved else list(range(done))
        rows = saved.get("rows")  # absent: a record from before digests were kept
        if rows is not None and (not isinstance(rows, dict) or sorted(rows) != sorted(names)):
            raise ValueError("its rows do not name its tables")
    except (KeyError, TypeError, ValueError) as err:
        raise refuse(progress_path, f"the progress record is malformed ({type(err).__name__}: {err})") from None
    if documents != list(range(done)):
        raise refuse(
            progress_path,
            f"the progress record says {done} documents done but names documents {_ids(documents)}",
        )
    # a finished stage that git vouches for (a published run in docs/, re-summarised): its record
    # may predate the digests and the writer; anything else must have both (never trusted as legacy)
    files = [progress_path] + [out / f"{stage}_{name}.csv.gz" for name in names]
    vouch = files if done >= int(saved.get("n_documents", done + 1)) else []
    if rows is None:
        from geolens.preregistration import committed_unchanged

        if not (vouch and committed_unchanged(vouch)):
            raise refuse(
                progress_path,
                "its progress record has no digests of its rows (saved before geolens kept them, or edited), "
                "so the rows cannot be checked",
            )
    writer = check_writer(progress_path, saved.get("writer"), model, vouch=vouch, again=AGAIN)
    tables, seen = {}, set()
    for name in names:
        path = out / f"{stage}_{name}.csv.gz"
        frame = _read_rows(path, None if rows is None else rows[name])
        if id_column in frame.columns:
            ids = {int(d) for d in frame[id_column].unique()}
            extra = sorted(ids - set(documents))
            if extra:
                raise refuse(path, f"its rows hold documents {_ids(extra)} beyond the {done} its progress record names")
            seen |= ids
        tables[name] = frame
    missing = sorted(set(documents) - seen)
    if names and missing:
        raise refuse(
            progress_path,
            f"the progress record says {done} documents done, the rows hold none of documents {_ids(missing)}",
        )
    return documents, tables, seconds, writer


def _ids(ids) -> str:
    ids = list(ids)
    return ", ".join(map(str, ids[:8])) + (f" … ({len(ids)})" if len(ids) > 8 else "")


def run_document_stage(
    stage: str,
    out: Path,
    fingerprint: dict,
    n_documents: int,
    measure: Callable[[int], dict],
    *,
    resume: bool,
    progress=print,
    id_column: str = "document",
    model=None,
):
    """Run ``measure(d) -> {table name: DataFrame}`` for documents d = 0 … n_documents − 1, saving
    after each document (``<stage>_<table>.csv.gz`` and ``<stage>_progress.json``, each written
    atomically: an interrupt leaves the last complete document's tables). With ``resume`` the
    stage continues after the documents already saved, once :func:`load_stage` has checked them
    (same ``fingerprint``: protocol, model, settings; the rows on disk are the ones recorded).
    Returns the tables of all documents. The progress file also records the stage's compute time
    (``seconds``, summed over the invocations that measured documents) and its ``writer``: the
    weights fingerprint of ``model`` and the geolens version (a resume with other weights is
    refused; one under another version is carried in ``writer.resumed_across_versions``:
    :func:`versions_note`)."""
    import time

    import pandas as pd

    from geolens.checkpoint import atomic_write_bytes, writer_record

    tables: dict[str, list] = {}
    documents: list[int] = []
    seconds = 0.0
    writer = writer_record(model)
    if resume:
        documents, saved, seconds, writer = _load_stage(stage, out, fingerprint, id_column=id_column, model=model)
        tables = {name: [frame] for name, frame in saved.items()}
        if documents:
            progress(f"{stage}: resuming after {len(documents)} documents already in {out}")
    for d in range(len(documents), n_documents):
        start = time.perf_counter()
        for name, frame in measure(d).items():
            tables.setdefault(name, []).append(frame)
        merged = {name: pd.concat(parts, ignore_index=True) for name, parts in tables.items()}
        tables = {name: [frame] for name, frame in merged.items()}
        rows = {}
        for name, frame in merged.items():
            data = write_table_bytes(frame)
            atomic_write_bytes(out / f"{stage}_{name}.csv.gz", data)
            rows[name] = {"n_rows": int(len(frame)), "sha256": sha256_bytes(data)}
        seconds += time.perf_counter() - start
        documents.append(d)
        record = dict(
            fingerprint=fingerprint,
            documents_done=d + 1,
            n_documents=n_documents,
            tables=sorted(merged),
            seconds=round(seconds, 1),
            documents=documents,
            rows=rows,
            writer=writer,
        )
        write_record(record, out / f"{stage}_progress.json")
        progress(f"{stage}: {d + 1} / {n_documents} documents (saved)")
    return {name: parts[0] for name, parts in tables.items()}


def run_protocol_stage(
    stage: str,
    out: Path,
    protocol,
    windows,
    measure: Callable[[int], dict],
    *,
    corpus: str,
    model_name: str,
    resume: bool,
    progress=print,
    model=None,
    **settings,
):
    """:func:`run_document_stage` for an endpoint of a pre-registered ``protocol`` (anything with
    the ``sha256`` of its text, e.g. a :class:`geolens.preregistration.Preregistered`) on its
    ``windows`` (one row per document). The fingerprint its saved tables are checked against is
    the stage, the protocol's SHA-256, the model, the corpus, the number of documents, then
    ``settings`` in the order given (the order of the keys in ``<stage>_progress.json``); the
    saved work is bound to ``model``'s weights (:func:`run_document_stage`).

    >>> import tempfile, types
    >>> import pandas as pd, torch
    >>> with tempfile.TemporaryDirectory() as out:
    ...     tables = run_protocol_stage(
    ...         "demo", Path(out), types.SimpleNamespace(sha256="0" * 64), torch.zeros(2, 8, dtype=torch.long),
    ...         lambda d: {"rows": pd.DataFrame(dict(document=[d]))}, corpus="lee", model_name="tiny-gqa",
    ...         resume=False, progress=lambda line: None, queries=[2, 6],
    ...     )
    ...     saved = read_json(Path(out) / "demo_progress.json")["fingerprint"]
    >>> list(saved), len(tables["rows"])
    (['stage', 'protocol_sha256', 'model', 'corpus', 'n_documents', 'queries'], 2)
    """
    n_documents = int(windows.shape[0])
    fingerprint = dict(
        stage=stage,
        protocol_sha256=protocol.sha256,
        model=model_name,
        corpus=corpus,
        n_documents=n_documents,
        **settings,
    )
    return run_document_stage(
        stage, out, fingerprint, n_documents, measure, resume=resume, progress=progress, model=model
    )


def versions_note(*writers) -> dict:
    """``{"resumed_across_versions": [...]}`` for a run's summary when any of its saved work
    (the ``writer`` of each progress record or checkpoint) was resumed under another geolens
    version than the one that wrote it; ``{}`` otherwise (a summary then keeps its bytes).

    >>> versions_note({"geolens_version": "0.0.1"})["resumed_across_versions"][0].startswith("0.0.1 → ")
    True
    >>> versions_note(None, {})
    {}
    """
    from geolens.checkpoint import versions_crossed

    crossed = []
    for writer in writers:
        crossed += [v for v in versions_crossed(writer) if v not in crossed]
    return {"resumed_across_versions": crossed} if crossed else {}


def write_record(data: dict, path: Path) -> None:
    """``data`` as indented JSON, written atomically (numpy scalars as Python numbers)."""
    from geolens.checkpoint import atomic_write_bytes, json_default

    atomic_write_bytes(
        path, (json.dumps(data, indent=1, ensure_ascii=False, default=json_default) + "\n").encode("utf-8")
    )


# ---------------------------------------------------------------------------------------------
# Records in one JSON file


def write_records(path: Path, header: dict, stores: dict[str, dict], *, indent: int | None = None) -> None:
    """``header`` and the record ``stores`` (``{store: {id: record}}``) at ``path``, atomically,
    with ``records``: each store's count and ids and the SHA-256 of all stores (:func:`records_digest`)."""
    from geolens.checkpoint import atomic_write_bytes, json_default

    data = dict(header)
    data.update(stores)
    data["records"] = dict(
        counts={k: len(v) for k, v in stores.items()},
        ids={k: list(v) for k, v in stores.items()},
        sha256=records_digest(stores),
    )
    atomic_write_bytes(Path(path), json.dumps(data, indent=indent, default=json_default).encode("utf-8"))


def read_records(path: Path, stores: tuple[str, ...], *, what: str = "checkpoint", verified: bool = False) -> dict:
    """The JSON written by :func:`write_records`, its stores checked against ``records`` (count,
    ids, digest). :class:`ResumeRefused` when unreadable, when a record was edited, added or
    removed, or when the file has no ``records`` (saved before digests were kept, or stripped of
    them): such a file is read as it is only where git vouches for it
    (:func:`geolens.preregistration.committed_unchanged`: a published run in docs/) or the caller
    has ``verified`` it whole (a SHA-256 a registered protocol names)."""
    data = read_json(path, what)
    for store in stores:
        if not isinstance(data.get(store, {}), dict):
            raise refuse(path, f"its {what} is malformed ({store} is not a set of records)")
    meta = data.get("records")
    if meta is None:
        from geolens.preregistration import committed_unchanged

        if verified or committed_unchanged([path]):
            return data
        raise refuse(
            path,
            f"its {what} has no digests of its records (saved before geolens kept them, or edited), so they cannot be checked",
        )
    got = {store: data.get(store, {}) for store in stores}
    try:
        counts, ids, digest = meta["counts"], meta["ids"], meta["sha256"]
        for store in stores:
            if len(got[store]) != int(counts[store]):
                raise refuse(path, f"it holds {len(got[store])} {store} records, its record says {counts[store]}")
            if list(got[store]) != list(ids[store]):
                raise refuse(path, f"its {store} records are not the ones it names")
    except (KeyError, TypeError, ValueError) as err:
        if isinstance(err, ResumeRefused):
            raise
        raise refuse(path, f"its {what} is malformed ({type(err).__name__}: {err})") from None
    if records_digest(got) != digest:
        raise refuse(path, "a record was edited after it was saved (SHA-256 of the records differs)")
    return data


__all__ = [
    "AGAIN",
    "ResumeRefused",
    "check_fingerprint",
    "fingerprint_differences",
    "load_stage",
    "read_json",
    "read_records",
    "records_digest",
    "refuse",
    "run_document_stage",
    "run_protocol_stage",
    "sha256_bytes",
    "state_digest",
    "versions_note",
    "write_record",
    "write_records",
    "write_table_bytes",
]
