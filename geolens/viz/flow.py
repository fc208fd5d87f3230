"""Interactive view of information-flow routes (:func:`geolens.flow.routes.flow_routes`).

Arrays in, HTML out: :func:`flow_routes_html` takes a :class:`~geolens.flow.routes.FlowGraph`
(or its ``to_dict()``) and returns one self-contained HTML fragment — inline SVG, CSS and a few
lines of plain JavaScript, nothing fetched — that displays in a notebook
(``IPython.display.HTML(flow_routes_html(graph))``); :func:`flow_routes_page` wraps it in a
standalone page. Layers are rows (the token embeddings at the bottom, the prediction at the top),
every position of the prompt is a column labelled with its token (greyed where no route passes),
each edge is a line whose width is its share. Hovering a node lists its sources and their shares (and highlights those edges); each node
also carries an SVG ``<title>``, so the list shows as a tooltip even where scripts do not run.
"""

from __future__ import annotations

import html
import uuid
from typing import Any

from geolens.viz.common import PlotView, _script_json, new_figure

COL_W, ROW_H, PAD_X, PAD_TOP, LABEL_H, MAX_STROKE = 64, 24, 56, 20, 70, 9.0
MIN_COL_W, MAX_WIDTH = 16, 1200  # long prompts: narrower columns (steeper labels), down to MIN_COL_W


def _as_dict(graph) -> dict[str, Any]:
    data = graph.to_dict() if hasattr(graph, "to_dict") else dict(graph)
    for key in ("nodes", "edges", "tokens", "n_layers", "position"):
        if key not in data:
            raise ValueError(f"flow_routes_html: the graph has no {key!r} (expected a FlowGraph or its to_dict())")
    return data


def _short(token: str, n: int = 9) -> str:
    shown = token.replace("\n", "⏎").replace("\t", "⇥")
    return shown if len(shown) <= n else shown[: n - 1] + "…"


