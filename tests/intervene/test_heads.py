"""geolens.intervene.heads: ablate_heads against a hand-written hook loop (tests/intervene/hand.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import geolens
from tests.intervene.hand import TEXTS, loss_with, zero_heads

# ---------------------------------------------------------------------------------------------
# ablate_heads


def test_ablate_heads_zero_equals_a_hand_written_hook_loop(model):
    heads = [(0, 1), (1, 0), (1, 3)]
    a = geolens.intervene.ablate_heads(model, TEXTS, heads=heads)
    assert a.heads == sorted(heads) and a.how == "zero" and a.means_from is None
    for i, text in enumerate(TEXTS):
        tokens = model.to_tokens(text)
        hooks = [("blocks.0.attn.hook_z", zero_heads([1])), ("blocks.1.attn.hook_z", zero_heads([0, 3]))]
        assert a.clean_loss[i] == pytest.approx(loss_with(model, tokens), abs=1e-6)
        assert a.ablated_loss[i] == pytest.approx(loss_with(model, tokens, hooks), abs=1e-6)
    assert a.clean_loss[0] == a.clean_loss[2]  # the same text, wherever it sits in the call
    assert a.delta_loss == pytest.approx(float(np.mean(a.ablated_loss - a.clean_loss)))
    assert list(a.summary.columns) == ["text", "clean_loss", "ablated_loss", "delta_loss"]


def test_ablate_heads_mean_uses_the_given_means(model):
    cfg = model.cfg
    means = torch.randn(cfg.n_layers, cfg.n_heads, cfg.d_head, generator=torch.Generator().manual_seed(0))

    def replace(z, hook):
        z = z.clone()
        z[:, :, 2] = means[1, 2]
        return z

    a = geolens.intervene.ablate_heads(model, TEXTS[1], heads=[(1, 2)], how="mean", means=means)
    tokens = model.to_tokens(TEXTS[1])
    assert a.means_from == "given"
    assert a.ablated_loss[0] == pytest.approx(loss_with(model, tokens, [("blocks.1.attn.hook_z", replace)]), abs=1e-5)


def test_ablate_heads_mean_without_means_averages_the_texts(model):
    from geolens.interventions.ablation import mean_head_z

    a = geolens.intervene.ablate_heads(model, TEXTS[0], heads=[(0, 0)], how="mean")
    b = geolens.intervene.ablate_heads(
        model, TEXTS[0], heads=[(0, 0)], how="mean", means=mean_head_z(model, model.to_tokens(TEXTS[0]))
    )
    assert a.means_from == "the measured texts"
    assert a.ablated_loss[0] == pytest.approx(b.ablated_loss[0], abs=1e-6)


def test_ablate_heads_refuses_bad_heads_in_one_line(model):
    with pytest.raises(IndexError, match="out of range"):
        geolens.intervene.ablate_heads(model, TEXTS[0], heads=[(9, 0)])
    with pytest.raises(ValueError, match="heads is empty"):
        geolens.intervene.ablate_heads(model, TEXTS[0], heads=[])
    with pytest.raises(ValueError, match="how must be"):
        geolens.intervene.ablate_heads(model, TEXTS[0], heads=[(0, 0)], how="resample")
    with pytest.raises(TypeError, match="integer tensor"):
        geolens.intervene.ablate_heads(model, torch.zeros(1, 4), heads=[(0, 0)])


def test_a_model_by_name():
    s = geolens.intervene.ablate_heads("tiny-gqa", TEXTS[0], heads=[(0, 0)])
    assert s.measured and s.model is geolens.models.resolve_model("tiny-gqa")[0]
