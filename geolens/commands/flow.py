"""``geolens flow "prompt"``: which input tokens the last prediction is made of, through all layers.

Prints, for the residual stream at the last position after the last layer, the top-k input tokens
by each contribution-flow method (docs/method.md §10, :func:`geolens.contribution_flow`):
``contribution``, ``alti`` and ``attention_rollout``; ``value_zeroing_rollout`` too with
``--value-zeroing`` (it reruns the model once per layer and token: costly). With ``--out DIR`` (or
``--name``) it also writes, through the run-folder machinery,

- ``flow.html``: the information-flow routes of that prediction (:func:`geolens.flow.routes.flow_routes`,
  Ferrando & Voita 2024, edges whose share exceeds ``--threshold`` by ``--method``), interactive;
- ``flow.json``: the parameters, the tokens, every method's full attribution row and the routes.

``geolens flow --erasure --protocol docs/flow/protocol.json --out DIR`` runs instead the
input-token erasure test of docs/flow/PROTOCOL.md (:mod:`geolens.flow.erasure`, the pipeline
:func:`geolens.pipelines.flow.FlowRun`) on the protocol's Lee windows: each document's tables are
saved as it finishes (``erasure_<table>.csv.gz``, ``erasure_progress.json``, written atomically),
``--resume`` continues after the last saved document, and at the end it writes ``summary.json``
(the protocol's SHA-256 and status, per-method nAOPC with intervals, both families' pairs with
Holm-adjusted verdicts, each method's nAOPC difference between the two replacements, the
known-answer check), ``naopc.csv``, ``pairs.csv``, ``curves.csv``, ``replacements.csv``,
``induction.csv`` and ``naopc.png``. A run whose settings differ from the protocol's (another
model, ``--n-documents``) is labelled exploratory.
"""

from __future__ import annotations

import json

from geolens.commands._names import FLOW_METHODS


def run(args) -> int:
    from geolens.commands._options import check_model_name, out_folder
    from geolens.errors import UsageError

    if args.erasure:
        return run_erasure(args)
    if args.text is None:
        raise UsageError("give a prompt, or --erasure --protocol docs/flow/protocol.json for the erasure test")
    if args.resume or args.n_documents is not None or args.protocol is not None:
        raise UsageError("--resume, --n-documents and --protocol go with --erasure")
    if not args.text.strip():
        raise UsageError("the text is empty")
    name = check_model_name(args.model, tiny=True)
    folder = out_folder(args, "flow") if (args.out is not None or args.name is not None) else None
    from geolens.models import load_model  # torch: only once the arguments are known to be good

    model = load_model(name)
    from geolens.commands._text import command_text_tokens

    tokens, n_text_tokens = command_text_tokens(model, args.text, truncate=args.truncate)
    if tokens.shape[1] < 2:
        raise UsageError("the text gives no token after BOS")
    from geolens.adapter import model_mode
    from geolens.pipelines.flow import LISTED, prompt_flow

    methods = list(LISTED) + (["value_zeroing_rollout"] if args.value_zeroing else [])
    found = prompt_flow(
        model, tokens, methods, threshold=args.threshold, route_method=args.method, routes=folder is not None
    )
    words, last, rows, graph = found.words, found.position, found.rows, found.routes
    print(f"model {args.model} ({model_mode(model)}), {tokens.shape[1]} tokens incl. BOS, {model.cfg.n_layers} layers")
    print(f"prediction at position {last} {words[last]!r} → {found.predicted!r} (p={found.p_predicted:.2g})")
    print(f"top {args.top_k} input tokens of that prediction's residual stream after the last layer")
    top = found.top(args.top_k)
    for m in methods:
        print(f"  by {m}:")
        for r in top[m]:
            print(f"    pos {r['position']:>3} {r['token']!r:<16} {r['share']:.4f}")
    if not args.value_zeroing:
        print("  (value_zeroing_rollout: add --value-zeroing; it reruns the model and is slow)")
    if folder is not None:
        from geolens.viz.flow import flow_routes_page

        record = {
            "command": "geolens flow",
            "model": args.model,
            "model_mode": model_mode(model),
            "text": args.text,
            "n_text_tokens": n_text_tokens,  # BOS included; more than len(tokens) when --truncate cut the text
            "truncated": n_text_tokens > tokens.shape[1],
            "tokens": words,
            "parameters": {
                "top_k": args.top_k,
                "threshold": args.threshold,
                "method": args.method,
                "value_zeroing": args.value_zeroing,
            },
            "position": last,
            "predicted": {"token": found.predicted, "p": found.p_predicted},
            "top": top,
            "flow": {m: [float(v) for v in rows[m].tolist()] for m in methods},
            "routes": graph.to_dict(),
        }
        (folder / "flow.json").write_text(json.dumps(record, indent=1, ensure_ascii=False), encoding="utf-8")
        (folder / "flow.html").write_text(
            flow_routes_page(graph, title=f"geolens flow: {args.text[:60]}"), encoding="utf-8"
        )
        print(
            f"routes ({args.method}, shares > {args.threshold:g}): {len(graph.nodes)} nodes, {len(graph.edges)} edges"
        )
        print(f"wrote {folder / 'flow.html'} and {folder / 'flow.json'}")
    return 0


