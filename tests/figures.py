"""Where drawn matplotlib figures put things: a renderer for window extents, and box overlap
(tests of legends and ticks that must not cover the data)."""

from __future__ import annotations


def overlaps(a, b) -> bool:
    """Whether two display-space boxes (matplotlib ``Bbox``) overlap."""
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def renderer(fig):
    """The renderer of ``fig`` drawn once on an Agg canvas (for window extents)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()
