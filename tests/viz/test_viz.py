"""geolens.viz: the numbers each view shows, its circuitsvis props, and saving."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest
import reference
import torch

from geolens import viz
from geolens.viz.common import Component, HTMLView, PlotView, circuitsvis_bundle, to_jsonable


def _props(component: Component) -> dict:
    """The props as the page will read them (through the JSON in the script tag)."""
    markup = component.markup()
    body = re.search(r"CircuitsVis\.render\(\"[^\"]+\", CircuitsVis\.\w+, (.*)\);</script>", markup, re.S).group(1)
    return json.loads(body)


def test_contribution_heatmaps_show_the_reference_values_with_negatives(tiny):
    model, tokens, cache = tiny
    view = viz.contribution_heatmaps(model, cache, tokens, 1, batch_index=1, mode="intra")
    ref = reference.contributions(model, cache, 1, "intra")[1]  # [h, q, k]
    attn, contrib = view.components
    assert attn.name == contrib.name == "AttentionHeads"
    shown = torch.tensor(_props(contrib)["attention"], dtype=torch.float64)
    torch.testing.assert_close(shown, ref, atol=2e-5, rtol=1e-4)
    pattern, _, _ = reference.raw_tensors(model, cache, 1)
    torch.testing.assert_close(
        torch.tensor(_props(attn)["attention"], dtype=torch.float64), pattern[1], atol=1e-6, rtol=0
    )
    # each sign has its own scale (queries ≥ 1): full red at the most negative weight, full blue at the
    # largest positive one, so that negatives much smaller than the positives are still visibly red
    visible = torch.tril(torch.ones(ref.shape[-1], ref.shape[-1], dtype=torch.bool))
    p = _props(contrib)
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
    assert _props(attn)["minValue"] == -_props(attn)["maxValue"]
    share = (ref[:, visible] < 0).double().mean().item()
    assert view.data["contribution_negative_share"] == pytest.approx(share, abs=1e-9)
    assert p["tokens"] == [model.tokenizer.decode([t]) for t in tokens[1].tolist()]
    assert p["attentionHeadNames"] == [f"L1H{h}" for h in range(model.cfg.n_heads)]


def test_heatmap_data_has_negative_contributions_coloured_red(tiny_gqa):
    model, tokens, cache = tiny_gqa
    view = viz.contribution_heatmaps(model, cache, tokens, 1, mode="intra")
    values = torch.tensor(_props(view.components[1])["attention"])
    visible = torch.tril(torch.ones(values.shape[-1], values.shape[-1], dtype=torch.bool))
    negative = values[:, visible] < 0
    assert negative.any() and view.data["contribution_negative_share"] == pytest.approx(negative.double().mean().item())
    p = _props(view.components[1])
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
        torch.tensor(_props(attn_c)["values"], dtype=torch.float64), pattern[0, 2, i, : i + 1], atol=1e-6, rtol=0
    )
    torch.testing.assert_close(
        torch.tensor(_props(contrib_c)["values"], dtype=torch.float64), c_intra, atol=2e-5, rtol=1e-4
    )
    assert len(_props(contrib_c)["tokens"]) == i + 1

    layer = viz.source_colors(model, cache, tokens, 1, query=-1)
    c_inter = reference.contributions(model, cache, 1, "inter")[0, :, -1].sum(0)
    torch.testing.assert_close(layer.data["contribution"], c_inter, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(layer.data["attention"], pattern[0, :, -1].mean(0), atol=1e-6, rtol=0)
    assert layer.data["contribution"].sum().item() == pytest.approx(1.0, abs=1e-5)
    p = _props(layer.components[1])
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
    sym = _props(viz.signed_heatmaps(values, ["a", "b", "c"]).components[0])
    assert sym["minValue"] == -sym["maxValue"] == pytest.approx(-1.04)
    view = viz.signed_heatmaps(values, ["a", "b", "c"], scale="per_sign")
    p = _props(view.components[0])
    assert p["maxValue"] == pytest.approx(1.04) and p["minValue"] == pytest.approx(-0.04)
    assert view.data["scale"]["kind"] == "per_sign"
    only_positive = viz.signed_heatmaps(values.abs(), ["a", "b", "c"], scale="per_sign")
    assert _props(only_positive.components[0])["minValue"] == -1.0  # no negative value: a neutral scale


def test_html_view_saves_a_self_contained_page(tiny_gqa, tmp_path):
    model, tokens, cache = tiny_gqa
    view = viz.contribution_heatmaps(model, cache, tokens, 1)
    page = view.save(tmp_path / "heads.html").read_text(encoding="utf-8")
    assert circuitsvis_bundle()[:2000] in page  # the local bundle, inlined
    assert not re.search(r"<script[^>]+src=", page) and "unpkg.com" not in page
    assert page.count('class="geolens-circuitsvis"') == 2
    assert page.count("CircuitsVis.render(") == 2
    # every component div is closed (circuitsvis' own markup leaves <div/> open)
    assert re.search(r'<div id="geolens-cv-[0-9a-f]+"[^>]*></div>', page)
    assert view._repr_html_().count("var CircuitsVis") == 1
    numbers = json.loads(view.save(tmp_path / "heads.json").read_text())
    assert numbers["layer"] == 1 and len(numbers["contribution"]) == model.cfg.n_heads


def test_script_json_cannot_close_the_script_element():
    comp = Component("ColoredTokens", {"tokens": ["</script><b>x"], "values": [1.0]})
    assert "</script><b>" not in comp.markup().split("<script>", 1)[1][: -len("</script>")]
    assert _props(comp)["tokens"] == ["</script><b>x"]


def test_script_json_escapes_comment_openers_and_every_angle_bracket():
    """``<!--`` inside a script switches the HTML parser to its escaped state."""
    tokens = ["<!--", "<script>", "a<b", "\u2028"]
    comp = Component("ColoredTokens", {"tokens": tokens, "values": [1.0, 2.0, 3.0, 4.0]})
    body = comp.markup().split("<script>", 1)[1].rsplit("</script>", 1)[0]
    assert "<" not in body and "\u2028" not in body
    assert _props(comp)["tokens"] == tokens


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


def test_to_jsonable_handles_tensors_nan_and_frames():
    import pandas as pd

    out = to_jsonable({"t": torch.tensor([1.0, float("nan")]), 3: torch.tensor(2), "df": pd.DataFrame({"a": [1]})})
    assert out == {"t": [1.0, None], "3": 2, "df": {"columns": ["a"], "rows": [{"a": 1}]}}
    json.dumps(out, allow_nan=False)


def test_html_view_needs_components():
    with pytest.raises(ValueError):
        HTMLView([])


def test_variance_share_chart_draws_signed_shares_that_add_up_to_one():
    import numpy as np
    from conftest import make_tiny

    from geolens.sinks import token_type_decomposition
    from geolens.testing import tiny_tokens
    from geolens.viz.sinks import decomposition_bars

    model = make_tiny("gqa")
    tokens = tiny_tokens(model, ["the cat sat on the mat and then", "a dog ran in the park at noon"], length=10)
    view = decomposition_bars(token_type_decomposition(model, tokens))
    for source, total in view.data["sum_of_shares"].items():
        assert np.allclose(total, 1.0, atol=1e-6), (source, total)
    titles = [ax.get_title() for ax in view.figure.axes]
    assert all("signed share" in t and "add up to 1" in t for t in titles)
    heights = [p.get_height() for ax in view.figure.axes for p in ax.patches]
    shares = view.data["layers"][["share_attention", "share_relnorm", "share_cosine"]].to_numpy()
    assert len(heights) == shares.size  # grouped bars: one bar per share, none stacked on another
    assert np.allclose(sorted(heights), sorted(shares.ravel()))
    view.close()


def test_regime_grid_has_a_colour_bar_keyed_by_winning_share():
    import numpy as np

    from geolens import taxonomy
    from geolens.viz.taxonomy import REGIME_COLORS, _rgb, regime_grid_plot

    counts = torch.tensor([[[5.0, 1, 1], [1, 5, 1], [1, 1, 5]], [[2, 1, 1], [1, 1, 3], [1, 4, 1]]])
    view = regime_grid_plot({"a": taxonomy.taxonomy_from_counts(counts)})
    bars = [ax for ax in view.figure.axes if ax.get_ylabel() == "winning share"]
    assert len(bars) == 1
    image = bars[0].get_images()[0].get_array()  # [level, regime, 3], level 0 = share 1/3
    assert image.shape[1] == len(REGIME_COLORS)
    for k, colour in enumerate(REGIME_COLORS.values()):
        assert np.allclose(image[-1, k], _rgb(colour))  # share 1: the full regime colour
        assert image[0, k].mean() > image[-1, k].mean()  # share 1/3: paler
    assert [t.get_text() for t in bars[0].get_xticklabels()] == [r[:3] for r in REGIME_COLORS]
    assert view.data["colour_bar"]["winning_share"] == [1 / 3, 1.0]
    view.close()


def _flow_labels(page: str) -> dict[int, str]:
    """Position → class of each token label on the flow view's axis."""
    return {int(p): cls for cls, p in re.findall(r'<text class="(gl-flow-col[^"]*)" data-pos="(\d+)"', page)}


