"""Figure objects shared by every geolens visualisation: they display in a notebook and save.

Two kinds, both carrying the numbers they show in ``.data`` (JSON-ready, see :func:`to_jsonable`):

- :class:`HTMLView`: one or more circuitsvis React components (e.g. ``AttentionHeads``,
  ``ColoredTokens``). Rendering always uses circuitsvis' *local* JavaScript bundle
  (``circuitsvis/dist/cdn/iife.js``, shipped inside the wheel), inlined into the page, never the
  unpkg CDN: a saved view works offline. ``_repr_html_`` makes it display in Jupyter;
  :meth:`HTMLView.save` writes a standalone HTML page; :meth:`HTMLView.fragment` gives the
  markup without the bundle, for pages (the report) that inline the bundle once.
- :class:`PlotView`: a matplotlib figure with ``_repr_png_``, :meth:`PlotView.save` (format from
  the suffix) and :meth:`PlotView.to_base64_png` (for embedding into HTML).

circuitsvis' own ``render_local`` writes ``<div id=…/>``, which HTML parses as an *open* tag, so
two views on one page nest and the first render wipes the second; the markup here closes its
divs and calls the global ``CircuitsVis.render(id, CircuitsVis.<Component>, props)`` that the IIFE
bundle defines.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import uuid
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

CIRCUITSVIS_COMPONENT_CLASS = "geolens-circuitsvis"


@lru_cache(maxsize=1)
def circuitsvis_bundle() -> str:
    """The JavaScript of the installed circuitsvis package (IIFE build defining ``CircuitsVis``).

    Closing script tags are removed, as circuitsvis' ``render_local`` does, so the code can sit
    inside a ``<script>`` element.
    """
    import circuitsvis

    path = Path(circuitsvis.__file__).parent / "dist" / "cdn" / "iife.js"
    if not path.exists():
        raise FileNotFoundError(f"circuitsvis is installed without its JavaScript bundle ({path})")
    return path.read_text(encoding="utf-8").replace("</script>", "")


def circuitsvis_version() -> str:
    from importlib.metadata import version

    return version("circuitsvis")


def bundle_script() -> str:
    """``<script>`` element holding the circuitsvis bundle (include once per page, before views)."""
    return f"<script>\n{circuitsvis_bundle()}\n</script>"


def to_jsonable(x: Any) -> Any:
    """Tensors, arrays, DataFrames, dataclasses and numpy scalars as plain JSON values.

    Non-finite floats become ``None`` (JSON has no NaN); dict keys become strings.
    """
    if isinstance(x, torch.Tensor):
        return to_jsonable(x.detach().cpu().double().numpy() if x.is_floating_point() else x.detach().cpu().numpy())
    if isinstance(x, np.ndarray):
        return [to_jsonable(v) for v in x.tolist()] if x.ndim else to_jsonable(x.item())
    if isinstance(x, (np.floating, float)):
        x = float(x)
        return x if math.isfinite(x) else None
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.bool_,)):
        return bool(x)
    if isinstance(x, dict):
        return {str(k): to_jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_jsonable(v) for v in x]
    if hasattr(x, "to_dict") and hasattr(x, "columns"):  # pandas DataFrame
        return {"columns": [str(c) for c in x.columns], "rows": to_jsonable(x.to_dict(orient="records"))}
    if hasattr(x, "__dataclass_fields__"):
        return {k: to_jsonable(getattr(x, k)) for k in x.__dataclass_fields__}
    if isinstance(x, Path):
        return str(x)
    return x


def _script_json(props: dict[str, Any]) -> str:
    """JSON for a ``<script>`` body, with every ``<`` written ``\\u003c``.

    So no text (a token ``</script>``, ``<!--``, ``<script``) can close the element or switch
    the HTML parser into its escaped-script states; U+2028/U+2029 are escaped for older JS
    parsers. The value JavaScript reads is unchanged.
    """
    clean = {k: to_jsonable(v) for k, v in props.items() if v is not None}
    text = json.dumps(clean, allow_nan=False)
    return text.replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


@dataclass
class Component:
    """One circuitsvis React component with its props (camelCase, as the JS expects)."""

    name: str
    props: dict[str, Any]
    caption: str | None = None
    id: str = field(default_factory=lambda: "geolens-cv-" + uuid.uuid4().hex[:12])

    def markup(self) -> str:
        cap = f'<div class="geolens-caption">{html.escape(self.caption)}</div>' if self.caption else ""
        return (
            f'{cap}<div id="{self.id}" class="{CIRCUITSVIS_COMPONENT_CLASS}" data-component="{self.name}" '
            f'style="margin: 8px 0 18px 0;"></div>\n'
            f'<script>CircuitsVis.render("{self.id}", CircuitsVis.{self.name}, {_script_json(self.props)});</script>'
        )


class HTMLView:
    """circuitsvis components with a title and their numbers; displays in Jupyter, saves to HTML."""

    def __init__(self, components: list[Component], *, title: str = "", data: dict[str, Any] | None = None):
        if not components:
            raise ValueError("an HTMLView needs at least one component")
        self.components = components
        self.title = title
        self.data = data or {}

    def fragment(self, *, include_bundle: bool = False) -> str:
        """The view's markup; with ``include_bundle`` it also carries the circuitsvis JS."""
        head = f"<h4>{html.escape(self.title)}</h4>\n" if self.title else ""
        body = "\n".join(c.markup() for c in self.components)
        return (bundle_script() + "\n" if include_bundle else "") + f'<div class="geolens-view">{head}{body}</div>'

    def _repr_html_(self) -> str:
        return self.fragment(include_bundle=True)

    def to_html(self) -> str:
        """A standalone HTML page (the circuitsvis bundle inlined, nothing fetched)."""
        return (
            '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
            f"<title>{html.escape(self.title or 'geolens')}</title></head>\n<body>\n"
            f"{self.fragment(include_bundle=True)}\n</body></html>\n"
        )

    def save(self, path: str | Path) -> Path:
        """Write :meth:`to_html` to ``path`` (``.html``), or the numbers to ``path`` (``.json``)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".json":
            path.write_text(json.dumps(to_jsonable(self.data), indent=1), encoding="utf-8")
        else:
            path.write_text(self.to_html(), encoding="utf-8")
        return path

    def __repr__(self) -> str:
        names = ", ".join(c.name for c in self.components)
        return f"HTMLView({self.title!r}: {names})"


class PlotView:
    """A matplotlib figure with its numbers; displays in Jupyter (PNG) and saves to PNG/SVG/PDF."""

    def __init__(self, figure, *, title: str = "", data: dict[str, Any] | None = None):
        self.figure = figure
        self.title = title
        self.data = data or {}

    def to_png_bytes(self, dpi: int = 100) -> bytes:
        buf = io.BytesIO()
        self.figure.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
        return buf.getvalue()

    def to_base64_png(self, dpi: int = 100) -> str:
        return base64.b64encode(self.to_png_bytes(dpi)).decode("ascii")

    def _repr_png_(self) -> bytes:
        return self.to_png_bytes()

    def save(self, path: str | Path, dpi: int = 100) -> Path:
        """Save the figure (format from the suffix), or its numbers when the suffix is ``.json``."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".json":
            path.write_text(json.dumps(to_jsonable(self.data), indent=1), encoding="utf-8")
        else:
            self.figure.savefig(path, dpi=dpi, bbox_inches="tight")
        return path

    def close(self) -> None:
        import matplotlib.pyplot as plt

        plt.close(self.figure)

    def __repr__(self) -> str:
        return f"PlotView({self.title!r})"


@lru_cache(maxsize=1)
def _notebook_figure_class():
    from matplotlib.figure import Figure

    class NotebookFigure(Figure):
        """A matplotlib Figure that shows itself in a notebook as a PNG without pyplot
        (``_repr_png_``): what :meth:`geolens.Attribution.plot` returns."""

        def _repr_png_(self) -> bytes:
            buf = io.BytesIO()
            self.savefig(buf, format="png", dpi=100, bbox_inches="tight")
            return buf.getvalue()

    return NotebookFigure


def notebook_figure(*args, **kwargs):
    """A matplotlib Figure (Agg canvas, no display needed) that a notebook shows as a PNG."""
    return _notebook_figure_class()(*args, **kwargs)


def new_figure(*args, **kwargs):
    """A matplotlib figure created with the non-interactive Agg canvas (no display needed)."""
    from matplotlib.figure import Figure

    fig = Figure(*args, **kwargs)
    return fig
