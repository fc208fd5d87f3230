"""Pictures of a :class:`geolens.Attribution`: a bar chart (matplotlib) and coloured tokens (HTML).

:func:`attribution_figure` draws one horizontal bar per source token, every token labelled on the
axis (``"12 ␣Paris"``: position and token), one panel per method side by side sharing that axis,
positive scores blue and negative ones red, each panel titled with the method's label and its x axis
saying what a score is, with its unit (the method registry's, :func:`score_unit`); the figure grows
with the text so that 100 tokens stay readable. :func:`attribution_html` colours each token by its score (blue positive, red negative,
the strength the score's share of the largest magnitude), one line per method, with the exact
score in each token's tooltip: what ``Attribution._repr_html_`` shows in Jupyter.
"""

from __future__ import annotations

import html
import textwrap

import numpy as np

from geolens.viz.common import notebook_figure

POSITIVE, NEGATIVE = "#1f77b4", "#d62728"
_RGB = {POSITIVE: (31, 119, 180), NEGATIVE: (214, 39, 40)}


def shown_token(token: str) -> str:
    """A token as an axis label shows it: a leading space as ␣, newlines and tabs as symbols."""
    t = token.replace("\n", "⏎").replace("\t", "⇥")
    if t.startswith(" "):
        t = "␣" + t[1:]
    return t if t.strip() else repr(token)


def score_unit(method: str) -> str:
    """What a method's score is, with its unit (the registry's :attr:`geolens.methods.Method.unit`),
    as the x axis of its panel says it; ``"score"`` for a method the registry does not know or
    whose unit was not given (a metric registered without ``unit=``).

    >>> score_unit("alti"), score_unit("integrated_gradients")
    ('share of the prediction (unitless, a row sums to 1)', 'contribution to log p(target) (nats)')
    """
    from geolens.methods import get_method

    try:
        return get_method(method).unit or "score"
    except ValueError:
        return "score"


def _rows(att) -> np.ndarray:
    return att.score_rows()[:, : att.position + 1].detach().cpu().double().numpy()


def attribution_figure(att, *, figsize: tuple[float, float] | None = None):
    """The attribution as a matplotlib Figure (module docstring)."""
    rows = _rows(att)
    n_methods, n = rows.shape
    labels = [f"{j} {shown_token(att.tokens[j])}" for j in range(n)]
    if figsize is None:
        figsize = (min(3.2 + 2.8 * n_methods, 16.0), 1.4 + 0.19 * n)
    fig = notebook_figure(figsize=figsize, layout="constrained")
    axes = fig.subplots(1, n_methods, sharey=True, squeeze=False)[0]
    y = np.arange(n)
    fontsize = 9 if n <= 40 else 8
    for ax, values, label, name in zip(axes, rows, att.labels, att.methods):
        colours = [POSITIVE if v >= 0 else NEGATIVE for v in values]
        ax.barh(y, values, color=colours, height=0.8)
        ax.axvline(0, color="#444444", linewidth=0.6)
        ax.set_title(label, fontsize=10)
        ax.set_xlabel(textwrap.fill(score_unit(name), 30), fontsize=8)
        ax.grid(axis="x", alpha=0.3)
        ax.tick_params(axis="x", labelsize=8)
    axes[0].set_yticks(y, labels, fontsize=fontsize)
    axes[0].set_ylim(n - 0.5, -0.5)  # first token at the top, as the text reads
    axes[0].set_ylabel("source token (position, token)")
    fig.suptitle(att.where, fontsize=10)
    return fig


def _background(value: float, scale: float) -> str:
    if scale <= 0 or not np.isfinite(value):
        return "transparent"
    r, g, b = _RGB[POSITIVE if value >= 0 else NEGATIVE]
    return f"rgba({r},{g},{b},{min(abs(value) / scale, 1.0) * 0.85:.3f})"


def attribution_html(att) -> str:
    """The attribution as an HTML fragment: tokens coloured by score, one line per method."""
    rows = _rows(att)
    out = [
        '<div class="geolens-attribution" style="font-family:sans-serif;line-height:1.9">',
        f"<div style='margin-bottom:4px'><b>{html.escape(att.where)}</b></div>",
    ]
    if att.truncated_from is not None:
        out.append(f"<div style='color:#a00'>text cut from {att.truncated_from} tokens to the model's context</div>")
    for values, name, label in zip(rows, att.methods, att.labels):
        scale = float(np.nanmax(np.abs(values))) if values.size else 0.0
        spans = []
        for j, v in enumerate(values):
            tip = f"{j} {att.tokens[j]!r}: {v:+.6g}"
            style = f"background:{_background(float(v), scale)};padding:1px 2px;border-radius:3px;white-space:pre"
            if j == att.position:
                style += ";outline:2px solid #444"
            spans.append(f'<span title="{html.escape(tip)}" style="{style}">{html.escape(att.tokens[j])}</span>')
        out.append(
            f"<div data-method='{html.escape(name)}'><span style='display:inline-block;min-width:11em;"
            f"color:#444;font-size:90%'>{html.escape(label)}</span>{''.join(spans)}</div>"
        )
    out.append(
        "<div style='color:#666;font-size:85%'>blue: positive, red: negative; strength: share of the largest "
        "magnitude in the row; hover a token for its score; outlined: the query position</div></div>"
    )
    return "\n".join(out)
