"""Hand-written references for geolens.intervene: plain TransformerLens hooks (``hook_v`` scaled at
position 0, ``hook_z`` zeroed per head) and a float64 next-token loss of their own, without
geolens' hook builders."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

TEXTS = ["the cat sat on the mat", "a dog ran", "the cat sat on the mat"]


def loss_with(model, tokens, fwd_hooks=()) -> float:
    """Mean next-token NLL in float64 of one ``[1, seq]`` row, with plain TransformerLens hooks."""
    with torch.no_grad(), model.hooks(fwd_hooks=list(fwd_hooks)):
        logits = model(tokens, return_type="logits")
    logp = torch.log_softmax(logits[0, :-1].double(), dim=-1)
    return float(-logp.gather(-1, tokens[0, 1:, None]).mean())


def scale_v0(lam):
    def hook(v, hook):
        v = v.clone()
        v[:, 0] = lam * v[:, 0]
        return v

    return hook


def zero_heads(heads):
    def hook(z, hook):
        z = z.clone()
        z[:, :, heads] = 0
        return z

    return hook


def taxonomy_table(model, regimes):
    cfg = model.cfg
    layer, head = np.meshgrid(range(cfg.n_layers), range(cfg.n_heads), indexing="ij")
    return pd.DataFrame({"layer": layer.ravel(), "head": head.ravel(), "regime": regimes})


def hand_loss(model, text, fwd_hooks=()):
    tokens = model.to_tokens(text)
    return loss_with(model, tokens, fwd_hooks)


def zero_z(model, heads):
    by_layer = {}
    for l, h in heads:
        by_layer.setdefault(l, []).append(h)
    return [(f"blocks.{l}.attn.hook_z", zero_heads(hs)) for l, hs in by_layer.items()]
