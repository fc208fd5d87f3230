"""geolens.intervene.sink: scale_sink_values against a hand-written hook loop (tests/intervene/hand.py),
its per-text interval, its drift tables against geolens.sinks.semantic_drift, and its context manager."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import geolens
from geolens.interventions import active_hook_count
from tests.intervene.hand import TEXTS, loss_with, scale_v0

# ---------------------------------------------------------------------------------------------
# scale_sink_values


@pytest.mark.parametrize("lam", [0.0, 0.5, 2.0])
def test_scale_sink_values_equals_a_hand_written_hook_loop(model, lam):
    before = active_hook_count(model)
    s = geolens.intervene.scale_sink_values(model, TEXTS[0], lam=lam, layers=[1])
    tokens = model.to_tokens(TEXTS[0])
    clean = loss_with(model, tokens)
    edited = loss_with(model, tokens, [("blocks.1.attn.hook_v", scale_v0(lam))])
    row = s.summary.set_index("lambda")
    assert row.loc[1.0, "loss"] == pytest.approx(clean, abs=1e-6)
    assert row.loc[lam, "loss"] == pytest.approx(edited, abs=1e-6)
    assert row.loc[lam, "delta_loss"] == pytest.approx(edited - clean, abs=1e-6)
    assert row.loc[lam, "delta_ppl"] == pytest.approx(np.exp(edited) - np.exp(clean), rel=1e-5)
    with torch.no_grad(), model.hooks(fwd_hooks=[("blocks.1.attn.hook_v", scale_v0(lam))]):
        reference = model(tokens, return_type="logits")
    assert torch.allclose(s.edited_logits, reference, atol=1e-5)
    assert torch.allclose(s.clean_logits, model(tokens, return_type="logits"), atol=1e-5)
    assert active_hook_count(model) == before


def test_scale_sink_values_per_text_loss_and_its_interval(model):
    s = geolens.intervene.scale_sink_values(model, TEXTS, lam=0.0, layers=[0, 1], keep_logits=False)
    per = s.per_text
    for i, text in enumerate(TEXTS):  # in the call's order, although the texts ran grouped by length
        tokens = model.to_tokens(text)
        hooks = [(f"blocks.{l}.attn.hook_v", scale_v0(0.0)) for l in (0, 1)]
        assert per.clean_loss[i] == pytest.approx(loss_with(model, tokens), abs=1e-6)
        assert per.edited_loss[i] == pytest.approx(loss_with(model, tokens, hooks), abs=1e-6)
    est, lo, hi, v = s.interval(n_boot=500)
    assert est == pytest.approx(float(per.delta_loss.mean())) and lo <= est <= hi
    assert v == ("holds" if lo > 0 else "reversed" if hi < 0 else "tie")
    with pytest.raises(ValueError, match="logits were not kept"):
        s.edited_logits
    assert geolens.intervene.scale_sink_values(model, TEXTS[:2], lam=1.0).interval()[3] == "not testable"


def test_scale_sink_values_reports_the_drift_of_semantic_drift_per_layer(model):
    from geolens.sinks import semantic_drift

    s = geolens.intervene.scale_sink_values(model, TEXTS[:2], lam=0.0, layers=[0, 1], lambdas=(0.5,))
    assert s.n_texts == 2 and s.layers == (0, 1)
    assert list(s.summary["lambda"]) == [0.0, 0.5, 1.0]
    groups = [model.to_tokens(TEXTS[1]), model.to_tokens(TEXTS[0])]  # shorter first, as grouped
    direct = semantic_drift(model, groups, lambdas=(0.0, 0.5), layers=[0, 1])
    pd.testing.assert_frame_equal(s.drift.heads, direct.heads)
    per = s.per_layer
    assert set(per.layer) == {0, 1} and len(per) == 3 * 2
    heads = direct.heads
    low = heads[(heads["lambda"] == 0.0) & (heads.layer == 1) & heads.low_norm]
    got = per[(per["lambda"] == 0.0) & (per.layer == 1)].iloc[0]
    assert got.n_low_norm == len(low)
    if len(low):
        assert got.cos_cone_low_norm == pytest.approx(float(low.cos_cone.mean()))


def test_lambda_one_changes_nothing(model):
    s = geolens.intervene.scale_sink_values(model, TEXTS[0], lam=1.0)
    assert torch.equal(s.edited_logits, s.clean_logits)
    assert float(s.summary.delta_loss.abs().max()) == 0.0


def test_scale_sink_values_as_a_context_manager_removes_its_hooks_on_an_exception(model):
    before = active_hook_count(model)
    edit = geolens.intervene.scale_sink_values(model, lam=0.0, layers=[0])
    assert not edit.measured and "not measured" in repr(edit)
    tokens = model.to_tokens(TEXTS[0])
    with pytest.raises(RuntimeError, match="boom"):
        with edit:
            assert active_hook_count(model) > before
            inside = model(tokens, return_type="logits")
            raise RuntimeError("boom")
    assert active_hook_count(model) == before
    reference = geolens.intervene.scale_sink_values(model, tokens, lam=0.0, layers=[0])
    assert torch.allclose(inside, reference.edited_logits, atol=1e-5)
    with pytest.raises(ValueError, match="nothing was measured"):
        edit.plot()


def test_scale_sink_values_plot_names_the_edit(model):
    s = geolens.intervene.scale_sink_values(model, TEXTS[0], lam=0.0, layers=[1])
    fig = s.plot().figure
    text = fig._suptitle.get_text()
    assert "in layer 1 (" in text and "λ ∈ {0, 1}" in text and "; 1 sequence;" in text
    assert all(ax.get_xlabel() and ax.get_ylabel() for ax in fig.axes)
    assert "<b>SinkScaling</b>" in s._repr_html_()
