"""``geolens flow "prompt"``: which input tokens the last prediction is made of, through all layers.

Prints, for the residual stream at the last position after the last layer, the top-k input tokens
by each contribution-flow method (docs/method.md §10, :func:`geolens.contribution_flow`):
``contribution``, ``alti`` and ``attention_rollout``; ``value_zeroing_rollout`` too with
``--value-zeroing`` (it reruns the model once per layer and token: costly). With ``--out DIR`` (or
``--name``) it also writes, through the run-folder machinery,

- ``flow.html``: the information-flow routes of that prediction (:func:`geolens.flow_routes.flow_routes`,
  Ferrando & Voita 2024, edges whose share exceeds ``--threshold`` by ``--method``), interactive;
- ``flow.json``: the parameters, the tokens, every method's full attribution row and the routes.
"""

from __future__ import annotations

import json

import torch

from geolens.flow import FLOW_METHODS

LISTED = ("contribution", "alti", "attention_rollout")


def top_tokens(row: torch.Tensor, words: list[str], k: int) -> list[dict]:
    """The k largest entries of one attribution row, as (position, token, share) records."""
    idx = torch.argsort(row, descending=True, stable=True)[:k].tolist()
    return [{"position": j, "token": words[j], "share": float(row[j])} for j in idx]


def run(args) -> int:
    from geolens.commands._options import UsageError, check_model_name, out_folder
    from geolens.models import load_model

    if not args.text.strip():
        raise UsageError("the text is empty")
    name = check_model_name(args.model, tiny=True)
    folder = out_folder(args, "flow") if (args.out is not None or args.name is not None) else None
    model = load_model(name)
    tokens = model.to_tokens(args.text, prepend_bos=True)
    if tokens.shape[1] < 2:
        raise UsageError("the text gives no token after BOS")
    from geolens.adapter import model_mode
    from geolens.flow import contribution_flow, flow_names_filter
    from geolens.flow_routes import flow_routes, token_strings

    words = token_strings(model, tokens, 0, tokens.shape[1])
    methods = list(LISTED) + (["value_zeroing_rollout"] if args.value_zeroing else [])
    last = tokens.shape[1] - 1
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=flow_names_filter(model))
        rows = {m: contribution_flow(model, cache, m, tokens=tokens)[0, last] for m in methods}
        graph = flow_routes(model, cache, last, args.threshold, method=args.method, tokens=tokens) if folder is not None else None
    print(f"model {args.model} ({model_mode(model)}), {tokens.shape[1]} tokens incl. BOS, {model.cfg.n_layers} layers")
    print(f"last prediction: position {last} {words[last]!r}; top {args.top_k} input tokens of its residual stream after the last layer")
    top = {m: top_tokens(rows[m], words, args.top_k) for m in methods}
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
            "tokens": words,
            "parameters": {"top_k": args.top_k, "threshold": args.threshold, "method": args.method, "value_zeroing": args.value_zeroing},
            "position": last,
            "top": top,
            "flow": {m: [float(v) for v in rows[m].tolist()] for m in methods},
            "routes": graph.to_dict(),
        }
        (folder / "flow.json").write_text(json.dumps(record, indent=1, ensure_ascii=False), encoding="utf-8")
        (folder / "flow.html").write_text(flow_routes_page(graph, title=f"geolens flow: {args.text[:60]}"), encoding="utf-8")
        print(f"routes ({args.method}, shares > {args.threshold:g}): {len(graph.nodes)} nodes, {len(graph.edges)} edges")
        print(f"wrote {folder / 'flow.html'} and {folder / 'flow.json'}")
    return 0


def register(subparsers) -> None:
    from geolens.commands._options import add_out, float_in, positive_int

    p = subparsers.add_parser("flow", help="the input tokens of the last prediction through all layers, and its information-flow routes")
    p.add_argument("text", help="the prompt (BOS is prepended); its last token's prediction is attributed")
    p.add_argument("--model", default="smollm2-135m", help="smollm2-135m (default), gemma3-270m, tiny-gqa/tiny-mha/tiny-gemma, a local folder or a cached HF name")
    p.add_argument("--top-k", type=positive_int, default=5, help="input tokens listed per method (default 5)")
    p.add_argument("--threshold", type=float_in(0, 1, high_open=True), default=0.05, help="least share of an edge kept in the routes, in [0, 1) (default 0.05)")
    p.add_argument("--method", choices=FLOW_METHODS, default="contribution", help="how the routes' edges are weighed (default contribution)")
    p.add_argument("--value-zeroing", action="store_true", help="also list value_zeroing_rollout (reruns the model: slow)")
    add_out(p, help="write flow.html and flow.json here", optional=True)
    p.set_defaults(func=run)
