"""What ``geolens flow`` does once its options are checked, and the lines it prints; the command
only parses and prints (the pipeline itself is :mod:`geolens.pipelines.flow`).

- One prompt (:func:`save_prompt_flow`, :func:`prompt_flow_text`): the top input tokens of the last
  prediction by each flow method (:func:`~geolens.pipelines.flow.prompt_flow`); with an output
  folder, ``flow.html``, the information-flow routes of that prediction
  (:func:`geolens.flow.routes.flow_routes`, Ferrando & Voita 2024, edges whose share exceeds the
  threshold by the route method), interactive, and ``flow.json``: the parameters, the tokens,
  every method's full attribution row and the routes.
- The input-token erasure test of docs/flow/PROTOCOL.md under a protocol (:func:`erasure_sample`,
  :func:`erasure_differences`, :func:`save_erasure`, :func:`erasure_header`, :func:`erasure_text`)
  on the protocol's Lee windows: each document's tables are saved as it finishes
  (``erasure_<table>.csv.gz``, ``erasure_progress.json``, written atomically; a resumed run
  continues after the last saved document), and at the end ``summary.json`` (the protocol's
  SHA-256 and status, per-method nAOPC with intervals, both families' pairs with Holm-adjusted
  verdicts, each method's nAOPC difference between the two replacements, the known-answer check),
  ``naopc.csv``, ``pairs.csv``, ``curves.csv``, ``replacements.csv``, ``induction.csv``,
  ``naopc.png`` and ``README.md``. A run whose settings differ from the protocol's (another
  model, fewer documents) is labelled exploratory.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

import geolens
from geolens.checkpoint import atomic_write_bytes, tokens_fingerprint
from geolens.faithfulness.preregistered import protocol_windows
from geolens.flow import erasure
from geolens.flow.erasure import ErasureSettings, space_token, unigram_counts
from geolens.pipelines import save_figures, write_tables
from geolens.pipelines.flow import FlowRun, PromptFlow, checked_induction
from geolens.pipelines.flow_text import erasure_markdown
from geolens.preregistration import NOT_DECIDED, status_line
from geolens.resume import run_document_stage, versions_note
from geolens.viz.common import to_jsonable

# ---------------------------------------------------------------------------------------------
# One prompt


def prompt_flow_text(found: PromptFlow, methods, *, top_k: int, value_zeroing: bool) -> str:
    """The top ``top_k`` input tokens of the prediction by each of ``methods`` (and, without
    ``value_zeroing``, how to add value_zeroing_rollout)."""
    lines = [f"top {top_k} input tokens of that prediction's residual stream after the last layer"]
    top = found.top(top_k)
    for m in methods:
        lines.append(f"  by {m}:")
        lines += [f"    pos {r['position']:>3} {r['token']!r:<16} {r['share']:.4f}" for r in top[m]]
    if not value_zeroing:
        lines.append("  (value_zeroing_rollout: add --value-zeroing; it reruns the model and is slow)")
    return "\n".join(lines)


def save_prompt_flow(
    folder: Path,
    found: PromptFlow,
    methods,
    *,
    text: str,
    n_text_tokens: int,
    parameters: dict,
    command: str = "geolens flow",
    model: str,
    model_mode: str,
) -> None:
    """``flow.json`` (the command, model and model mode; the text, its tokens, the ``parameters``
    (``top_k``, ``threshold``, ``method``, ``value_zeroing``), the prediction, each method's top
    tokens and full row, the routes) and ``flow.html`` (the routes) in ``folder``.
    ``n_text_tokens``: the text's token count, BOS included (more than the rows' length when the
    text was cut)."""
    from geolens.viz.flow import flow_routes_page

    words, rows, graph = found.words, found.rows, found.routes
    record = {
        "command": command,
        "model": model,
        "model_mode": model_mode,
        "text": text,
        "n_text_tokens": n_text_tokens,  # BOS included; more than len(tokens) when --truncate cut the text
        "truncated": n_text_tokens > len(words),
        "tokens": words,
        "parameters": parameters,
        "position": found.position,
        "predicted": {"token": found.predicted, "p": found.p_predicted},
        "top": found.top(parameters["top_k"]),
        "flow": {m: [float(v) for v in rows[m].tolist()] for m in methods},
        "routes": graph.to_dict(),
    }
    (folder / "flow.json").write_text(json.dumps(record, indent=1, ensure_ascii=False), encoding="utf-8")
    (folder / "flow.html").write_text(flow_routes_page(graph, title=f"geolens flow: {text[:60]}"), encoding="utf-8")


def routes_text(graph, method: str, threshold: float, folder: Path) -> str:
    """The routes' size and the files :func:`save_prompt_flow` wrote."""
    return (
        f"routes ({method}, shares > {threshold:g}): {len(graph.nodes)} nodes, {len(graph.edges)} edges\n"
        f"wrote {folder / 'flow.html'} and {folder / 'flow.json'}"
    )


# ---------------------------------------------------------------------------------------------
# The erasure test under a protocol


def erasure_differences(protocol, model_name: str, mode: str, n_documents: int) -> list[str]:
    """Where a run departs from the protocol's settings (its files are checked against their
    registration by :func:`geolens.preregistration.preregistration`)."""
    data = protocol["data"]
    out = []
    if model_name not in data["models"]:
        out.append(f"model {model_name} is not one of the protocol's ({', '.join(data['models'])})")
    if mode != data["model_mode"]:
        out.append(f"model mode {mode}, the protocol's is {data['model_mode']}")
    if n_documents != int(data["n_documents"]):
        out.append(f"{n_documents} documents, the protocol's {data['n_documents']}")
    return out


