"""geolens.flow.baselines: the prefix-mean baseline x′, gradient × input from a baseline and the
adaptive integrated gradients of the flow erasure protocol 2 (docs/flow/v2/PROTOCOL.md), against
float64 step-by-step references."""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny

from geolens.adapter import adapter_for
from geolens.flow import erase, input_embeddings, integrated_gradients, space_token
from geolens.flow.baselines import gradient_x_input, integration_path, prefix_mean_baseline, relative_gap

TEXT = "the river rose overnight and the bridge was closed to traffic until noon."


@pytest.fixture(scope="module")
def m64():
    m = make_tiny("gqa")
    m.to(torch.float64)
    return m


def tokens_of(model, n: int = 12) -> torch.Tensor:
    ids = model.tokenizer(TEXT, add_special_tokens=False)["input_ids"][: n - 1]
    return torch.tensor([model.tokenizer.bos_token_id] + ids)


def riemann(model, x, xb, target: int, steps: int) -> torch.Tensor:
    """(x − x′) · the midpoint mean gradient, one autograd call per step, float64."""
    adapter = adapter_for(model)
    total = torch.zeros_like(x)
    for s in range(steps):
        point = (xb + (s + 0.5) / steps * (x - xb)).clone().requires_grad_(True)
        with torch.enable_grad():
            f = torch.log_softmax(adapter.forward_from_layer(point[None], 0)[0, -1], -1)[target]
            (grad,) = torch.autograd.grad(f, point)
        total += grad
    return ((x - xb) * total).sum(-1) / steps


def test_integration_path_is_f_along_the_path_point_by_point(m64):
    """f(α) against one full forward per point of the model's own run on x′ + α (x − x′) (no
    slicing of the unembedding), float64; its ends are integrated gradients' f(x′) and f(x), and
    the midpoint sum of its slope on a fine grid integrates to its net change."""
    t = tokens_of(m64, 9)
    position = 7
    x = input_embeddings(m64, t[: position + 1])
    xb = prefix_mean_baseline(x, range(1, position))
    path = integration_path(m64, t, position, baseline_embeddings=xb, alphas=[0.0, 0.25, 0.6, 1.0], batch_size=3)
    adapter = adapter_for(m64)
    for alpha, got in zip(path.alphas.tolist(), path.f.tolist()):
        with torch.no_grad():
            logits = adapter.forward_from_layer((xb + alpha * (x - xb))[None], 0)[0, -1]
        assert got == pytest.approx(float(torch.log_softmax(logits, -1)[path.target]), abs=1e-12)
    ig = integrated_gradients(m64, t, None, position, n_steps=4, baseline_embeddings=xb)
    assert path.target == ig.target
    assert path.f[0].item() == pytest.approx(ig.f_baseline, abs=1e-12)
    assert path.f[-1].item() == pytest.approx(ig.f_input, abs=1e-12)
    assert path.net == pytest.approx(ig.f_input - ig.f_baseline, abs=1e-12)
    fine = integration_path(m64, t, position, baseline_embeddings=xb, alphas=65)
    d = fine.f.diff()
    assert fine.total_variation == pytest.approx(float(d.abs().sum())) and fine.total_variation >= abs(fine.net) - 1e-12
    k = int(d.abs().argmax())
    assert fine.steepest == (fine.alphas[k].item(), d[k].item())
    for bad, message in [(1, "at least 2"), ([0.5, 0.2], "increasing"), ([0.0, 1.5], "increasing")]:
        with pytest.raises(ValueError, match=message):
            integration_path(m64, t, position, baseline_embeddings=xb, alphas=bad)
    with pytest.raises(ValueError, match="baseline_embeddings"):
        integration_path(m64, t, position, baseline_embeddings=xb[:-1])


def test_prefix_mean_baseline_by_hand_and_bad_positions():
    x = torch.arange(12.0).reshape(4, 3)
    got = prefix_mean_baseline(x, [1, 2])
    assert got[0].tolist() == x[0].tolist() and got[3].tolist() == x[3].tolist()
    assert got[1].tolist() == got[2].tolist() == [(3 + 6) / 2, (4 + 7) / 2, (5 + 8) / 2]
    assert x[1].tolist() == [3.0, 4.0, 5.0]  # the input is not changed
    with pytest.raises(ValueError, match="erasable"):
        prefix_mean_baseline(x, [])
    with pytest.raises(ValueError, match="erasable"):
        prefix_mean_baseline(x, [4])


