"""The pre-registered faithfulness protocol (docs/faithfulness/PROTOCOL.md): reading it, and its data.

A protocol is a text (``PROTOCOL.md``) and its machine-readable twin (``protocol.json``) in one
folder, registered by ``REGISTERED.json``: :mod:`geolens.preregistration` reads, checks and
labels it (a run whose files or settings differ from the registered ones is ``"exploratory"``
and decides nothing).

:func:`protocol_windows` builds the protocol's data (PROTOCOL.md §1): one window per document,
BOS followed by the document's first ``seq_len − 1`` tokens, for the first ``n_documents``
documents of the corpus that have at least ``min_document_tokens`` tokens, in corpus order. The
document index of a window counts the eligible documents from 0: it seeds the position draws of
the per-term endpoint and names the cluster of the bootstrap.

:func:`run_stages` runs the endpoints into a run folder (:func:`per_term_stage`, :func:`masking_stage`),
each one document at a time through :func:`geolens.resume.run_document_stage`, which saves every
table atomically after each document and resumes, once it has checked the saved rows, after the
last one saved.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from geolens.preregistration import Preregistered, load_protocol, run_label  # noqa: F401 - their home
from geolens.resume import run_document_stage  # noqa: F401 - its home

DEFAULT_PROTOCOL = Path("docs") / "faithfulness" / "protocol.json"


def protocol_windows(
    model, protocol: Preregistered, texts: list[str], *, n_documents: int | None = None
) -> tuple[torch.Tensor, list[int]]:
    """``(tokens [n, seq_len], corpus indices)``: PROTOCOL.md §1's windows of ``texts``.

    Window d (the document index) is BOS + the first ``seq_len − 1`` tokens of the d-th document
    with at least ``min_document_tokens`` tokens (the model's own tokenizer, no special tokens);
    the second value gives each window's position in ``texts``. ``n_documents`` (default: the
    protocol's) takes fewer, for an exploratory run. ValueError when the corpus has too few.
    """
    from geolens.data import bos_token_id

    data = protocol["data"]
    seq_len, need = int(data["seq_len"]), int(data["min_document_tokens"])
    n = int(data["n_documents"]) if n_documents is None else int(n_documents)
    bos = bos_token_id(model)
    windows, sources = [], []
    for index, text in enumerate(texts):
        ids = model.tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) >= need:
            windows.append([bos] + ids[: seq_len - 1])
            sources.append(index)
        if len(windows) == n:
            break
    if len(windows) < n:
        raise ValueError(
            f"the corpus has {len(windows)} documents of at least {need} tokens, fewer than the {n} the run needs"
        )
    return torch.tensor(windows, dtype=torch.long), sources


# ---------------------------------------------------------------------------------------------
# Stages of a run: resumable per document, tables rewritten atomically after each one


def write_table(frame, path: Path) -> None:
    """``frame`` as CSV at ``path`` (gzipped without a timestamp when it ends in ``.gz``), written atomically."""
    import io

    from geolens.checkpoint import atomic_write_bytes

    buffer = io.BytesIO()
    frame.to_csv(buffer, index=False, compression={"method": "gzip", "mtime": 0} if path.suffix == ".gz" else None)
    atomic_write_bytes(path, buffer.getvalue())


def write_json(data: dict, path: Path) -> None:
    """``data`` as indented JSON at ``path``, written atomically (numpy scalars as Python numbers:
    :func:`geolens.checkpoint.json_default`)."""
    from geolens.checkpoint import atomic_write_bytes, json_default

    atomic_write_bytes(
        path, (json.dumps(data, indent=1, ensure_ascii=False, default=json_default) + "\n").encode("utf-8")
    )


def previous_summary(out: Path, sha256: str, model_name: str) -> dict:
    """The ``summary.json`` of an earlier stage run into ``out`` under the same protocol (``sha256``
    of its text) and model, so that a run of one stage keeps the other's results ({} if none)."""
    from geolens.resume import read_json

    path = out / "summary.json"
    if not path.is_file():
        return {}
    previous = read_json(path, "summary")
    if previous.get("protocol_sha256") != sha256 or previous.get("model") != model_name:
        return {}
    return previous


def masking_stage(
    model,
    windows: torch.Tensor,
    protocol: Preregistered,
    out: Path,
    *,
    corpus: str,
    model_name: str,
    resume: bool,
    progress=print,
) -> dict:
    """The per-layer masking endpoint (PROTOCOL.md §3-4) on ``windows``, one document at a time
    (:func:`~geolens.faithfulness.layer_masking.layer_masking_document`, the unigram distribution of
    ``corpus`` for the ceiling check) through :func:`run_document_stage`, then its
    :func:`~geolens.faithfulness.masking_summary.masking_summary`."""
    from geolens.data import load_corpus
    from geolens.faithfulness.layer_masking import layer_masking_document, unigram_logprobs
    from geolens.faithfulness.masking_summary import masking_summary, masking_summary_no_exclusion

    unigram = unigram_logprobs(model, load_corpus(corpus))
    fingerprint = dict(
        stage="masking",
        protocol_sha256=protocol.sha256,
        model=model_name,
        corpus=corpus,
        n_documents=int(windows.shape[0]),
    )

    def measure(d: int) -> dict:
        return {
            "rows": layer_masking_document(
                model, windows[d : d + 1], d, protocol=protocol.settings, unigram_logprobs=unigram
            )
        }

    tables = run_document_stage(
        "masking", out, fingerprint, int(windows.shape[0]), measure, resume=resume, progress=progress, model=model
    )
    if protocol["secondary"].get("exclusions") == "none":  # protocol 3's masking addendum
        return masking_summary_no_exclusion(tables["rows"], protocol.settings)
    return masking_summary(tables["rows"], protocol.settings)


def per_term_stage(
    model,
    windows: torch.Tensor,
    protocol: Preregistered,
    out: Path,
    *,
    corpus: str,
    model_name: str,
    resume: bool,
    progress=print,
) -> dict:
    """The per-term endpoint (PROTOCOL.md §2) on ``windows``, one document at a time
    (:func:`~geolens.faithfulness.ground_truth.ground_truth_document`) through
    :func:`run_document_stage`, then its :func:`~geolens.faithfulness.ground_truth.ground_truth_summary`
    with the size of the single-term effects (:func:`~geolens.faithfulness.ground_truth.single_term_effects`).
    A protocol of version 3 or later runs its own per-term endpoint (docs/faithfulness/v3/PROTOCOL.md:
    :func:`~geolens.faithfulness.norm_controlled.norm_controlled_stage`)."""
    if protocol.version >= 3:
        from geolens.faithfulness.norm_controlled import norm_controlled_stage

        return norm_controlled_stage(
            model, windows, protocol, out, corpus=corpus, model_name=model_name, resume=resume, progress=progress
        )
    from geolens.faithfulness.ground_truth import ground_truth_document, ground_truth_summary, single_term_effects

    primary, stats = protocol["primary"], protocol["statistics"]
    queries = tuple(protocol["data"]["scored_positions"])
    n_positions = int(primary["positions_per_document"])
    fingerprint = dict(
        stage="per_term",
        protocol_sha256=protocol.sha256,
        model=model_name,
        corpus=corpus,
        n_documents=int(windows.shape[0]),
        positions_per_document=n_positions,
        queries=list(queries),
    )

    def measure(d: int) -> dict:
        rows, positions = ground_truth_document(model, windows[d : d + 1], d, n_positions=n_positions, queries=queries)
        return {"rows": rows, "positions": positions}

    tables = run_document_stage(
        "per_term", out, fingerprint, int(windows.shape[0]), measure, resume=resume, progress=progress, model=model
    )
    pairs = [tuple(pair) for pair in protocol["pairs"]]
    part = ground_truth_summary(
        tables["rows"], pairs, n_boot=int(stats["n_boot"]), seed=int(stats["seed"]), alpha=float(stats["alpha"])
    )
    part["single_term_effects"] = single_term_effects(tables["positions"])
    return part


def not_testable_pairs(protocol: Preregistered) -> list[dict]:
    """The comparisons the protocol lists as unable to differ by construction, each with its
    verdict ``"not testable"`` and the reason (PROTOCOL.md: two metrics whose masks or rankings are
    identical under a scope give a zero difference with a zero-width interval, which is no tie).

    >>> from pathlib import Path
    >>> p = load_protocol(Path(__file__).parents[2] / "docs" / "faithfulness" / "protocol.json")
    >>> [(q["a"], q["b"], q["verdict"]) for q in not_testable_pairs(p)][0]
    ('value_weighted', 'output_normalized_inter', 'not testable')
    """
    pairs = []
    for entry in protocol.settings.get("not_testable_by_construction", []):
        a, b = entry["pair"]
        pairs.append(
            dict(a=a, b=b, ranking_scope=entry.get("ranking_scope", "any"), verdict="not testable", why=entry["why"])
        )
    return pairs


def run_stages(
    model,
    windows: torch.Tensor,
    protocol: Preregistered,
    out: Path,
    stages,
    *,
    corpus: str,
    model_name: str,
    resume: bool,
    progress=print,
) -> dict:
    """Run the endpoints named in ``stages`` (``per_term``: :func:`per_term_stage`; ``masking``:
    :func:`masking_stage`) into ``out``; returns the summary entries of the run folder.

    ``stages`` (each endpoint ``complete`` or ``not run``), ``per_term_effects``, ``masking`` and
    ``ceiling_check`` (with ``resume``, an endpoint that an earlier run under the same protocol and
    model completed into ``out`` is kept: :func:`previous_summary`), ``pairs`` (every endpoint's
    family), ``not_testable`` (the pairs that cannot differ by construction: :func:`not_testable_pairs`)
    and ``stage_seconds`` (each complete endpoint's compute time, from its progress file).
    """
    registered = set(protocol.settings.get("stages", ["per_term", "masking"] if protocol.version < 3 else ["per_term"]))
    if set(stages) - registered:
        from geolens.errors import UsageError

        names = " or ".join(f"--stage {s}" for s in sorted(registered))
        raise UsageError(
            f"protocol {protocol.path} registers the {', '.join(sorted(registered))} endpoint only: use {names}"
        )
    previous = previous_summary(out, protocol.sha256, model_name) if resume else {}
    options = dict(corpus=corpus, model_name=model_name, resume=resume, progress=progress)
    summary: dict = {"stages": dict(per_term="not run", masking="not run")}
    for key in ("per_term_effects", "masking", "ceiling_check"):  # a stage run before into this folder
        if key in previous:
            summary[key] = previous[key]
    summary["stages"].update({k: v for k, v in previous.get("stages", {}).items() if v == "complete"})
    if "per_term" in stages:
        summary["per_term_effects"] = per_term_stage(model, windows, protocol, out, **options)
        summary["stages"]["per_term"] = "complete"
    if "masking" in stages:
        summary["masking"] = masking_stage(model, windows, protocol, out, **options)
        summary["ceiling_check"] = summary["masking"].get("ceiling_check", summary["masking"].get("protocol_2_rules"))
        summary["stages"]["masking"] = "complete"
    summary["pairs"] = [p for key in ("per_term_effects", "masking") if key in summary for p in summary[key]["pairs"]]
    summary["not_testable"] = not_testable_pairs(protocol)
    summary["stage_seconds"] = {}
    writers = []
    for stage in ("per_term", "masking"):
        path = out / f"{stage}_progress.json"
        if summary["stages"].get(stage) == "complete" and path.is_file():
            saved = json.loads(path.read_text(encoding="utf-8"))
            # a progress file from before it kept time: the earlier summary's time for this stage
            # (its stage_seconds, else its wall-clock seconds when that summary ran only this stage)
            earlier = previous.get("stage_seconds", {}).get(stage, previous.get("seconds"))
            summary["stage_seconds"][stage] = saved.get("seconds", earlier)
            writers.append(saved.get("writer"))
    from geolens.resume import versions_note

    summary.update(versions_note(*writers))  # a stage resumed under another geolens version: said here
    return summary
