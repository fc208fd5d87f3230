"""``geolens analyze "text"``: per-layer sink summary and the last token's top sources.

For each layer l (docs/method.md §1, §2, §4), averaged over heads:

- mean sink rate: α_i0 averaged over queries i ≥ 1 (query 0 can only attend to itself);
- sink norm ratio: ‖ṽ_0‖ / mean_{j>0} ‖ṽ_j‖;
- sink cosine: mean_{j>0} cos(ṽ_0, ṽ_j), computed as ⟨v_0 G, v_j⟩ / (‖ṽ_0‖‖ṽ_j‖) with G = W_O W_Oᵀ.

Then, for the final token and a chosen layer, the top sources by raw attention (mean over heads)
and by per-source inter-head contribution C_ij = Σ_h c_ij^h.
"""

from __future__ import annotations


def sink_summary(layer) -> dict[str, float]:
    """Mean sink rate, sink/non-sink projected-norm ratio and mean sink cosine of one layer."""
    import torch

    from geolens.geometry import gram, projected_value_norms

    alpha = layer.pattern  # [b, h, q, k]
    norms = projected_value_norms(layer)  # [b, h, k]
    dots = torch.einsum("bhd,hde,bkhe->bhk", layer.v[:, 0], gram(layer.W_O), layer.v[:, 1:])
    cos = dots / (norms[:, :, :1] * norms[:, :, 1:]).clamp_min(1e-12)
    return {
        "sink_rate": alpha[:, :, 1:, 0].mean().item(),
        "sink_norm_ratio": (norms[:, :, 0] / norms[:, :, 1:].mean(-1)).mean().item(),
        "sink_cosine": cos.mean().item(),
    }


def top_sources(model, tokens, layer_view, k: int = 5) -> list[tuple[str, list[tuple[int, str, float]]]]:
    """Top-k sources of the last query by raw attention (head mean) and by Σ_h c_ij (inter)."""
    import torch

    from geolens.contributions import contribution_weights_from_layer, per_source_totals

    alpha_last = layer_view.pattern[0, :, -1].mean(0)
    contrib_last = per_source_totals(contribution_weights_from_layer(layer_view, "inter"))[0, -1]
    words = [model.tokenizer.decode([t]) for t in tokens[0].tolist()]
    out = []
    for name, score in (("raw attention", alpha_last), ("contribution", contrib_last)):
        idx = torch.argsort(score, descending=True, stable=True)[:k].tolist()
        out.append((name, [(j, words[j], score[j].item()) for j in idx]))
    return out


def run(args) -> int:
    import torch
    from tqdm.auto import tqdm

    from geolens.adapter import get_attention_layer, model_mode, names_filter
    from geolens.commands._options import check_backend, check_index, check_model_name
    from geolens.errors import UsageError
    from geolens.models import load_model

    if not args.text.strip():
        raise UsageError("the text is empty")
    name, backend = check_model_name(args.model), check_backend(args.backend, compat=args.compat)
    model = load_model(name, backend=backend, compatibility_mode=args.compat)
    layer = check_index(args.layer, model.cfg.n_layers, "layers", "--layer")
    from geolens.commands._text import command_text_tokens

    tokens, _ = command_text_tokens(model, args.text, truncate=args.truncate)
    if tokens.shape[1] < 2:
        raise UsageError("the text gives no token after BOS")
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=names_filter(model))
    n_layers = model.cfg.n_layers
    print(f"model {args.model} ({model_mode(model)}), {tokens.shape[1]} tokens incl. BOS, {n_layers} layers")
    rows = [
        sink_summary(get_attention_layer(model, cache, l)) for l in tqdm(range(n_layers), desc="layers", leave=False)
    ]
    print(f"{'layer':>5} {'sink rate':>10} {'‖ṽ0‖/‖ṽj‖':>11} {'cos(ṽ0,ṽj)':>11}")
    for l, s in enumerate(rows):
        print(f"{l:>5} {s['sink_rate']:>10.3f} {s['sink_norm_ratio']:>11.3f} {s['sink_cosine']:>11.3f}")
    print(f"\nlast token {model.tokenizer.decode([tokens[0, -1].item()])!r}, layer {layer}: top sources")
    for name, rows in top_sources(model, tokens, get_attention_layer(model, cache, layer), args.top):
        print(f"  by {name}:")
        for j, word, value in rows:
            print(f"    pos {j:>3} {word!r:<16} {value:+.4f}")
    return 0


def register(subparsers) -> None:
    from geolens.commands._options import add_run_options, positive_int

    p = subparsers.add_parser("analyze", help="per-layer sinks and the last token's top sources for one text")
    p.add_argument("text", help="the text to analyse (BOS is prepended)")
    add_run_options(p, model="smollm2-135m", backend="tl")
    p.add_argument("--layer", type=int, default=-1, help="layer for the top-sources table (default -1: the last)")
    p.add_argument("--top", type=positive_int, default=5, help="how many sources to list")
    from geolens.commands._text import add_truncate_option

    add_truncate_option(p)
    p.add_argument(
        "--compat",
        action="store_true",
        help="TransformerLens compatibility mode: HookedTransformer numerics (folded norms, centred W_O, b_V folded into b_O); off by default",
    )
    p.set_defaults(func=run)
