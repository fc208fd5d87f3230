"""Taxonomy figures (geolens.viz.taxonomy): the regime grid has a colour bar keyed by the winning
share."""

from __future__ import annotations

import torch


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
