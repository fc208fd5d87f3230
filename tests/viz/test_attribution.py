"""Pictures of an attribution (geolens.viz.attribution) on a stand-in with known scores: token labels
as an axis shows them, one bar per source token and panel per method with the scores as widths and
the sign as colour, and the HTML fragment's escaping, colour strengths and query outline."""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from matplotlib.colors import to_hex

from geolens.viz.attribution import NEGATIVE, POSITIVE, attribution_figure, attribution_html, shown_token

SCORES = torch.tensor([[0.5, -1.0, 0.25, 2.0], [0.0, 0.1, -0.2, 0.4]], dtype=torch.float64)  # [method, source]


def _attribution(position: int = 2, truncated_from=None):
    """Two methods over four tokens; scores beyond ``position`` are never shown."""
    return SimpleNamespace(
        score_rows=lambda: SCORES,
        position=position,
        tokens=["<bos>", " Paris", "a<b>&", "\n"],
        methods=["m1", "m2"],
        labels=["method one", "method two"],
        where="query 2",
        truncated_from=truncated_from,
    )


def test_shown_token_marks_spaces_newlines_and_tabs():
    assert shown_token(" Paris") == "␣Paris" and shown_token("a\nb") == "a⏎b" and shown_token("\tx") == "⇥x"
    assert shown_token("plain") == "plain" and shown_token("  ") == "␣ "
    assert shown_token("\r") == repr("\r") and shown_token("") == "''"  # nothing visible: its repr


def test_the_figure_draws_one_bar_per_source_and_one_panel_per_method():
    fig = attribution_figure(_attribution())
    axes = fig.axes
    assert len(axes) == 2 and [ax.get_title() for ax in axes] == ["method one", "method two"]
    assert [t.get_text() for t in axes[0].get_yticklabels()] == ["0 <bos>", "1 ␣Paris", "2 a<b>&"]
    for ax, row in zip(axes, SCORES[:, :3]):
        widths = [bar.get_width() for bar in ax.patches]
        assert widths == pytest.approx(row.tolist())
        colours = [to_hex(bar.get_facecolor()) for bar in ax.patches]
        assert colours == [POSITIVE if v >= 0 else NEGATIVE for v in row.tolist()]
    assert axes[0].get_ylim() == (2.5, -0.5)  # the first token at the top
    assert fig._suptitle.get_text() == "query 2"


def test_the_html_escapes_tokens_and_scales_colours_by_the_largest_magnitude():
    page = attribution_html(_attribution(truncated_from=300))
    assert "a&lt;b&gt;&amp;" in page and "a<b>&" not in page
    assert "text cut from 300 tokens" in page
    rows = re.findall(r"<div data-method='(m\d)'>(.*?)</div>", page)
    assert [name for name, _ in rows] == ["m1", "m2"]
    for (_, row), scores in zip(rows, SCORES[:, :3].numpy()):
        styles = re.findall(r'style="background:([^;]+);', row)
        assert len(styles) == 3
        scale = np.abs(scores).max()
        for style, v in zip(styles, scores):
            if v == 0:
                assert style == "rgba(31,119,180,0.000)"  # a zero score counts as positive, strength 0
                continue
            rgb = "31,119,180" if v > 0 else "214,39,40"
            assert style == f"rgba({rgb},{min(abs(v) / scale, 1) * 0.85:.3f})"
        assert row.count("outline:2px solid #444") == 1 and 'title="2 ' in row.split("outline")[0].rsplit("<span", 1)[1]


def test_every_panel_says_what_a_score_is_with_its_unit_from_the_registry():
    """The x axis of each panel: the registry's unit of the method (geolens.methods.Method.unit);
    "score" for a method the registry does not know (m1, m2 above)."""
    from geolens.methods import get_method
    from geolens.viz.attribution import score_unit

    att = _attribution()
    att.methods = ["contribution_flow", "integrated_gradients"]
    fig = attribution_figure(att)
    shown = [ax.get_xlabel().replace("\n", " ") for ax in fig.axes]
    assert shown == ["share of the prediction (unitless, a row sums to 1)", "contribution to log p(target) (nats)"]
    assert [ax.get_xlabel() for ax in attribution_figure(_attribution()).axes] == ["score", "score"]
    units = {m: score_unit(m) for m in ("alti", "attention_rollout", "value_zeroing_rollout", "grad_x_input")}
    assert units == {
        "alti": "share of the prediction (unitless, a row sums to 1)",
        "attention_rollout": "share of the prediction (unitless, a row sums to 1)",
        "value_zeroing_rollout": "share of the prediction (unitless, a row sums to 1)",
        "grad_x_input": "contribution to log p(target) (nats)",
    }
    for name in ("raw_attention", "value_weighted", "output_normalized", "contribution", "contribution_abs"):
        assert get_method(name).unit and score_unit(name) == get_method(name).unit  # every built-in metric has one
    assert get_method("grad_x_input").label == "gradient × input"  # the method's name, as the docs say it
