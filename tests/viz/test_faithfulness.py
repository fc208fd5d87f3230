"""Faithfulness and pruning figures (geolens.viz.faithfulness): the legend outside the panels, ticks
that do not overlap, and an axis that fits the data."""

from __future__ import annotations

import pandas as pd
from figures import overlaps, renderer


def test_faithfulness_legend_is_outside_the_panels_and_ticks_do_not_overlap():
    from geolens.faithfulness import FRACTIONS
    from geolens.viz.faithfulness import faithfulness_curves_plot

    rows = [
        dict(
            metric=m,
            direction=d,
            fraction=k,
            delta_logprob=-(i + 1) * k,
            delta_logprob_lo=-(i + 1) * k - 0.1,
            delta_logprob_hi=-(i + 1) * k + 0.1,
        )
        for i, m in enumerate(["raw_attention", "value_weighted", "contribution", "random"])
        for d in ("comprehensiveness", "sufficiency")
        for k in FRACTIONS
    ]
    view = faithfulness_curves_plot(pd.DataFrame(rows), "delta_logprob")
    r = renderer(view.figure)
    legend = view.figure.axes[0].get_legend()
    assert legend is not None
    box = legend.get_window_extent(r)
    for ax in view.figure.axes:
        assert not overlaps(box, ax.get_window_extent(r)), "the legend covers a panel"
        labels = [t for t in ax.get_xticklabels() if t.get_visible() and t.get_text()]
        assert len(labels) >= 4
        extents = sorted((t.get_window_extent(r) for t in labels), key=lambda b: b.x0)
        assert all(a.x1 <= b.x0 for a, b in zip(extents, extents[1:])), [t.get_text() for t in labels]
    view.close()


def test_pruning_axis_fits_the_data_and_the_legend_is_outside():
    from geolens.viz.faithfulness import pruning_curves_plot

    pr = pd.DataFrame(
        [
            dict(order=o, retention=r, delta_ppl=(1.05 - r) * s)
            for o, s in (("regime", 500), ("weight", 800), ("random_0", 600), ("random_1", 650))
            for r in (0.9, 0.7, 0.5, 0.3, 0.1)
        ]
    )
    view = pruning_curves_plot(pr)
    ax = view.figure.axes[0]
    lo, hi = ax.get_ylim()
    assert ax.get_yscale() == "log" and lo > 0  # every ΔPPL is positive: no empty negative half
    assert lo >= pr.delta_ppl.min() / 2 and hi <= pr.delta_ppl.max() * 2
    r = renderer(view.figure)
    assert not overlaps(ax.get_legend().get_window_extent(r), ax.get_window_extent(r))
    view.close()
    mixed = pruning_curves_plot(
        pd.DataFrame([dict(order="regime", retention=r, delta_ppl=v) for r, v in ((0.9, -0.2), (0.5, 3.0))])
    )
    lo, hi = mixed.figure.axes[0].get_ylim()
    assert mixed.figure.axes[0].get_yscale() == "linear" and lo < -0.2 and hi > 3.0
    mixed.close()