def test_flow_view_labels_every_token_on_its_axis():
    from geolens.flow.routes import FlowGraph
    from geolens.viz.flow import flow_routes_html

    tokens = ["<bos>", "the", " cat", " sat", " on", " the"]
    graph = FlowGraph(
        position=5,
        threshold=0.1,
        method="contribution",
        n_layers=1,
        tokens=tokens,
        nodes=[(0, 0), (0, 5), (1, 5)],  # the routes pass through positions 0 and 5 only
        edges=[(1, 0, 5, 0.4), (1, 5, 5, 0.6)],
    )
    page = flow_routes_html(graph)
    labels = _flow_labels(page)
    assert sorted(labels) == list(range(len(tokens)))  # every token, not only those on a route
    assert {p for p, cls in labels.items() if "gl-flow-idle" not in cls} == {0, 5}
    for token in tokens:
        assert f"{html.escape(token)}</text>" in page


def test_flow_view_of_a_long_prompt_labels_every_token_within_a_bounded_width():
    from geolens.flow.routes import FlowGraph
    from geolens.viz.flow import MAX_WIDTH, MIN_COL_W, PAD_X, flow_routes_html

    n = 60
    graph = FlowGraph(
        position=n - 1,
        threshold=0.1,
        method="contribution",
        n_layers=2,
        tokens=[f"t{j}" for j in range(n)],
        nodes=[(0, 0), (1, n - 1), (2, n - 1)],
        edges=[(1, 0, n - 1, 0.5), (2, n - 1, n - 1, 0.9)],
    )
    page = flow_routes_html(graph)
    assert sorted(_flow_labels(page)) == list(range(n))
    width = int(re.search(r'<svg width="(\d+)"', page).group(1))
    assert width <= max(MAX_WIDTH, PAD_X + MIN_COL_W * n + 20)


