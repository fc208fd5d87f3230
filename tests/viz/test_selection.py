"""Selection figures (geolens.viz.selection): the two random selection curves are drawn apart."""

from __future__ import annotations

import pandas as pd
import pytest
from figures import overlaps, renderer


def test_the_two_random_selection_curves_are_drawn_apart():
    from geolens.viz.selection import f_vs_n_plot

    rows = []
    for kind in ("top", "random"):
        for sink in ("keep", "exclude"):
            for n, base in zip((1, 2, 4, 8), (1.0, 0.5, 0.3, 0.2)):
                v = base if kind == "random" else min(1.0, base + 0.2)
                v += 0.002 if (kind, sink) == ("random", "exclude") else 0.0
                rows.append(
                    dict(
                        metric="f",
                        space="value",
                        by="attention",
                        distance="cosine",
                        kind=kind,
                        sink=sink,
                        N=n,
                        mean=v,
                        lo=v - 0.01,
                        hi=v + 0.01,
                    )
                )
    view = f_vs_n_plot(pd.DataFrame(rows))
    ax = view.figure.axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    keep, excl = lines["random N-set, sink kept"], lines["random N-set, sink excluded"]
    assert (keep.get_linestyle(), keep.get_marker(), keep.get_linewidth()) != (
        excl.get_linestyle(),
        excl.get_marker(),
        excl.get_linewidth(),
    )
    assert keep.get_marker() != excl.get_marker() and keep.get_linewidth() > 2 * excl.get_linewidth()
    assert view.data["random_coincide"]["cosine"] == pytest.approx(0.002)
    assert any("same random rankings" in t.get_text() for t in view.figure.texts)
    r = renderer(view.figure)
    assert not overlaps(ax.get_legend().get_window_extent(r), ax.get_window_extent(r))
    view.close()
