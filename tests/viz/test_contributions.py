"""Contribution figures (geolens.viz.contributions): the heatmaps show the reference values with
negatives red on a per-sign scale, a subset of heads, source colours per head and per layer, the
sink attention-vs-contribution plot and its PNG, bad input refused."""

from __future__ import annotations

import pytest
import reference
import torch

from geolens import viz
from geolens.viz.common import PlotView
from viz.conftest import component_props


def test_contribution_heatmaps_show_the_reference_values_with_negatives(tiny):
    model, tokens, cache = tiny
    view = viz.contribution_heatmaps(model, cache, tokens, 1, batch_index=1, mode="intra")
    ref = reference.contributions(model, cache, 1, "intra")[1]  # [h, q, k]
    attn, contrib = view.components
    assert attn.name == contrib.name == "AttentionHeads"
    shown = torch.tensor(component_props(contrib)["attention"], dtype=torch.float64)
    torch.testing.assert_close(shown, ref, atol=2e-5, rtol=1e-4)
    pattern, _, _ = reference.raw_tensors(model, cache, 1)
    torch.testing.assert_close(
        torch.tensor(component_props(attn)["attention"], dtype=torch.float64), pattern[1], atol=1e-6, rtol=0
    )
    # each sign has its own scale (queries ≥ 1): full red at the most negative weight, full blue at the
    # largest positive one, so that negatives much smaller than the positives are still visibly red
    visible = torch.tril(torch.ones(ref.shape[-1], ref.shape[-1], dtype=torch.bool))
    p = component_props(contrib)
    assert p["negativeColor"] == "red" and p["positiveColor"] == "blue"
    assert p["maxValue"] == pytest.approx(ref[:, 1:].max().item(), rel=1e-4)
    lowest = ref[:, 1:].min().item()
    assert p["minValue"] == (
        pytest.approx(lowest, rel=1e-4) if lowest < 0 else -p["maxValue"]
    )  # no negative: symmetric
    kind = "per_sign" if lowest < 0 else "symmetric"
    assert view.data["contribution_scale"] == {"kind": kind, "min": p["minValue"], "max": p["maxValue"]}
    assert f"full blue {p['maxValue']:+.3g}" in contrib.caption
    assert (f"full red {p['minValue']:+.3g}" if lowest < 0 else "no negative value") in contrib.caption
    # what each heatmap shows is named as the metric registry names it
    assert contrib.caption.startswith("contribution weights c, c_ij = α_ij‖ṽ_j‖/‖o_i‖ cos(o_i, ṽ_j)")
    assert (
        attn.caption.startswith("raw attention α, α_ij (intra-head): white 0 … full blue")
        and "no negative value" in attn.caption
    )
    # attention keeps the symmetric scale
    assert component_props(attn)["minValue"] == -component_props(attn)["maxValue"]
    share = (ref[:, visible] < 0).double().mean().item()
    assert view.data["contribution_negative_share"] == pytest.approx(share, abs=1e-9)
    assert p["tokens"] == [model.tokenizer.decode([t]) for t in tokens[1].tolist()]
    assert p["attentionHeadNames"] == [f"L1H{h}" for h in range(model.cfg.n_heads)]


def test_heatmap_data_has_negative_contributions_coloured_red(tiny_gqa):
    model, tokens, cache = tiny_gqa
    view = viz.contribution_heatmaps(model, cache, tokens, 1, mode="intra")
    values = torch.tensor(component_props(view.components[1])["attention"])
    visible = torch.tril(torch.ones(values.shape[-1], values.shape[-1], dtype=torch.bool))
    negative = values[:, visible] < 0
    assert negative.any() and view.data["contribution_negative_share"] == pytest.approx(negative.double().mean().item())
    p = component_props(view.components[1])
    assert p["minValue"] <= values[:, 1:].min().item() < 0 and p["negativeColor"] == "red"


def test_contribution_heatmaps_subset_of_heads_and_bad_metric(tiny_gqa):
    model, tokens, cache = tiny_gqa
    view = viz.contribution_heatmaps(model, cache, tokens, 0, heads=[3, 1], metrics=["contribution"])
    full = viz.contribution_heatmaps(model, cache, tokens, 0, metrics=["contribution"])
    torch.testing.assert_close(view.data["contribution"], full.data["contribution"][[3, 1]])
    with pytest.raises(ValueError, match="unknown metric"):
        viz.contribution_heatmaps(model, cache, tokens, 0, metrics=["entropy"])
    with pytest.raises(IndexError, match="batch_index"):
        viz.contribution_heatmaps(model, cache, tokens, 0, batch_index=5)