def test_embedding_baseline_equals_the_token_baseline_it_embeds(m64):
    t = tokens_of(m64, 9)
    position = 7
    baseline = erase(t, (torch.arange(9) > 0) & (torch.arange(9) < position), space_token(m64))
    by_tokens = integrated_gradients(m64, t, baseline, position, n_steps=6)
    xb = input_embeddings(m64, baseline[: position + 1])
    by_embeddings = integrated_gradients(m64, t, None, position, n_steps=6, baseline_embeddings=xb)
    assert torch.equal(by_tokens.attributions, by_embeddings.attributions)
    assert by_tokens.f_baseline == by_embeddings.f_baseline
    with pytest.raises(ValueError, match="exactly one"):
        integrated_gradients(m64, t, baseline, position, baseline_embeddings=xb)
    with pytest.raises(ValueError, match="baseline_embeddings"):
        integrated_gradients(m64, t, None, position, baseline_embeddings=xb[:-1])


def test_adaptive_steps_triple_until_the_gap_is_within_tolerance(m64):
    """The nested midpoint sums (S, 3S, 9S) equal a direct Riemann sum at the final step count,
    and the gap ends within the tolerance (or at max_steps)."""
    t = tokens_of(m64, 9)
    position = 7
    x = input_embeddings(m64, t[: position + 1])
    xb = prefix_mean_baseline(x, range(1, position))
    fixed = integrated_gradients(m64, t, None, position, n_steps=2, baseline_embeddings=xb)
    ig = integrated_gradients(m64, t, None, position, n_steps=2, baseline_embeddings=xb, tolerance=1e-4, max_steps=162)
    assert fixed.rel_gap > 1e-4, "the test needs a path that 2 steps do not integrate"
    assert ig.n_steps in (6, 18, 54, 162) and (ig.rel_gap <= 1e-4 or ig.n_steps == 162)
    expected = riemann(m64, x, xb, ig.target, ig.n_steps)
    assert ig.attributions[: position + 1].tolist() == pytest.approx(expected.tolist(), abs=1e-12, rel=1e-9)
    span = ig.f_input - ig.f_baseline
    assert ig.rel_gap == pytest.approx(abs(float(ig.attributions.sum()) - span) / max(abs(span), 0.01))
    with pytest.raises(ValueError, match="tolerance"):
        integrated_gradients(m64, t, None, position, baseline_embeddings=xb, tolerance=0)


