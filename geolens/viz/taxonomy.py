"""Layer × head grid of the Retriever / Mixer / Reset regimes (docs/method.md §6): a PNG and an HTML view.

- :func:`regime_grid_plot`: matplotlib grid, one cell per head coloured by regime, shaded by the
  winning share; one panel per corpus when several taxonomies are given.
- :func:`regime_grid_html`: a standalone HTML page (no JavaScript, works offline) with the same
  grid as a table; each cell's tooltip gives the three shares.
"""

from __future__ import annotations

import html
import warnings
from pathlib import Path

import numpy as np

from geolens.viz.common import PlotView, new_figure

REGIME_COLORS = {"Mixer": "#4C72B0", "Retriever": "#DD8452", "Reset": "#55A868"}


def _rgb(hex_color: str) -> np.ndarray:
    return np.array([int(hex_color[i : i + 2], 16) / 255 for i in (1, 3, 5)])


SHADE_MIN = 0.35  # colour weight of a cell whose winning share is 1/3 (a three-way tie)


def _shade(top_share) -> np.ndarray:
    """Colour weight of a cell: 1/3 (three-way tie) → SHADE_MIN (pale), 1 → 1 (full colour)."""
    return SHADE_MIN + (1 - SHADE_MIN) * (np.asarray(top_share, dtype=float) - 1 / 3) / (2 / 3)


def _cell_colors(tax) -> np.ndarray:
    """[layer, head, 3] RGB: the regime colour, lighter when the winning share is small."""
    shares = tax.shares()
    top = shares.max(-1)
    L, H = tax.regimes.shape
    out = np.ones((L, H, 3))
    for l in range(L):
        for h in range(H):
            w = _shade(top[l, h])
            out[l, h] = (1 - w) * np.ones(3) + w * _rgb(REGIME_COLORS[tax.regimes[l, h]])
    return out


def _colour_bar(ax) -> np.ndarray:
    """The key of the cell colours: one column per regime, from winning share 1/3 (pale) to 1."""
    levels = np.linspace(1 / 3, 1, 50)
    w = _shade(levels)[:, None, None]
    columns = [(1 - w) + w * _rgb(c)[None, None, :] for c in REGIME_COLORS.values()]
    image = np.concatenate(columns, axis=1)  # [level, regime, 3]
    ax.imshow(image, aspect="auto", origin="lower", extent=(-0.5, len(REGIME_COLORS) - 0.5, 1 / 3, 1))
    ax.set_xticks(range(len(REGIME_COLORS)))
    ax.set_xticklabels([r[:3] for r in REGIME_COLORS], fontsize=7, rotation=90)
    ax.yaxis.tick_right()
    ax.yaxis.set_label_position("right")
    ax.set_yticks([1 / 3, 0.5, 2 / 3, 5 / 6, 1])
    ax.set_yticklabels(["1/3", "0.5", "2/3", "5/6", "1"], fontsize=7)
    ax.set_ylabel("winning share", fontsize=8)
    return levels


def regime_grid_plot(taxonomies: dict, *, title: str = "Head regimes") -> PlotView:
    """One panel per ``{name: TaxonomyResult}``; rows = layers, columns = heads.

    A cell's hue is its regime and its strength the winning share (1/3, a three-way tie, is
    palest); the colour bar on the right is the key, one column per regime.

    >>> from geolens.taxonomy import head_taxonomy
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")
    >>> view = regime_grid_plot({"tiny": head_taxonomy(model, tiny_tokens(model, length=16))})
    >>> type(view).__name__, len(view.figure.axes)  # the grid and its colour key
    ('PlotView', 2)
    """
    names = list(taxonomies)
    L, H = next(iter(taxonomies.values())).regimes.shape
    fig = new_figure(figsize=(2.4 + 0.28 * H * len(names), 1.2 + 0.16 * L))
    grid = fig.add_gridspec(1, len(names) + 1, width_ratios=[H] * len(names) + [max(1.2, H / 6)])
    axes = [fig.add_subplot(grid[0, k]) for k in range(len(names))]
    for ax, name in zip(axes, names):
        tax = taxonomies[name]
        ax.imshow(_cell_colors(tax), aspect="auto", interpolation="nearest")
        dist = ", ".join(f"{r[:3]} {100 * tax.distribution[r]:.0f}%" for r in REGIME_COLORS)
        ax.set_title(f"{name}\n{dist}", fontsize=8)
        ax.set_xlabel("head", fontsize=8)
        ax.set_xticks(range(H))
        ax.set_yticks(range(0, L, max(1, L // 10)))
        ax.tick_params(labelsize=7)
    axes[0].set_ylabel("layer", fontsize=8)
    bar = fig.add_subplot(grid[0, -1])
    levels = _colour_bar(bar)
    bar.set_title("key", fontsize=8)
    fig.suptitle(title, fontsize=9)
    with warnings.catch_warnings():  # tiny grids cannot always fit every margin
        warnings.simplefilter("ignore", UserWarning)
        fig.tight_layout()
    data = {
        name: {"regimes": tax.regimes.tolist(), "distribution": tax.distribution} for name, tax in taxonomies.items()
    }
    data["colour_bar"] = {"regimes": list(REGIME_COLORS), "winning_share": [float(levels[0]), float(levels[-1])]}
    return PlotView(fig, title=title, data=data)


def regime_grid_html(taxonomies: dict, *, title: str = "Head regimes", note: str = "") -> str:
    """A standalone HTML page: one table per corpus, cells coloured by regime with share tooltips."""
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:sans-serif;font-size:13px} table{border-collapse:collapse;margin:8px 24px 24px 0;display:inline-table}"
        " td,th{width:26px;height:15px;text-align:center;font-size:10px;border:1px solid #fff} .legend span{padding:2px 8px;margin-right:6px;color:#fff}</style>",
        "</head><body>",
        f"<h2>{html.escape(title)}</h2>",
        f"<p>{html.escape(note)}</p>" if note else "",
        "<p class='legend'>"
        + "".join(f"<span style='background:{c}'>{r}</span>" for r, c in REGIME_COLORS.items())
        + " (paler = smaller winning share)</p>",
    ]
    parts += [_grid_table(name, tax) for name, tax in taxonomies.items()]
    parts.append("</body></html>")
    return "\n".join(parts)


def _grid_table(name: str, tax) -> str:
    """One corpus' grid as an HTML table on one line (the generated rows differ only in their numbers)."""
    colors = _cell_colors(tax)
    shares = tax.shares()
    L, H = tax.regimes.shape
    dist = ", ".join(f"{r} {100 * tax.distribution[r]:.1f}%" for r in REGIME_COLORS)
    rows = [
        f"<table><caption><b>{html.escape(name)}</b><br>{dist}</caption>",
        "<tr><th></th>" + "".join(f"<th>{h}</th>" for h in range(H)) + "</tr>",
    ]
    for l in range(L):
        cells = []
        for h in range(H):
            rgb = "#" + "".join(f"{int(round(255 * c)):02x}" for c in colors[l, h])
            s = shares[l, h]
            tip = f"layer {l} head {h}: {tax.regimes[l, h]} (sink {s[0]:.2f}, current {s[1]:.2f}, other {s[2]:.2f})"
            cells.append(f"<td style='background:{rgb}' title='{html.escape(tip)}'>{tax.regimes[l, h][0]}</td>")
        rows.append(f"<tr><th>{l}</th>" + "".join(cells) + "</tr>")
    rows.append("</table>")
    return "".join(rows)


def save_regime_grid_html(taxonomies: dict, path: str | Path, **kwargs) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(regime_grid_html(taxonomies, **kwargs), encoding="utf-8")
    return path