def erasure_sample(model, protocol, texts, settings: ErasureSettings, n_documents: int):
    """(the protocol's windows of the first ``n_documents`` documents of ``texts``, their corpus
    indices, the space token's id when a replacement needs it); ValueError in one line when the
    corpus or the model cannot give them."""
    windows, sources = protocol_windows(model, protocol, texts, n_documents=n_documents)
    space_id = space_token(model) if "space" in settings.replacements else None
    return windows, sources, space_id


def erasure_header(protocol, registration: dict, settings: ErasureSettings, *, model: str, mode: str, n_documents: int):
    """The two lines a run prints first: the protocol and its status (with the differences), the
    model and the sample."""
    differences, status = registration["reasons"], registration["status"]
    return (
        f"input-token erasure under {protocol.path} (version {protocol.version}, sha256 {protocol.sha256[:12]}…): {status}"
        + (f" ({'; '.join(differences)})" if differences else "")
        + f"\nmodel {model} ({mode}), {n_documents} documents × {len(settings.positions)} predictions, methods {', '.join(settings.methods)}"
    )


def save_erasure(
    model,
    protocol,
    folder: Path,
    windows,
    sources,
    *,
    texts,
    settings: ErasureSettings,
    space_id,
    registration: dict,
    model_name: str,
    mode: str,
    n_documents: int,
    resume: bool,
    started: float,
    command: str,
    progress=print,
) -> tuple[dict, FlowRun]:
    """The erasure test of ``protocol`` on ``windows`` (``n_documents`` of them, from
    :func:`erasure_sample`, the corpus ``texts``; each document saved as it finishes in
    ``folder``, ``resume`` continuing after the last saved one), the known-answer check, and the
    run's files (module docstring); ``command`` is the README's. Returns (``summary.json``'s
    record, the :class:`~geolens.pipelines.flow.FlowRun`)."""
    status = registration["status"]
    counts = unigram_counts(model, texts) if "unigram" in settings.replacements else None
    fingerprint = dict(
        protocol_sha256=protocol.sha256,
        protocol=protocol.settings,
        model=model_name,
        model_mode=mode,
        n_documents=n_documents,
        tokens=tokens_fingerprint(windows),
    )

    def measure(d):  # erasure.measure_document looked up now: the resume tests replace it
        return erasure.measure_document(model, windows[d], d, settings, space_id=space_id, counts=counts)

    tables = run_document_stage(
        "erasure", folder, fingerprint, n_documents, measure, resume=resume, progress=progress, model=model
    )
    if "rankings" in tables:
        tables["rankings"]["order"] = tables["rankings"]["order"].astype(str)
    ic = protocol["induction_check"]
    induction, skipped = checked_induction(
        model, n_tokens=int(ic["n_tokens"]), seed=int(ic["seed"]), methods=ic["methods"]
    )
    if skipped is not None:
        progress(f"known-answer check skipped: {skipped}")
    record = json.loads((folder / "erasure_progress.json").read_text(encoding="utf-8"))
    run = FlowRun.of(
        tables,
        settings,
        induction=induction,
        status=status,
        induction_skipped=skipped,
        verdicts=status == "pre-registered",
    )
    summary = dict(
        command="geolens flow --erasure",
        model=model_name,
        model_mode=mode,
        status=status,
        differences=registration["reasons"],
        preregistration=registration,
        protocol_sha256=protocol.sha256,
        protocol_version=protocol.version,
        protocol_path=str(protocol.path),
        protocol=dict(
            endpoint=protocol["endpoint"],
            fractions=list(settings.fractions),
            positions=list(settings.positions),
            replacements=list(settings.replacements),
            outcome=protocol["outcomes"]["primary"],
            masking_scope="input tokens",
        ),
        settings=settings.to_dict(),
        corpus_indices=sources,
        seconds=round(time.time() - started, 1),
        erasure_seconds=record.get("seconds"),
        versions={"geolens": geolens.__version__, "torch": torch.__version__},
        **versions_note(record.get("writer")),  # resumed under another geolens version: said here
        **run.summary,
    )
    atomic_write_bytes(
        folder / "summary.json", (json.dumps(to_jsonable(summary), indent=1, ensure_ascii=False) + "\n").encode("utf-8")
    )
    write_tables(folder, run.tables, ["naopc", "pairs", "curves", "replacements", "induction"])
    save_figures(folder, run.figures, dpi=100)
    atomic_write_bytes(
        folder / "README.md", erasure_markdown(summary, title=model_name, command=command).encode("utf-8")
    )
    return summary, run


def erasure_text(summary: dict, settings: ErasureSettings, registration: dict, folder: Path) -> str:
    """The lines a finished run prints: the most faithful method per direction, how many pairs of
    the primary family were decided, the status and where the summary is."""
    status = registration["status"]
    lines = []
    for d in ("comprehensiveness", "sufficiency"):
        best = summary["most_faithful"][d]
        lines.append(
            f"most faithful ({d}, KL, {settings.primary}): "
            + (
                f"{best['method']}, by ≥ {best['by']:+.3g} [{best['ci_low']:+.3g}, {best['ci_high']:+.3g}] over {best['against']}"
                if best
                else "no method beats every other"
                if status == "pre-registered"
                else NOT_DECIDED
            )
        )
    decided = sum(p["verdict"] in ("holds", "reversed") for p in summary["families"]["primary"]["pairs"])
    lines.append(
        f"primary family: {decided} of {len(summary['families']['primary']['pairs'])} pairs decided (Holm); "
        f"{status_line(registration)}; wrote {folder / 'summary.json'}"
    )
    return "\n".join(lines)
