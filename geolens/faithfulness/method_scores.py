"""A method's scores of protocol 3's measured terms (:func:`geolens.evaluate_attribution`).

Each document's drawn (layer, query) positions need the layer's attention inputs at their queries
only. :func:`residuals` runs one forward of the document's first tokens (up to its last query + 1)
that stops after its last drawn layer, keeping the residual stream entering each drawn layer;
:func:`layer_inputs` runs each drawn layer's block alone on that residual (TransformerLens'
``start_at_layer``, the same values as the whole forward's: a causal model's layer inputs at a
query depend on no later token or layer), and :func:`method_scores` reads the methods' scores and
the norms ‖α ṽ‖ of the terms there. The residual streams of the shipped reference sets are cached
(:func:`geolens.faithfulness.reference.residuals_key`), so that a later method runs only the blocks.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from geolens.adapter import adapter_for, get_attention_layer, names_filter
from geolens.metrics import LayerInputs, SequenceInputs


def residuals(model, tokens: Tensor, widths: dict[int, int]) -> dict[int, Tensor]:
    """The residual stream entering each drawn layer l, on the first ``widths[l]`` tokens (its last
    query + 1), from one forward that stops after the last drawn layer (a causal model's layer
    inputs at the queries depend on no later token or layer)."""
    adapter = adapter_for(model)
    hooks = {adapter.resid_pre_hook(l): l for l in widths}
    with torch.no_grad():
        _, cache = model.run_with_cache(
            tokens[:, : max(widths.values())], names_filter=lambda name: name in hooks, stop_at_layer=max(widths) + 1
        )
    return {l: cache[name][0, : widths[l]].clone() for name, l in hooks.items()}


def layer_inputs(model, resid: dict[int, Tensor], modes) -> dict:
    """``{(layer, mode): LayerInputs}`` (float64) of each drawn layer: its block alone, run on the
    residual stream entering it (``start_at_layer``: the same values as the whole forward's)."""
    out = {}
    device = next(model.parameters()).device
    with torch.no_grad():
        for l, x in resid.items():
            _, cache = model.run_with_cache(
                x[None].to(device), start_at_layer=l, stop_at_layer=l + 1, names_filter=names_filter(model, [l])
            )
            view = get_attention_layer(model, cache, l, dtype=torch.float64)
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


def method_scores(model, checked, tokens: Tensor, terms: pd.DataFrame, seed: int, resid=None) -> tuple:
    """(each method's score of each row of ``terms`` (one document), the norms ‖α ṽ‖ recomputed
    there, the residual streams entering the drawn layers), read from the float64 model. ``resid``:
    those residual streams when already known (the reference set's cache): no forward is run then."""
    n_heads = int(model.cfg.n_heads)
    widths = {int(l): int(q.max()) + 1 for l, q in terms.groupby("layer")["query"]}
    if resid is None or set(resid) != set(widths) or any(resid[l].shape[0] != widths[l] for l in widths):
        resid = residuals(model, tokens, widths)
    inputs = layer_inputs(model, resid, [m for _, m, _ in checked] + ["inter"])
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
    return out, norms, resid


def stored_residuals(stored: dict | None, d: int) -> dict[int, Tensor] | None:
    """Document ``d``'s cached residual streams ``{layer: [tokens, d_model]}``, or None."""
    found = {int(k.split(":")[1]): torch.from_numpy(v) for k, v in (stored or {}).items() if k.split(":")[0] == str(d)}
    return found or None


__all__ = ["gather", "layer_inputs", "method_scores", "residuals", "stored_residuals"]