def test_local_grid_is_a_midpoint_sum_on_the_grid_it_reports(m64):
    """grid="local": Σ_k (b_k − a_k) (x − x′)·∇f(c_k) over the intervals of ``edges``, one autograd
    call per midpoint in float64; every interior edge's f was evaluated once; the gap ends within
    the tolerance (or the budget is spent); and the attributions agree with a fine even grid."""
    t = tokens_of(m64, 9)
    position = 7
    x = input_embeddings(m64, t[: position + 1])
    xb = prefix_mean_baseline(x, range(1, position))
    kw = dict(baseline_embeddings=xb, n_steps=2, batch_size=4)
    assert integrated_gradients(m64, t, None, position, **kw).rel_gap > 1e-5, "2 steps must not suffice"
    ig = integrated_gradients(m64, t, None, position, **kw, tolerance=1e-5, max_steps=300, grid="local")
    within = ig.rel_gap <= 1e-5  # or the budget ran out (the tiny HookedTransformer of .venvs/tl2)
    edges = ig.edges
    assert edges[0].item() == 0.0 and edges[-1].item() == pytest.approx(1.0, abs=1e-15)
    assert bool((edges.diff() > 0).all()) and len(edges) == ig.n_steps + 1 and ig.n_forward == ig.n_steps - 1
    assert (within or ig.n_steps + 2 > 300) and 2 < ig.n_steps <= 300
    assert len(set(edges.diff().round(decimals=12).tolist())) > 1, "the grid must be uneven"
    adapter = adapter_for(m64)
    expected = torch.zeros(position + 1, dtype=torch.float64)
    for a, b in zip(edges[:-1].tolist(), edges[1:].tolist()):
        point = (xb + (a + b) / 2 * (x - xb)).clone().requires_grad_(True)
        with torch.enable_grad():
            f = torch.log_softmax(adapter.forward_from_layer(point[None], 0)[0, -1], -1)[ig.target]
            (grad,) = torch.autograd.grad(f, point)
        expected += (b - a) * ((x - xb) * grad).sum(-1)
    assert ig.attributions[: position + 1].tolist() == pytest.approx(expected.tolist(), abs=1e-10, rel=1e-9)
    fine = riemann(m64, x, xb, ig.target, 729)
    span = abs(ig.f_input - ig.f_baseline)
    assert float((ig.attributions[: position + 1] - fine).abs().max()) <= 1e-3 * max(span, 0.01)
    loose = integrated_gradients(m64, t, None, position, **kw, tolerance=10.0, grid="local")
    even = integrated_gradients(m64, t, None, position, **kw)
    assert loose.n_steps == 2 and loose.n_forward == 0 and loose.edges.tolist() == even.edges.tolist()
    assert loose.attributions.tolist() == pytest.approx(even.attributions.tolist(), abs=1e-13)
    with pytest.raises(ValueError, match="grid must be"):
        integrated_gradients(m64, t, None, position, **kw, tolerance=0.01, grid="fine")
    with pytest.raises(ValueError, match="give tolerance"):
        integrated_gradients(m64, t, None, position, **kw, grid="local")


def test_gauss_legendre_is_the_quadrature_written_out(m64):
    """grid="gauss_legendre": Σ_k (w_k/2) (x − x′)·∇f((1 + t_k)/2) over numpy's Legendre nodes, one
    autograd call per node in float64; much closer to a fine midpoint sum than as many midpoints;
    with a tolerance the count doubles and n_steps counts every gradient spent."""
    import numpy as np

    t = tokens_of(m64, 9)
    position = 7
    x = input_embeddings(m64, t[: position + 1])
    xb = prefix_mean_baseline(x, range(1, position))
    ig = integrated_gradients(
        m64, t, None, position, baseline_embeddings=xb, n_steps=6, batch_size=4, grid="gauss_legendre"
    )
    adapter = adapter_for(m64)
    nodes, weights = np.polynomial.legendre.leggauss(6)
    expected = torch.zeros(position + 1, dtype=torch.float64)
    for node, w in zip(nodes.tolist(), weights.tolist()):
        point = (xb + (1 + node) / 2 * (x - xb)).clone().requires_grad_(True)
        with torch.enable_grad():
            f = torch.log_softmax(adapter.forward_from_layer(point[None], 0)[0, -1], -1)[ig.target]
            (grad,) = torch.autograd.grad(f, point)
        expected += w / 2 * ((x - xb) * grad).sum(-1)
    assert ig.n_steps == 6 and ig.attributions[: position + 1].tolist() == pytest.approx(
        expected.tolist(), abs=1e-12, rel=1e-9
    )
    fine = riemann(m64, x, xb, ig.target, 729)
    midpoints = integrated_gradients(m64, t, None, position, baseline_embeddings=xb, n_steps=6)
    gl_error = float((ig.attributions[: position + 1] - fine).abs().max())
    assert gl_error < float((midpoints.attributions[: position + 1] - fine).abs().max())
    doubled = integrated_gradients(
        m64, t, None, position, baseline_embeddings=xb, n_steps=2, grid="gauss_legendre", tolerance=1e-9, max_steps=14
    )
    assert doubled.n_steps in (2, 6, 14)  # 2, then 4 more, then 8 more: within max_steps


