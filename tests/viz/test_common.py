"""What every view shares (geolens.viz.common): an HTMLView saves a self-contained page and needs
components, the props' JSON cannot close its script element or open a comment, and to_jsonable
handles tensors, NaN and frames."""

from __future__ import annotations

import json
import re

import pytest
import torch

from geolens import viz
from geolens.viz.common import Component, HTMLView, circuitsvis_bundle, to_jsonable
from viz.conftest import component_props


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
    assert component_props(comp)["tokens"] == ["</script><b>x"]


def test_script_json_escapes_comment_openers_and_every_angle_bracket():
    """``<!--`` inside a script switches the HTML parser to its escaped state."""
    tokens = ["<!--", "<script>", "a<b", "\u2028"]
    comp = Component("ColoredTokens", {"tokens": tokens, "values": [1.0, 2.0, 3.0, 4.0]})
    body = comp.markup().split("<script>", 1)[1].rsplit("</script>", 1)[0]
    assert "<" not in body and "\u2028" not in body
    assert component_props(comp)["tokens"] == tokens


def test_to_jsonable_handles_tensors_nan_and_frames():
    import pandas as pd

    out = to_jsonable({"t": torch.tensor([1.0, float("nan")]), 3: torch.tensor(2), "df": pd.DataFrame({"a": [1]})})
    assert out == {"t": [1.0, None], "3": 2, "df": {"columns": ["a"], "rows": [{"a": 1}]}}
    json.dumps(out, allow_nan=False)


def test_html_view_needs_components():
    with pytest.raises(ValueError):
        HTMLView([])
