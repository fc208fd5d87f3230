"""Sink figures (geolens.viz.sinks): the variance-share chart draws signed shares that add up to one."""

from __future__ import annotations


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


def test_counts_read_singular_for_one():
    """Figures and report text count with geolens.claims.counted: "1 window", never "1 windows"."""
    from geolens.claims import counted
    from geolens.sinks.controls import sink_controls
    from geolens.testing import tiny_tokens
    from geolens.viz.sinks import controls_plot
    from tests.conftest import make_tiny

    assert counted(1, "sequence") == "1 sequence" and counted(2, "sequence") == "2 sequences"
    assert counted(0, "window") == "0 windows" and counted(1, "query", "queries") == "1 query"
    model = make_tiny("gqa")
    one = sink_controls(model, tiny_tokens(model, length=12)[:1], layers=[1], n_boot=50)
    assert controls_plot(one).figure._suptitle.get_text().startswith("Sink-value controls: 1 window × 12 tokens, ")
