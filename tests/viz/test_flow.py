"""Flow figures (geolens.viz.flow): the route view labels every token on its axis, within a bounded
width for a long prompt."""

from __future__ import annotations

import html
import re


def _flow_labels(page: str) -> dict[int, str]:
    """Position → class of each token label on the flow view's axis."""
    return {int(p): cls for cls, p in re.findall(r'<text class="(gl-flow-col[^"]*)" data-pos="(\d+)"', page)}


def test_flow_view_labels_every_token_on_its_axis():
    from geolens.flow.routes import FlowGraph
    from geolens.viz.flow import flow_routes_html

    tokens = ["<bos>", "the", " cat", " sat", " on", " the"]
    graph = FlowGraph(
        position=5,
        threshold=0.1,
        method="contribution",
        n_layers=1,
        tokens=tokens,
        nodes=[(0, 0), (0, 5), (1, 5)],  # the routes pass through positions 0 and 5 only
        edges=[(1, 0, 5, 0.4), (1, 5, 5, 0.6)],
    )
    page = flow_routes_html(graph)
    labels = _flow_labels(page)
    assert sorted(labels) == list(range(len(tokens)))  # every token, not only those on a route
    assert {p for p, cls in labels.items() if "gl-flow-idle" not in cls} == {0, 5}
    for token in tokens:
        assert f"{html.escape(token)}</text>" in page


def test_flow_view_of_a_long_prompt_labels_every_token_within_a_bounded_width():
    from geolens.flow.routes import FlowGraph
    from geolens.viz.flow import MAX_WIDTH, MIN_COL_W, PAD_X, flow_routes_html

    n = 60
    graph = FlowGraph(
        position=n - 1,
        threshold=0.1,
        method="contribution",
        n_layers=2,
        tokens=[f"t{j}" for j in range(n)],
        nodes=[(0, 0), (1, n - 1), (2, n - 1)],
        edges=[(1, 0, n - 1, 0.5), (2, n - 1, n - 1, 0.9)],
    )
    page = flow_routes_html(graph)
    assert sorted(_flow_labels(page)) == list(range(n))
    width = int(re.search(r'<svg width="(\d+)"', page).group(1))
    assert width <= max(MAX_WIDTH, PAD_X + MIN_COL_W * n + 20)
