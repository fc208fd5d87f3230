"""geolens.flow.routes (issue #24 item 3): the routes graph against a naive reference over
layer_mixing, the JSON round trip, the self-contained HTML view, one-line errors, and the
induction known answer on SmolLM2 (slow tier)."""

from __future__ import annotations

import json
import re

import pytest
import torch
from conftest import TINY_KINDS, make_tiny

from geolens.flow import flow_names_filter, layer_mixing
from geolens.flow.routes import FlowGraph, flow_routes
from geolens.testing import tiny_tokens
from geolens.viz.flow import flow_routes_html, flow_routes_page


@pytest.fixture(scope="module", params=TINY_KINDS)
def flow_case(request):
    model = make_tiny(request.param, n_layers=3)
    tokens = tiny_tokens(model, length=14)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=flow_names_filter(model))
    return model, tokens, cache


def naive_routes(mixings: list[list[list[float]]], position: int, threshold: float):
    """Nodes and edges by explicit loops: mixings[l − 1][i][j] = M^(l)[i, j] (plain floats)."""
    n_layers = len(mixings)
    reached = {n_layers: [position]}
    edges = []
    for layer in range(n_layers, 0, -1):
        below = []
        for i in reached[layer]:
            for j, share in enumerate(mixings[layer - 1][i]):
                if share > threshold:
                    edges.append((layer, j, i, share))
                    if j not in below:
                        below.append(j)
        reached[layer - 1] = below
    nodes = sorted((l, p) for l, ps in reached.items() for p in ps)
    return nodes, sorted(edges)


@pytest.mark.parametrize("method", ["contribution", "alti", "attention_rollout"])
@pytest.mark.parametrize("threshold", [0.0, 0.05, 0.2])
def test_edges_are_the_thresholded_mixing_on_the_reachable_set(flow_case, method, threshold):
    model, tokens, cache = flow_case
    for batch_index, position in ((0, 13), (1, 7)):
        mixings = [
            layer_mixing(model, cache, l, method)[batch_index].double().tolist() for l in range(model.cfg.n_layers)
        ]
        nodes, edges = naive_routes(mixings, position, threshold)
        graph = flow_routes(model, cache, position, threshold, method=method, batch_index=batch_index, tokens=tokens)
        assert graph.nodes == nodes
        assert [e[:3] for e in graph.edges] == [e[:3] for e in edges]
        assert [e[3] for e in graph.edges] == pytest.approx([e[3] for e in edges], abs=1e-6)
        assert (model.cfg.n_layers, position) in graph.nodes
        assert all(w > threshold for *_, w in graph.edges)
        # every node but the prediction feeds a kept node of the layer above (only reachable nodes)
        feeds = {(l - 1, s) for l, s, _, _ in graph.edges}
        assert set(graph.nodes) - {(model.cfg.n_layers, position)} == feeds
        if threshold == 0.0:  # every source with a positive share is reached: the causal prefix
            assert {p for l, p in graph.nodes if l == 0} <= set(range(position + 1))


def test_value_zeroing_routes_match_its_mixing(flow_case):
    model, tokens, cache = flow_case
    mixings = [
        layer_mixing(model, cache, l, "value_zeroing_rollout", tokens=tokens)[0].double().tolist()
        for l in range(model.cfg.n_layers)
    ]
    nodes, edges = naive_routes(mixings, 13, 0.1)
    graph = flow_routes(model, cache, 13, 0.1, method="value_zeroing_rollout", tokens=tokens)
    assert graph.nodes == nodes and [e[:3] for e in graph.edges] == [e[:3] for e in edges]


def test_graph_tokens_positions_and_sources(flow_case):
    model, tokens, cache = flow_case
    graph = flow_routes(model, cache, -1, 0.05, tokens=tokens)
    assert graph.position == tokens.shape[1] - 1
    assert graph.tokens == [model.tokenizer.decode([t]) for t in tokens[0].tolist()]
    assert flow_routes(model, cache, -1, 0.05).tokens == [str(j) for j in range(tokens.shape[1])]
    top = graph.sources(graph.n_layers, graph.position)
    M = layer_mixing(model, cache, model.cfg.n_layers - 1)[0, graph.position]
    assert [s for s, _ in top] == [j for j in torch.argsort(M, descending=True, stable=True).tolist() if M[j] > 0.05]


def test_json_round_trip(flow_case):
    model, tokens, cache = flow_case
    graph = flow_routes(model, cache, 9, 0.02, method="alti", batch_index=1, tokens=tokens)
    again = FlowGraph.from_json(graph.to_json())
    assert again == graph
    assert FlowGraph.from_dict(json.loads(json.dumps(graph.to_dict()))) == graph
    data = json.loads(graph.to_json())
    assert data["method"] == "alti" and data["batch_index"] == 1 and len(data["edges"]) == len(graph.edges)


