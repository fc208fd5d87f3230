"""``geolens flow "prompt"``: which input tokens the last prediction is made of, through all layers.

Prints, for the residual stream at the last position after the last layer, the top-k input tokens
by each contribution-flow method (docs/method.md §10, :func:`geolens.contribution_flow`):
``contribution``, ``alti`` and ``attention_rollout``; ``value_zeroing_rollout`` too with
``--value-zeroing`` (it reruns the model once per layer and token: costly). With ``--out DIR`` (or
``--name``) it also writes ``flow.html`` (the prediction's information-flow routes, interactive)
and ``flow.json``. ``geolens flow --erasure --protocol docs/flow/v3/protocol.json --out DIR`` runs
instead the input-token erasure test of docs/flow/v3/PROTOCOL.md (versions 1 and 2:
docs/flow/protocol.json, docs/flow/v2/protocol.json) on the protocol's Lee windows, resumable per
document (``--resume``); another model or ``--n-documents`` makes it exploratory.
What each writes and prints is :mod:`geolens.pipelines.flow_run`'s.
"""

from __future__ import annotations

from geolens.commands._names import FLOW_METHODS


def run(args) -> int:
    from geolens.commands._options import check_model_name, out_folder
    from geolens.errors import UsageError

    if args.erasure:
        return run_erasure(args)
    if args.text is None:
        raise UsageError("give a prompt, or --erasure --protocol docs/flow/v3/protocol.json for the erasure test")
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
    from geolens.pipelines.flow_run import prompt_flow_text, routes_text, save_prompt_flow

    methods = list(LISTED) + (["value_zeroing_rollout"] if args.value_zeroing else [])
    found = prompt_flow(
        model, tokens, methods, threshold=args.threshold, route_method=args.method, routes=folder is not None
    )
    words, last, graph = found.words, found.position, found.routes
    print(f"model {args.model} ({model_mode(model)}), {tokens.shape[1]} tokens incl. BOS, {model.cfg.n_layers} layers")
    print(f"prediction at position {last} {words[last]!r} → {found.predicted!r} (p={found.p_predicted:.2g})")
    print(prompt_flow_text(found, methods, top_k=args.top_k, value_zeroing=args.value_zeroing))
    if folder is not None:
        parameters = {k: getattr(args, k) for k in ("top_k", "threshold", "method", "value_zeroing")}
        meta = {"command": "geolens flow", "model": args.model, "model_mode": model_mode(model)}
        save_prompt_flow(
            folder, found, methods, text=args.text, n_text_tokens=n_text_tokens, parameters=parameters, **meta
        )
        print(routes_text(graph, args.method, args.threshold, folder))
    return 0


def _erasure_protocol(args):
    """The protocol of ``--protocol`` (one-line UsageError when it cannot be read)."""
    from geolens.errors import UsageError
    from geolens.preregistration import load_protocol

    if args.protocol is None:
        raise UsageError(
            "--erasure needs --protocol (pre-registered: docs/flow/v3/protocol.json; earlier versions: docs/flow/protocol.json, docs/flow/v2/protocol.json)"
        )
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


def run_erasure(args) -> int:
    """``geolens flow --erasure``: the input-token erasure test under a protocol (module docstring)."""
    import time

    from geolens.adapter import model_mode
    from geolens.commands._options import check_model_name, out_folder
    from geolens.data import load_corpus
    from geolens.errors import UsageError
    from geolens.flow.erasure import ErasureSettings
    from geolens.models import load_model
    from geolens.pipelines.flow_run import (
        erasure_differences,
        erasure_header,
        erasure_sample,
        erasure_text,
        save_erasure,
    )
    from geolens.preregistration import preregistration

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
    registration = preregistration(protocol, erasure_differences(protocol, args.model, mode, n_documents))
    settings = ErasureSettings.from_protocol(protocol.settings)
    texts = load_corpus(protocol["data"]["corpus"])
    try:
        windows, sources, space_id = erasure_sample(model, protocol, texts, settings, n_documents)
    except ValueError as err:
        raise UsageError(str(err)) from None
    print(erasure_header(protocol, registration, settings, model=args.model, mode=mode, n_documents=n_documents))
    command = (
        f"geolens flow --erasure --protocol {args.protocol} --model {args.model} --out {args.out}"
        if args.out
        else "geolens flow --erasure"
    )
    run = dict(registration=registration, model_name=args.model, mode=mode, n_documents=n_documents, resume=args.resume)
    run.update(texts=texts, settings=settings, space_id=space_id, started=started, command=command)
    summary, _ = save_erasure(model, protocol, folder, windows, sources, **run)
    print(erasure_text(summary, settings, registration, folder))
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