def flow_routes_html(graph) -> str:
    """The routes as one self-contained HTML fragment (module docstring); one ``<circle
    class="gl-flow-node">`` per node, one ``<line class="gl-flow-edge">`` per edge.

    >>> from geolens.flow import flow_names_filter
    >>> from geolens.flow.routes import flow_routes
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")
    >>> tokens = tiny_tokens(model)
    >>> _, cache = model.run_with_cache(tokens, names_filter=flow_names_filter(model))
    >>> graph = flow_routes(model, cache, -1, 0.1, tokens=tokens)
    >>> fragment = flow_routes_html(graph)  # in a notebook: IPython.display.HTML(fragment)
    >>> fragment.count("<circle") == len(graph.nodes), fragment.count('<line class="gl-flow-edge"') == len(graph.edges)
    (True, True)
    """
    g = _as_dict(graph)
    tokens, n_layers = [str(t) for t in g["tokens"]], int(g["n_layers"])
    nodes = [(int(l), int(p)) for l, p in g["nodes"]]
    edges = [(int(e["layer"]), int(e["source"]), int(e["target"]), float(e["share"])) for e in g["edges"]]
    used = {p for _, p in nodes} | {int(g["position"])}
    columns = sorted(set(range(len(tokens))) | used)  # every token is labelled on the axis
    col = {p: i for i, p in enumerate(columns)}
    col_w = max(MIN_COL_W, min(COL_W, (MAX_WIDTH - PAD_X - 20) // max(len(columns), 1)))
    angle = 40 if col_w >= 40 else 65  # narrow columns: steeper labels, so that neighbours do not overlap
    width = PAD_X + col_w * max(len(columns), 1) + 20
    height = PAD_TOP + ROW_H * n_layers + LABEL_H

    def x(p: int) -> float:
        return PAD_X + col_w * col[p] + col_w / 2

    def y(layer: int) -> float:
        return PAD_TOP + ROW_H * (n_layers - layer)

    vid = "gl-flow-" + uuid.uuid4().hex[:12]
    sources: dict[str, list] = {}
    for l, s, t, w in edges:
        sources.setdefault(f"{l},{t}", []).append([s, w])
    for key in sources:
        sources[key].sort(key=lambda sw: (-sw[1], sw[0]))
    parts = []
    for l in range(n_layers + 1):  # row labels and guides
        label = "emb" if l == 0 else f"L{l}"
        parts.append(f'<text class="gl-flow-row" x="{PAD_X - 8}" y="{y(l) + 4:.1f}" text-anchor="end">{label}</text>')
        parts.append(
            f'<line class="gl-flow-guide" x1="{PAD_X}" x2="{width - 20}" y1="{y(l):.1f}" y2="{y(l):.1f}"></line>'
        )
    for p in columns:  # column labels under the embedding row: every token, greyed where no route passes
        token = tokens[p] if p < len(tokens) else str(p)
        tip = html.escape(f"position {p}: {token!r}" + ("" if p in used else " (no route above the threshold)"))
        cls = "gl-flow-col" if p in used else "gl-flow-col gl-flow-idle"
        parts.append(
            f'<text class="{cls}" data-pos="{p}" transform="translate({x(p):.1f},{y(0) + 14:.1f}) rotate({angle})">'
            f"<title>{tip}</title>{html.escape(_short(token))}</text>"
        )
        if col_w >= 24 or p % 5 == 0 or p == int(g["position"]):  # position numbers: every fifth when narrow
            parts.append(f'<text class="gl-flow-pos" x="{x(p):.1f}" y="{height - 4}" text-anchor="middle">{p}</text>')
    for l, s, t, w in edges:
        stroke = 0.6 + MAX_STROKE * w
        parts.append(
            f'<line class="gl-flow-edge" data-layer="{l}" data-source="{s}" data-target="{t}" x1="{x(s):.1f}" y1="{y(l - 1):.1f}" '
            f'x2="{x(t):.1f}" y2="{y(l):.1f}" stroke-width="{stroke:.2f}"><title>{html.escape(f"L{l - 1}:{s} → L{l}:{t}  share {w:.3f}")}</title></line>'
        )
    for l, p in nodes:
        listed = sources.get(f"{l},{p}", [])
        lines = [f"layer {l}, position {p} {tokens[p]!r}"] + [f"  ← {s} {tokens[s]!r}: {w:.3f}" for s, w in listed]
        if l == 0:
            lines.append("  (token embedding)")
        elif not listed:
            lines.append(f"  (no source above {float(g.get('threshold', 0)):g})")
        cls = "gl-flow-node gl-flow-target" if (l == n_layers and p == int(g["position"])) else "gl-flow-node"
        parts.append(
            f'<circle class="{cls}" data-layer="{l}" data-pos="{p}" cx="{x(p):.1f}" cy="{y(l):.1f}" r="5">'
            f"<title>{html.escape(chr(10).join(lines))}</title></circle>"
        )
    title = (
        f"Information-flow routes of position {int(g['position'])} {tokens[int(g['position'])]!r}: method {g.get('method', '')}, "
        f"shares > {float(g.get('threshold', 0)):g}; {len(nodes)} nodes, {len(edges)} edges"
    )
    payload = _script_json({"tokens": tokens, "sources": sources})
    style = f"""
#{vid} {{ font-family: sans-serif; font-size: 12px; }}
#{vid} .gl-flow-edge {{ stroke: #3b6fb6; stroke-opacity: 0.55; stroke-linecap: round; }}
#{vid} .gl-flow-edge.gl-on {{ stroke: #d9480f; stroke-opacity: 0.95; }}
#{vid} .gl-flow-guide {{ stroke: #eee; stroke-width: 1; }}
#{vid} .gl-flow-node {{ fill: #fff; stroke: #1f3f70; stroke-width: 1.5; cursor: pointer; }}
#{vid} .gl-flow-node:hover, #{vid} .gl-flow-node.gl-on {{ fill: #d9480f; }}
#{vid} .gl-flow-target {{ fill: #1f3f70; }}
#{vid} .gl-flow-row, #{vid} .gl-flow-pos {{ fill: #666; font-size: 10px; }}
#{vid} .gl-flow-col {{ fill: #222; font-family: monospace; font-size: 11px; }}
#{vid} .gl-flow-col.gl-flow-idle {{ fill: #aaa; }}
#{vid} .gl-flow-info {{ min-height: 3.5em; white-space: pre; font-family: monospace; background: #f7f7f7; padding: 4px 8px; margin: 4px 0; }}
"""
    script = f"""
(function () {{
  var root = document.getElementById("{vid}");
  if (!root) return;
  var data = JSON.parse(root.querySelector("script.gl-flow-data").textContent);
  var info = root.querySelector(".gl-flow-info");
  var edges = root.querySelectorAll(".gl-flow-edge");
  function show(node) {{
    var l = node.getAttribute("data-layer"), p = node.getAttribute("data-pos");
    var list = data.sources[l + "," + p] || [];
    var text = "layer " + l + ", position " + p + " " + JSON.stringify(data.tokens[+p]);
    if (+l === 0) text += "\\n  token embedding";
    else if (!list.length) text += "\\n  no source above the threshold";
    for (var i = 0; i < list.length; i++) {{
      text += "\\n  \\u2190 position " + list[i][0] + " " + JSON.stringify(data.tokens[list[i][0]]) + ": " + list[i][1].toFixed(3);
    }}
    info.textContent = text;
    for (var k = 0; k < edges.length; k++) {{
      var e = edges[k], on = e.getAttribute("data-layer") === l && e.getAttribute("data-target") === p;
      e.classList.toggle("gl-on", on);
    }}
  }}
  var nodes = root.querySelectorAll(".gl-flow-node");
  for (var i = 0; i < nodes.length; i++) {{
    nodes[i].addEventListener("mouseenter", function () {{ show(this); }});
  }}
}})();
"""
    return (
        f'<div id="{vid}" class="geolens-view gl-flow"><style>{style}</style>'
        f"<div><b>{html.escape(title)}</b></div>"
        f'<div class="gl-flow-info">hover a node: its sources and their shares</div>'
        f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img">{"".join(parts)}</svg>'
        f'<script type="application/json" class="gl-flow-data">{payload}</script>'
        f"<script>{script}</script></div>"
    )


def flow_routes_page(graph, *, title: str = "geolens flow routes") -> str:
    """:func:`flow_routes_html` as a standalone HTML page (nothing fetched)."""
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title></head>\n<body>\n{flow_routes_html(graph)}\n</body></html>\n"
    )


__all__ = ["flow_routes_html", "flow_routes_page"]


def erasure_naopc_plot(naopc, *, labels: dict | None = None, family: str = "primary", subtitle: str = "") -> PlotView:
    """Each method's mean normalised AOPC with its 95% interval, comprehensiveness and sufficiency
    side by side, for one family of the input-token erasure test (``naopc``: the ``naopc`` table of
    :class:`geolens.pipelines.flow.FlowRun`). Returns a :class:`~geolens.viz.common.PlotView`."""
    rows = naopc[naopc["family"] == family]
    if rows.empty:
        raise ValueError(f"erasure_naopc_plot: no rows of family {family!r}")
    labels = labels or {}
    fig = new_figure(figsize=(10, 3.8))
    axes = fig.subplots(1, 2)
    data = {}
    for ax, direction in zip(axes, ("comprehensiveness", "sufficiency")):
        d = rows[rows["direction"] == direction]
        y = list(range(len(d)))
        est, lo, hi = d["naopc"].to_numpy(), d["ci_low"].to_numpy(), d["ci_high"].to_numpy()
        ax.errorbar(est, y, xerr=[est - lo, hi - est], fmt="o", color="#4C72B0", capsize=3)
        ax.set_yticks(y, [labels.get(m, m) for m in d["method"]], fontsize=8)
        ax.invert_yaxis()
        better = "larger" if direction == "comprehensiveness" else "smaller"
        ax.set_xlabel(f"normalised AOPC ({better} = more faithful)")
        ax.set_title(direction)
        ax.grid(alpha=0.3, axis="x")
        data[direction] = {m: [float(a), float(b), float(c)] for m, a, b, c in zip(d["method"], est, lo, hi)}
    replacement, outcome = rows["replacement"].iloc[0], rows["outcome"].iloc[0]
    fig.suptitle(
        f"Input-token erasure, {outcome.upper() if outcome == 'kl' else outcome}, {replacement} replacement"
        + (f"\n{subtitle}" if subtitle else ""),
        fontsize=10,
    )
    fig.tight_layout()
    return PlotView(fig, title="erasure nAOPC", data={"family": family, "naopc": data})