def test_html_is_self_contained_with_one_element_per_node(flow_case):
    model, tokens, cache = flow_case
    graph = flow_routes(model, cache, -1, 0.02, tokens=tokens)
    assert len(graph.nodes) > 3
    for page in (
        flow_routes_html(graph),
        flow_routes_page(graph),
        graph._repr_html_(),
        flow_routes_html(graph.to_dict()),
    ):
        assert not re.search(r"https?://", page)
        assert not re.search(r"<(link|img|iframe)\b|\bsrc=|@import", page)
        assert len(re.findall(r'<circle class="gl-flow-node', page)) == len(graph.nodes)
        assert len(re.findall(r'<line class="gl-flow-edge"', page)) == len(graph.edges)
        nodes = set(re.findall(r'data-layer="(\d+)" data-pos="(\d+)"', page))
        assert nodes == {(str(l), str(p)) for l, p in graph.nodes}
    # the hover list: every kept node's sources and shares are in the embedded data
    payload = re.search(
        r'<script type="application/json" class="gl-flow-data">(.*?)</script>', flow_routes_html(graph), re.S
    ).group(1)
    sources = json.loads(payload)["sources"]
    for l, s, t, w in graph.edges:
        assert [s, w] in sources[f"{l},{t}"]


def test_html_escapes_tokens():
    graph = FlowGraph(
        position=1,
        threshold=0.1,
        method="contribution",
        n_layers=1,
        tokens=["<bos>", "</script><b>x"],
        nodes=[(0, 0), (0, 1), (1, 1)],
        edges=[(1, 0, 1, 0.3), (1, 1, 1, 0.7)],
    )
    page = flow_routes_html(graph)
    assert "</script><b>" not in page and "<bos>" not in page
    assert len(re.findall(r'<circle class="gl-flow-node', page)) == 3


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(position=99, threshold=0.1), "position 99"),
        (dict(position=0, threshold=1.0), "threshold"),
        (dict(position=0, threshold=-0.1), "threshold"),
        (dict(position=0, threshold=0.1, method="bogus"), "method"),
        (dict(position=0, threshold=0.1, batch_index=5), "batch_index 5"),
        (dict(position=0, threshold=0.1, method="value_zeroing_rollout"), "tokens="),
    ],
)
def test_bad_arguments_are_one_line(flow_case, kwargs, message):
    model, _, cache = flow_case
    with pytest.raises((ValueError, TypeError)) as err:
        flow_routes(model, cache, **kwargs)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_missing_cache_entry_names_the_filter(flow_case):
    model, tokens, _ = flow_case
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda name: "hook_pattern" in name)
    with pytest.raises(KeyError, match="the cache has no entry"):
        flow_routes(model, cache, -1, 0.1)


# --- known answer: induction on a repeated random sequence (SmolLM2, slow) ----------------------------

# Measured on SmolLM2-135M (seed 0, BOS + 20 random ids in [1000, 10000) repeated; t_k at position
# k, its second occurrence at q = 20 + k, the token that followed the first occurrence at k + 1):
# - the whole-model flow row R^(30)[q] (contribution_flow) does NOT put its largest share outside q
#   on k + 1, for any method: BOS takes 0.24–0.31 (contribution), 0.21–0.32 (alti), ~1.0
#   (attention and Value Zeroing rollout); with BOS and q left out, position 1 leads (0.08–0.16 vs
#   R[q, k+1] = 0.03–0.12, contribution) in 18 of k = 1…19, and with positions 0, 1 and q left out
#   k + 1 ranks first for 3/19 k (contribution), 7/19 (alti), 1/19 (both rollouts);
# - the routes do show it: the edge (k + 1 → q) is kept in the routes of q at threshold 0.05 for
#   18/19 k with contribution and alti, 18/19 with attention rollout (k = 1 misses for all: no
#   repeated bigram yet); in blocks 17 and 18 (graph layers 18, 19) the largest share of row q
#   outside {0, q} is on k + 1 for 18/19 k with contribution, alti and attention rollout.
# The test asserts the routes/layer version for the contribution method and prints the rest.

INDUCTION_K = (3, 8, 13, 17)


@pytest.fixture(scope="module")
def repeated(smollm2):
    g = torch.Generator().manual_seed(0)
    rand = torch.randint(1000, 10000, (20,), generator=g)
    bos = smollm2.to_tokens("", prepend_bos=True)[0, :1]
    tokens = torch.cat([bos, rand, rand])[None]
    with torch.no_grad():
        _, cache = smollm2.run_with_cache(tokens, names_filter=flow_names_filter(smollm2))
    return smollm2, tokens, cache


@pytest.mark.slow
def test_induction_known_answer_contribution(repeated):
    import geolens

    model, tokens, cache = repeated
    with torch.no_grad():
        R = geolens.contribution_flow(model, cache, "contribution")[0]
        M = {l: layer_mixing(model, cache, l, "contribution")[0] for l in (17, 18)}
    for k in INDUCTION_K:
        q = 20 + k
        graph = flow_routes(model, cache, q, 0.05)
        induction = [(l, w) for l, s, t, w in graph.edges if s == k + 1 and t == q]
        row = R[q].clone()
        row[q] = -1
        print(
            f"k={k}: R[q] max outside q at {int(row.argmax())} ({float(row.max()):.3f}), R[q, k+1] = {float(R[q, k + 1]):.3f}; "
            f"induction edges in the routes (layer, share): {[(l, round(w, 3)) for l, w in induction]}"
        )
        assert induction, f"k={k}: no edge k+1 -> q in the routes of q"
        for l, Ml in M.items():
            others = Ml[q].clone()
            others[[0, q]] = -1
            assert int(others.argmax()) == k + 1, (k, l, int(others.argmax()))