def test_the_local_rounds_follow_the_protocols_rule_on_a_known_path(monkeypatch):
    """The local rounds on a path known in closed form (f rises by 1 and dips by 4 nats around
    α = 0.07, width 0.004; a_j splits df/dα 30/70), against the rule of docs/flow/v3/PROTOCOL.md §1
    written out in plain Python: same grid to the bit, same counts; at least 4 splits a round, the
    largest errors first (ties by α), stopping within tolerance or at the budget."""
    import math

    from geolens.flow import baselines

    def f(a: float) -> float:
        return a - 4.0 * math.exp(-(((a - 0.07) / 0.004) ** 2))

    def df(a: float) -> float:
        return 1.0 + 8.0 * (a - 0.07) / 0.004**2 * math.exp(-(((a - 0.07) / 0.004) ** 2))

    def shares(model, x, xb, alphas, target, batch_size):
        return torch.tensor([[0.3 * df(a), 0.7 * df(a)] for a in alphas.tolist()], dtype=torch.float64)

    def logprobs(model, x, xb, alphas, target, batch_size):
        return torch.tensor([f(a) for a in alphas.tolist()], dtype=torch.float64)

    monkeypatch.setattr(baselines, "_shares", shares)
    monkeypatch.setattr(baselines, "_path_logprobs", logprobs)

    def by_hand(steps: int, tolerance: float, max_steps: int) -> tuple[list[float], int]:
        edges = torch.linspace(0.0, 1.0, steps + 1, dtype=torch.float64).tolist()  # the even grid's ends
        grid = list(zip(edges[:-1], edges[1:]))

        def gap() -> float:
            total = sum((b - a) * df((a + b) / 2) for a, b in grid)
            return abs(total - (f(1.0) - f(0.0))) / max(abs(f(1.0) - f(0.0)), 0.01)

        n = steps
        while gap() > tolerance and n + 2 <= max_steps:
            errors = [abs(df((a + b) / 2) * (b - a) - (f(b) - f(a))) for a, b in grid]
            order = sorted(range(len(grid)), key=lambda k: (-errors[k], grid[k][0]))
            chosen, acc = 0, 0.0
            for k in order:
                chosen, acc = chosen + 1, acc + errors[k]
                if acc >= 0.5 * sum(errors):
                    break
            chosen = min(max(chosen, 4), len(grid), (max_steps - n) // 2)
            split = set(order[:chosen])
            new = []
            for k, (a, b) in enumerate(grid):
                third = (b - a) / 3
                new += [(a, a + third), (a + third, a + 2 * third), (a + 2 * third, b)] if k in split else [(a, b)]
            grid, n = new, n + 2 * chosen
        return [a for a, _ in grid] + [grid[-1][1]], n

    x, xb = torch.zeros(2, 1), torch.zeros(2, 1)
    ends = torch.tensor([f(1.0), f(0.0)], dtype=torch.float64)
    for steps, tolerance, max_steps in [(32, 0.01, 864), (32, 1e-6, 120), (8, 1e-3, 864), (8, 1e-9, 40), (1, 0.01, 9)]:
        first = shares(None, x, xb, (torch.arange(steps, dtype=torch.float64) + 0.5) / steps, 0, 8)
        ig = baselines._refine_locally(None, x, xb, 0, 2, 2, ends, first, 8, tolerance, max_steps)
        edges, n = by_hand(steps, tolerance, max_steps)
        assert ig.edges.tolist() == edges and ig.n_steps == n == len(edges) - 1, (steps, tolerance)
        assert ig.n_forward == n - 1 and (ig.rel_gap <= tolerance or n + 2 > max_steps)
        assert ig.n_steps <= max_steps
    # a dip that no midpoint of the first grid sees leaves the sum complete: nothing to refine (the
    # rule's limit, as version 2's); one of 8 sees it
    assert ig.n_steps == 1 and by_hand(8, 1e-3, 864)[1] > 8
    first = shares(None, x, xb, (torch.arange(32, dtype=torch.float64) + 0.5) / 32, 0, 8)
    tight = baselines._refine_locally(None, x, xb, 0, 2, 2, ends, first, 8, 1e-6, 120)
    assert tight.rel_gap > 1e-6 and tight.n_steps in (119, 120), "1e-6 is out of reach of 120 gradients"
    widths = tight.edges.diff()
    assert float(widths[(tight.edges[:-1] > 0.06) & (tight.edges[:-1] < 0.08)].max()) < float(widths.max()) / 9


def test_relative_gap_is_one_rule_for_scalars_and_run_columns():
    """The stopping rule, written out: |Σ IG − (f(x) − f(x′))| / max(|f(x) − f(x′)|, 0.01), the
    same on floats and on an erasure run's columns (the summary and scripts/ig_path_check.py)."""
    import pandas as pd

    rows = [(1.75, -1.0, -3.0), (0.005, -2.0, -2.0), (-0.5, -4.0, -3.5), (0.0, -1.0, -1.0 - 1e-3)]
    expected = [abs(s - (a - b)) / max(abs(a - b), 0.01) for s, a, b in rows]
    assert [relative_gap(*r) for r in rows] == pytest.approx(expected, rel=1e-15)
    assert isinstance(relative_gap(*rows[0]), float)
    frame = pd.DataFrame(rows, columns=["ig_sum", "ig_f_input", "ig_f_baseline"])
    column = relative_gap(frame.ig_sum, frame.ig_f_input, frame.ig_f_baseline)
    assert isinstance(column, pd.Series) and column.tolist() == pytest.approx(expected, rel=1e-15)


def test_gradient_x_input_from_a_baseline_is_the_first_order_term(m64):
    """(x − x′)·∇f(x) by hand; with x′ = 0 it is plain gradient × input, exactly."""
    t = tokens_of(m64, 9)
    position = 6
    x = input_embeddings(m64, t[: position + 1])
    xb = prefix_mean_baseline(x, range(1, position))
    got = gradient_x_input(m64, t, position, baseline_embeddings=xb)
    target = integrated_gradients(m64, t, None, position, n_steps=1, baseline_embeddings=xb).target
    point = x.clone().requires_grad_(True)
    with torch.enable_grad():
        f = torch.log_softmax(adapter_for(m64).forward_from_layer(point[None], 0)[0, -1], -1)[target]
        (grad,) = torch.autograd.grad(f, point)
    for j in range(position + 1):
        expected = sum(float(x[j, d] - xb[j, d]) * float(grad[j, d]) for d in range(x.shape[1]))
        assert float(got[j]) == pytest.approx(expected, abs=1e-12, rel=1e-9), j
    assert got[0] == 0 and got[position] == 0  # BOS and the predicting position keep their own x
    plain = gradient_x_input(m64, t, position)
    assert torch.equal(plain, gradient_x_input(m64, t, position, baseline_embeddings=torch.zeros_like(x)))


def test_measure_document_under_version_2_uses_the_prefix_mean_and_adaptive_steps(m64):
    """docs/flow/v2 settings: both gradient methods start from the prefix-mean x′, integrated
    gradients records the steps it took, and the version-1 fields stay out of to_dict's record."""
    from geolens.flow import ErasureSettings, measure_document, ranking

    t = tokens_of(m64, 9)
    v2 = ErasureSettings(
        positions=(6,),
        fractions=(0.2,),
        methods=("random", "grad_x_input", "integrated_gradients"),
        replacements=("space",),
        ig_steps=2,
        ig_baseline="prefix_mean",
        ig_tolerance=1e-3,
        ig_max_steps=18,
    )
    tables = measure_document(m64, t, 0, v2, space_id=space_token(m64))
    x = input_embeddings(m64, t[:7])
    xb = prefix_mean_baseline(x, range(1, 6))
    ig = integrated_gradients(
        m64, t[:7], None, 6, n_steps=2, baseline_embeddings=xb, tolerance=1e-3, max_steps=18, batch_size=8
    )
    gxi = gradient_x_input(m64, t[:7], 6, baseline_embeddings=xb)
    pred = tables["predictions"].iloc[0]
    assert int(pred.ig_steps) == ig.n_steps and float(pred.ig_sum) == pytest.approx(float(ig.attributions.sum()))
    orders = dict(zip(tables["rankings"].method, tables["rankings"].order))
    assert orders["grad_x_input"] == " ".join(map(str, ranking(gxi, list(range(1, 6)), absolute=True)))
    assert orders["integrated_gradients"] == " ".join(
        map(str, ranking(ig.attributions, list(range(1, 6)), absolute=True))
    )
    assert v2.to_dict()["ig_baseline"] == "prefix_mean"
    assert "ig_baseline" not in ErasureSettings().to_dict()
    with pytest.raises(ValueError, match="ig_baseline"):
        ErasureSettings(ig_baseline="zeros")


def test_version_3_puts_integrated_gradients_on_the_local_grid(m64):
    """docs/flow/v3's twin: version 2's settings but ig_grid "local"; measure_document records the
    gradients and forward passes of integrated_gradients(grid="local"), and the summary says so;
    ig_grid stays out of an even-grid run's record (version 2's fingerprints keep their bytes)."""
    import json
    from pathlib import Path

    from geolens.flow import ErasureSettings, erasure_summary, measure_document, ranking

    docs = Path(__file__).resolve().parents[2] / "docs" / "flow"
    v2 = ErasureSettings.from_protocol(json.loads((docs / "v2" / "protocol.json").read_text(encoding="utf-8")))
    v3 = ErasureSettings.from_protocol(json.loads((docs / "v3" / "protocol.json").read_text(encoding="utf-8")))
    assert v2.ig_grid == "even" and "ig_grid" not in v2.to_dict()
    assert v3.ig_grid == "local" and v3.to_dict()["ig_grid"] == "local"
    assert v3 == ErasureSettings(**{**v2.to_dict(), "ig_grid": "local"})
    with pytest.raises(ValueError, match="ig_grid"):
        ErasureSettings(ig_grid="fine")
    with pytest.raises(ValueError, match="ig_tolerance"):
        ErasureSettings(ig_grid="local")
    t = tokens_of(m64, 9)
    small = ErasureSettings(
        positions=(6,),
        fractions=(0.2,),
        methods=("random", "integrated_gradients"),
        replacements=("space",),
        ig_steps=2,
        ig_baseline="prefix_mean",
        ig_tolerance=1e-4,
        ig_max_steps=60,
        ig_grid="local",
        n_boot=50,
    )
    tables = measure_document(m64, t, 0, small, space_id=space_token(m64))
    xb = prefix_mean_baseline(input_embeddings(m64, t[:7]), range(1, 6))
    ig = integrated_gradients(
        m64, t[:7], None, 6, n_steps=2, baseline_embeddings=xb, tolerance=1e-4, max_steps=60, grid="local"
    )
    pred = tables["predictions"].iloc[0]
    assert (int(pred.ig_steps), int(pred.ig_forward)) == (ig.n_steps, ig.n_forward) and ig.n_forward > 0
    assert float(pred.ig_sum) == pytest.approx(float(ig.attributions.sum()), abs=1e-12)
    orders = dict(zip(tables["rankings"].method, tables["rankings"].order))
    assert orders["integrated_gradients"] == " ".join(
        map(str, ranking(ig.attributions, list(range(1, 6)), absolute=True))
    )
    completeness = erasure_summary(tables, small)["ig_completeness"]
    assert completeness["grid"] == "local" and "steps_used" not in completeness
    assert completeness["total_gradients"] == ig.n_steps and completeness["total_forward"] == ig.n_forward


@pytest.mark.parametrize("target", [None, 5, [5, 9, 11]])
def test_gradient_x_input_in_one_forward_equals_the_two_pass_reference(target):
    """x read from block 0's input in the same forward that is differentiated gives the numbers of
    x computed first (input_embeddings) and then differentiated from there, to the bit."""
    from geolens.flow import baselines
    from geolens.testing import tiny_tokens
    from tests.conftest import make_tiny

    for kind in ("gqa", "mha"):
        model = make_tiny(kind)
        tokens = tiny_tokens(model, length=12)[0]
        for position in (11, 6):
            got = baselines.gradient_x_input(model, tokens, position, target=target)
            t = target
            if t is None:
                t = int(baselines.last_position_logprobs(model, tokens[None, : position + 1])[0].argmax())
            t = baselines.check_target(t)
            x = baselines.input_embeddings(model, baselines.continued_tokens(tokens, position, t))
            _, grad = baselines._logprob_and_gradient(model, x[None], t)
            expected = torch.zeros(tokens.shape[0], dtype=torch.float64)
            expected[: position + 1] = (x[: position + 1].double() * grad[0, : position + 1].double()).sum(-1)
            assert torch.equal(got, expected), (kind, position, target)