HELPERS = {  # public functions of geolens.viz that draw nothing: they prepare what the figures show
    "str_tokens",
    "coinciding_curves",
    "fraction_ticks",
    "shown_token",
    "attribution_figure",  # the matplotlib Figure of Attribution.plot()
}


def test_every_viz_function_returns_what_its_name_and_docstring_say():
    """geolens.viz's rule (its module docstring): figure functions return HTMLView or PlotView,
    ``*_html`` and ``*_page`` functions a str, attribution_figure a matplotlib Figure."""
    import importlib
    import inspect
    import pkgutil
    import typing

    import geolens.viz

    wrong = []
    for info in pkgutil.iter_modules(geolens.viz.__path__):
        module = importlib.import_module(f"geolens.viz.{info.name}")
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if name.startswith("_") or fn.__module__ != module.__name__ or info.name == "common":
                continue
            returns = typing.get_type_hints(fn).get("return") if fn.__annotations__.get("return") else None
            if name in HELPERS:
                continue
            if name.startswith("save_"):
                ok = returns is Path
            elif name.endswith(("_html", "_page")):
                ok = returns is str
            else:
                ok = returns in (geolens.viz.HTMLView, geolens.viz.PlotView) or (
                    typing.get_origin(returns) is tuple and geolens.viz.PlotView in typing.get_args(returns)
                )
            if not ok:
                wrong.append(f"geolens.viz.{info.name}.{name} -> {returns}")
    assert not wrong, wrong