def test_source_colors_per_head_and_per_layer(tiny):
    model, tokens, cache = tiny
    i = 7
    pattern, _, _ = reference.raw_tensors(model, cache, 1)
    head = viz.source_colors(model, cache, tokens, 1, query=i, head=2)
    c_intra = reference.contributions(model, cache, 1, "intra")[0, 2, i, : i + 1]
    attn_c, contrib_c = head.components
    assert attn_c.name == "ColoredTokens"
    torch.testing.assert_close(
        torch.tensor(component_props(attn_c)["values"], dtype=torch.float64),
        pattern[0, 2, i, : i + 1],
        atol=1e-6,
        rtol=0,
    )
    torch.testing.assert_close(
        torch.tensor(component_props(contrib_c)["values"], dtype=torch.float64), c_intra, atol=2e-5, rtol=1e-4
    )
    assert len(component_props(contrib_c)["tokens"]) == i + 1

    layer = viz.source_colors(model, cache, tokens, 1, query=-1)
    c_inter = reference.contributions(model, cache, 1, "inter")[0, :, -1].sum(0)
    torch.testing.assert_close(layer.data["contribution"], c_inter, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(layer.data["attention"], pattern[0, :, -1].mean(0), atol=1e-6, rtol=0)
    assert layer.data["contribution"].sum().item() == pytest.approx(1.0, abs=1e-5)
    p = component_props(layer.components[1])
    assert p["minValue"] == -p["maxValue"] == pytest.approx(-c_inter.abs().max().item(), rel=1e-4)
    with pytest.raises(IndexError, match="query"):
        viz.source_colors(model, cache, tokens, 1, query=99)
    with pytest.raises(IndexError, match="head"):
        viz.source_colors(model, cache, tokens, 1, head=model.cfg.n_heads)


def test_signed_heatmaps_rejects_bad_input():
    with pytest.raises(ValueError, match="query == key"):
        viz.signed_heatmaps(torch.zeros(2, 3, 4), ["a"] * 4)
    with pytest.raises(ValueError, match="tokens"):
        viz.signed_heatmaps(torch.zeros(2, 3, 3), ["a"] * 4)
    with pytest.raises(ValueError, match="NaN"):
        viz.signed_heatmaps(torch.full((1, 2, 2), float("nan")), ["a", "b"])
    v = viz.signed_heatmaps(torch.tensor([[[1.0, 0.0], [-3.0, 2.0]]]), ["a", "b"])
    assert v.data["max_abs"] == 3.0  # query 0's trivial value does not set the scale
    with pytest.raises(ValueError, match="scale"):
        viz.signed_heatmaps(torch.zeros(1, 2, 2), ["a", "b"], scale="log")


def test_per_sign_scale_makes_small_negatives_full_red():
    """On a symmetric scale a −0.04 next to +1 is 4% red (near white); per sign it is full red."""
    values = torch.tensor([[[1.0, 0.0, 0.0], [0.9, 0.1, 0.0], [1.04, -0.04, 0.0]]])
    sym = component_props(viz.signed_heatmaps(values, ["a", "b", "c"]).components[0])
    assert sym["minValue"] == -sym["maxValue"] == pytest.approx(-1.04)
    view = viz.signed_heatmaps(values, ["a", "b", "c"], scale="per_sign")
    p = component_props(view.components[0])
    assert p["maxValue"] == pytest.approx(1.04) and p["minValue"] == pytest.approx(-0.04)
    assert view.data["scale"]["kind"] == "per_sign"
    only_positive = viz.signed_heatmaps(values.abs(), ["a", "b", "c"], scale="per_sign")
    assert component_props(only_positive.components[0])["minValue"] == -1.0  # no negative value: a neutral scale


def test_sink_plot_and_png_saving(tmp_path):
    a, c = torch.tensor([0.5, 0.8, 0.9]), torch.tensor([0.1, -0.05, 0.02])
    view = viz.sink_attention_vs_contribution_plot(a, c, sink_attention_sem=torch.tensor([0.01, 0.02, 0.0]))
    assert isinstance(view, PlotView)
    png = view.save(tmp_path / "sink.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png == view._repr_png_() or len(png) > 1000
    assert view.to_base64_png()[:8] == "iVBORw0K"
    torch.testing.assert_close(view.data["sink_contribution"], c.double())
    with pytest.raises(ValueError, match="equal length"):
        viz.sink_attention_vs_contribution_plot(a, c[:2])
