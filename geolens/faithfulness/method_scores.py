"""A method's scores of protocol 3's measured terms (:func:`geolens.evaluate_attribution`).

Each document's drawn (layer, query) positions need the layer's attention inputs at their queries
only. :func:`layer_caches` runs one forward of the document's first tokens (up to its last query +
1) that stops after its last drawn layer, keeping each drawn layer's hook tensors (pattern, values,
z) cut to its own query + 1 (a causal model's layer inputs at a query depend on no later token or
layer); :func:`layer_inputs` builds each layer's view from them, and :func:`method_scores` reads
the methods' scores and the norms ‖α ṽ‖ of the terms there. For the shipped reference sets those
tensors are cached on disk (:func:`geolens.faithfulness.reference.layers_key`), so that a later
method runs no forward at all. (TransformerLens 4.x's ``start_at_layer`` would not save the
prefix: the bridge still runs the blocks before it, docs/tl-notes.md.)
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from geolens.adapter import get_attention_layer, names_filter
from geolens.metrics import LayerInputs, SequenceInputs


def _trim(name: str, x: Tensor, n: int) -> Tensor:
    """A cached hook tensor cut to the first ``n`` positions (TransformerLens layouts: a pattern
    ``[batch, head, query, key]``, every other ``[batch, pos, ...]``)."""
    return x[:, :, :n, :n] if name.endswith(("hook_pattern", "hook_attn_scores")) else x[:, :n]


def layer_caches(model, tokens: Tensor, widths: dict[int, int]) -> dict[int, dict[str, Tensor]]:
    """What each drawn layer l's attention view reads (:func:`geolens.names_filter`), cut to its
    first ``widths[l]`` positions (its last query + 1), from one forward of the document's first
    max(widths) tokens that stops after the last drawn layer: a causal model's layer inputs at
    those queries depend on no later token or layer."""
    layers = sorted(widths)
    with torch.no_grad():
        _, cache = model.run_with_cache(
            tokens[:, : max(widths.values())], names_filter=names_filter(model, layers), stop_at_layer=max(layers) + 1
        )
        keep = {l: set(filter(names_filter(model, [l]), cache.keys())) for l in layers}
        return {l: {name: _trim(name, cache[name], widths[l]).clone() for name in keep[l]} for l in layers}


def layer_inputs(model, caches: dict[int, dict[str, Tensor]], modes) -> dict:
    """``{(layer, mode): LayerInputs}`` (float64) of each drawn layer from its cut hook tensors."""
    out = {}
    device = next(model.parameters()).device
    with torch.no_grad():
        for l, entries in caches.items():
            view = get_attention_layer(model, {k: v.to(device) for k, v in entries.items()}, l, dtype=torch.float64)
            out.update({(l, m): LayerInputs.from_layer(view, m) for m in set(modes)})
    return out


def gather(per_layer: dict, terms: pd.DataFrame, n_heads: int, widths: dict[int, int]) -> np.ndarray:
    """The values ``per_layer[layer]`` ``[head or 1, query or 1, key]`` at each row of ``terms``."""
    out = np.empty(len(terms), dtype=np.float64)
    for l, rows in terms.groupby("layer").indices.items():
        n = widths[int(l)]
        x = per_layer[int(l)].double().cpu().expand(n_heads, n, n).numpy()
        part = terms.iloc[rows]
        out[rows] = x[part["head"].to_numpy(), part["query"].to_numpy(), part["source"].to_numpy()]
    return out


def method_scores(model, checked, tokens: Tensor, terms: pd.DataFrame, seed: int, caches=None) -> tuple:
    """(each method's score of each row of ``terms`` (one document), the norms ‖α ṽ‖ recomputed
    there, the drawn layers' cut hook tensors :func:`layer_caches`), read from the float64 model.
    ``caches``: those tensors when already known (the reference set's cache): no forward runs then."""
    n_heads = int(model.cfg.n_heads)
    widths = {int(l): int(q.max()) + 1 for l, q in terms.groupby("layer")["query"]}
    if caches is None or set(caches) != set(widths):
        caches = layer_caches(model, tokens, widths)
    inputs = layer_inputs(model, caches, [m for _, m, _ in checked] + ["inter"])
    layers = sorted(widths)
    inter = {l: (inputs[(l, "inter")].alpha * inputs[(l, "inter")].value_norm)[0] for l in layers}
    norms = gather(inter, terms, n_heads, widths)
    out = []
    for metric, mode, _ in checked:
        with torch.no_grad():
            if metric.per_layer:
                per_layer = {l: metric.layer_scores(inputs[(l, mode)], summed=False)[0] for l in layers}
                scores = gather(per_layer, terms, n_heads, widths)
            else:
                x = metric.scores(SequenceInputs(model, tokens, tuple(layers), n_heads, int(seed)))[:, 0]
                x = x.abs() if metric.absolute else x
                full = dict.fromkeys(layers, int(tokens.shape[1]))
                scores = gather({l: x[k] for k, l in enumerate(layers)}, terms, n_heads, full)
        if not np.isfinite(scores).all():
            raise ValueError(f"method {metric.name!r} gave non-finite scores (NaN or inf) to some terms")
        out.append(scores)
    return out, norms, caches


def stored_caches(stored: dict | None, d: int) -> dict[int, dict[str, Tensor]] | None:
    """Document ``d``'s cached hook tensors ``{layer: {hook name: tensor}}`` from arrays named
    ``"{document}:{layer}:{hook name}"`` (:func:`flat_caches`), or None."""
    found: dict[int, dict[str, Tensor]] = {}
    for key, value in (stored or {}).items():
        doc, layer, name = key.split(":", 2)
        if doc == str(d):
            found.setdefault(int(layer), {})[name] = torch.from_numpy(value)
    return found or None


def flat_caches(d: int, caches: dict[int, dict[str, Tensor]]) -> dict[str, np.ndarray]:
    """Document ``d``'s hook tensors as arrays named ``"{document}:{layer}:{hook name}"``."""
    return {f"{d}:{l}:{name}": x.cpu().numpy() for l, entries in caches.items() for name, x in entries.items()}


__all__ = ["flat_caches", "gather", "layer_caches", "layer_inputs", "method_scores", "stored_caches"]