def _erasure_protocol(args):
    """The protocol of ``--protocol`` (one-line UsageError when it cannot be read)."""
    from geolens.errors import UsageError
    from geolens.preregistration import load_protocol

    if args.protocol is None:
        raise UsageError("--erasure needs --protocol (the pre-registered protocol: docs/flow/protocol.json)")
    try:
        protocol = load_protocol(args.protocol)
        settings = protocol.settings
        if settings.get("endpoint") != "input_token_erasure":
            raise ValueError(
                f"protocol {args.protocol}: not an input-token erasure protocol (endpoint {settings.get('endpoint')!r})"
            )
        from geolens.flow import ErasureSettings

        ErasureSettings.from_protocol(settings)
    except (KeyError, TypeError) as err:
        raise UsageError(f"--protocol {args.protocol}: missing or malformed setting {err}") from None
    except ValueError as err:
        raise UsageError(str(err) if str(args.protocol) in str(err) else f"--protocol {args.protocol}: {err}") from None
    return protocol


def _differences(protocol, model_name: str, mode: str, n_documents: int) -> list[str]:
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


def run_erasure(args) -> int:
    """``geolens flow --erasure``: the input-token erasure test under a protocol (module docstring)."""
    import time

    import torch

    import geolens
    from geolens.adapter import model_mode
    from geolens.checkpoint import atomic_write_bytes, tokens_fingerprint
    from geolens.commands._options import check_model_name, out_folder
    from geolens.data import load_corpus
    from geolens.errors import UsageError
    from geolens.faithfulness.preregistered import protocol_windows
    from geolens.flow.erasure import ErasureSettings, measure_document, space_token, unigram_counts
    from geolens.models import load_model
    from geolens.pipelines import save_figures, write_tables
    from geolens.pipelines.flow import FlowRun, checked_induction
    from geolens.pipelines.flow_text import erasure_markdown
    from geolens.preregistration import NOT_DECIDED, preregistration, status_line
    from geolens.resume import run_document_stage
    from geolens.viz.common import to_jsonable

    if args.text is not None:
        raise UsageError("--erasure runs on the protocol's corpus: give no prompt")
    if args.resume and not args.out:
        raise UsageError("--resume needs --out, the folder of the run")
    protocol = _erasure_protocol(args)
    name = check_model_name(args.model, tiny=True)
    n_documents = int(protocol["data"]["n_documents"]) if args.n_documents is None else args.n_documents
    folder = out_folder(args, "flow", resumable=True)
    started = time.time()
    model = load_model(name)
    mode = model_mode(model)
    registration = preregistration(protocol, _differences(protocol, args.model, mode, n_documents))
    differences, status = registration["reasons"], registration["status"]
    settings = ErasureSettings.from_protocol(protocol.settings)
    texts = load_corpus(protocol["data"]["corpus"])
    try:
        windows, sources = protocol_windows(model, protocol, texts, n_documents=n_documents)
        space_id = space_token(model) if "space" in settings.replacements else None
    except ValueError as err:
        raise UsageError(str(err)) from None
    counts = unigram_counts(model, texts) if "unigram" in settings.replacements else None
    print(
        f"input-token erasure under {protocol.path} (version {protocol.version}, sha256 {protocol.sha256[:12]}…): {status}"
        + (f" ({'; '.join(differences)})" if differences else "")
    )
    print(
        f"model {args.model} ({mode}), {n_documents} documents × {len(settings.positions)} predictions, methods {', '.join(settings.methods)}"
    )
    fingerprint = dict(
        protocol_sha256=protocol.sha256,
        protocol=protocol.settings,
        model=args.model,
        model_mode=mode,
        n_documents=n_documents,
        tokens=tokens_fingerprint(windows),
    )
    measure = lambda d: measure_document(model, windows[d], d, settings, space_id=space_id, counts=counts)  # noqa: E731
    tables = run_document_stage(
        "erasure", folder, fingerprint, n_documents, measure, resume=args.resume, progress=print
    )
    if "rankings" in tables:
        tables["rankings"]["order"] = tables["rankings"]["order"].astype(str)
    ic = protocol["induction_check"]
    induction, skipped = checked_induction(
        model, n_tokens=int(ic["n_tokens"]), seed=int(ic["seed"]), methods=ic["methods"]
    )
    if skipped is not None:
        print(f"known-answer check skipped: {skipped}")
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
        model=args.model,
        model_mode=mode,
        status=status,
        differences=differences,
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
        erasure_seconds=json.loads((folder / "erasure_progress.json").read_text(encoding="utf-8")).get("seconds"),
        versions={"geolens": geolens.__version__, "torch": torch.__version__},
        **run.summary,
    )
    atomic_write_bytes(
        folder / "summary.json", (json.dumps(to_jsonable(summary), indent=1, ensure_ascii=False) + "\n").encode("utf-8")
    )
    write_tables(folder, run.tables, ["naopc", "pairs", "curves", "replacements", "induction"])
    save_figures(folder, run.figures, dpi=100)
    command = (
        f"geolens flow --erasure --protocol {args.protocol} --model {args.model} --out {args.out}"
        if args.out
        else "geolens flow --erasure"
    )
    atomic_write_bytes(
        folder / "README.md", erasure_markdown(summary, title=args.model, command=command).encode("utf-8")
    )
    for d in ("comprehensiveness", "sufficiency"):
        best = summary["most_faithful"][d]
        print(
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
    print(
        f"primary family: {decided} of {len(summary['families']['primary']['pairs'])} pairs decided (Holm); "
        f"{status_line(registration)}; wrote {folder / 'summary.json'}"
    )
    return 0


def register(subparsers) -> None:
    from geolens.commands._options import add_out, float_in, positive_int

    p = subparsers.add_parser(
        "flow", help="the input tokens of the last prediction through all layers, and its information-flow routes"
    )
    p.add_argument(
        "text", nargs="?", default=None, help="the prompt (BOS is prepended); its last token's prediction is attributed"
    )
    p.add_argument(
        "--model",
        default="smollm2-135m",
        help="smollm2-135m (default), gemma3-270m, tiny-gqa/tiny-mha/tiny-gemma, a local folder or a cached HF name",
    )
    p.add_argument("--top-k", type=positive_int, default=5, help="input tokens listed per method (default 5)")
    p.add_argument(
        "--threshold",
        type=float_in(0, 1, high_open=True),
        default=0.05,
        help="least share of an edge kept in the routes, in [0, 1) (default 0.05)",
    )
    p.add_argument(
        "--method",
        choices=FLOW_METHODS,
        default="contribution",
        help="how the routes' edges are weighed (default contribution)",
    )
    p.add_argument(
        "--value-zeroing", action="store_true", help="also list value_zeroing_rollout (reruns the model: slow)"
    )
    from geolens.commands._text import add_truncate_option

    add_truncate_option(p)
    p.add_argument(
        "--erasure", action="store_true", help="run the input-token erasure test of --protocol instead of one prompt"
    )
    p.add_argument(
        "--protocol",
        default=None,
        help="with --erasure: the protocol's machine-readable twin, e.g. docs/flow/protocol.json",
    )
    p.add_argument(
        "--n-documents",
        type=positive_int,
        default=None,
        help="with --erasure: fewer documents than the protocol's (an exploratory run)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="with --erasure: continue the run already in --out after its last saved document",
    )
    add_out(
        p,
        help="write flow.html and flow.json here (with --erasure: the run's tables, default geolens-runs/flow/<date-time>)",
        optional=True,
    )
    p.set_defaults(func=run)
