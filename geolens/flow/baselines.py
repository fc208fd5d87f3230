"""Gradient baselines of input attribution (docs/method.md §10.1): gradient × input and integrated
gradients of f = log p(target) at one position, on the input embeddings x (the residual stream
entering the first block).

- :func:`gradient_x_input`: a_j = Σ_d x_jd ∂f/∂x_jd (Shrikumar et al. 2016);
- :func:`integrated_gradients` (Sundararajan, Taly & Yan 2017): (x − x′) · the mean gradient along
  the straight path from a baseline input x′, midpoint Riemann sum, with its completeness gap;
- :func:`integration_path`: f itself along that path, to see why a Riemann sum needs many steps
  (a path whose total variation is far above |f(x) − f(x′)| goes down and back up steeply).

Both are registered in the one registry of methods (:func:`geolens.list_methods`: ``grad_x_input``,
``integrated_gradients``) and used by the input-token erasure test (:mod:`geolens.flow.erasure`)
and :func:`geolens.attribute`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence, Union

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from geolens import threads
from geolens.adapter import adapter_for
from geolens.interventions.base import applied
from geolens.interventions.masking import last_predictions_hook


def as_row(tokens: Tensor) -> Int[Tensor, "pos"]:
    """One sequence ``[pos]`` from ``[pos]`` or ``[1, pos]``; ValueError otherwise."""
    if tokens.ndim == 2 and tokens.shape[0] == 1:
        tokens = tokens[0]
    if tokens.ndim != 1:
        raise ValueError(f"expected one sequence [pos] or [1, pos], got shape {tuple(tokens.shape)}")
    return tokens


def last_position_logprobs(
    model, rows: Int[Tensor, "row pos"], *, chunk_size: int = 16
) -> Float[Tensor, "row d_vocab"]:
    """log p(next token) at the last position of each row, float64 (only that position is unembedded)."""
    device = next(model.parameters()).device
    n = rows.shape[1]
    out = []
    with torch.no_grad(), applied(model, [last_predictions_hook(model, n + 1, 1)]):
        for start in range(0, rows.shape[0], chunk_size):
            logits = model(rows[start : start + chunk_size].to(device), return_type="logits")
            out.append(torch.log_softmax(logits[:, -1].to(torch.float64), dim=-1).cpu())
    return torch.cat(out)


def input_embeddings(model, tokens: Int[Tensor, "pos"]) -> Float[Tensor, "pos d_model"]:
    """x: the residual stream entering the first block at each position (the token embedding as
    the model scales it, plus any absolute position embedding)."""
    tokens = as_row(tokens)
    hook = adapter_for(model).resid_pre_hook(0)
    device = next(model.parameters()).device
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens[None].to(device), names_filter=lambda name: name == hook)
    return cache[hook][0].detach()


Target = Union[int, Tensor]
"""A target of the gradient methods: one token id, or a continuation ``[k]`` of k ≥ 2 token ids
(:func:`check_target`)."""


def check_target(target, d_vocab: int | None = None) -> Target:
    """One token id (an int) or a continuation of k ≥ 2 ids (a 1-D int64 tensor), range-checked.

    A continuation t_1 … t_k is explained as f = Σ_m log p(t_m | the text, t_<m): the gradient
    methods run on the text followed by t_1 … t_{k−1} and sum the log-probabilities of the last k
    positions (:func:`gradient_x_input`, :func:`integrated_gradients`).

    >>> check_target(7), check_target([3]), check_target([3, 4]).tolist()
    (7, 3, [3, 4])
    """
    if isinstance(target, bool):
        raise TypeError(f"target must be a token id or a list of token ids, got {target!r}")
    if isinstance(target, (int, np.integer)):
        ids = torch.tensor([int(target)])
    else:
        try:
            ids = torch.as_tensor(target)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"target must be a token id or a list of token ids, got {target!r}") from None
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise TypeError(f"target token ids must be integers, got {ids.dtype}")
        ids = ids.reshape(-1).long()
    if ids.numel() == 0:
        raise ValueError("target is empty: give a token id or a non-empty list of them")
    if d_vocab is not None:
        bad = [int(t) for t in ids if not 0 <= int(t) < int(d_vocab)]
        if bad:
            raise IndexError(f"target token ids {bad[:4]} are out of range for a vocabulary of {int(d_vocab)}")
    return int(ids[0]) if ids.numel() == 1 else ids


def continued_tokens(tokens: Tensor, position: int, target: Target) -> Tensor:
    """The tokens 0 … ``position``, followed by the continuation's first k − 1 tokens."""
    prompt = tokens[: position + 1]
    if isinstance(target, int):
        return prompt
    return torch.cat([prompt, target[:-1].to(prompt.device, prompt.dtype)])


def _logprobs(model, points: Float[Tensor, "row pos d_model"], target: Target) -> Float[Tensor, "row"]:
    """f = log p(target) at the last position for each row of ``points`` (a continuation of k
    tokens: Σ of the last k positions' log p of its tokens), the model run from the rows entering
    block 0 (:meth:`~geolens.adapter.ModelAdapter.forward_from_layer`); float64, in the caller's
    grad mode."""
    adapter = adapter_for(model)
    with applied(model, [last_predictions_hook(model, points.shape[1] + 1, _n_targets(target))]):
        logits = adapter.forward_from_layer(points, 0)
    return target_logprob(logits, target)


def _n_targets(target: Target) -> int:
    return 1 if isinstance(target, int) else int(target.numel())


def target_logprob(logits: Float[Tensor, "row scored d_vocab"], target: Target) -> Float[Tensor, "row"]:
    """f = log p(target) of each row from the logits of its last k positions (k = the target's
    tokens: Σ_m log p(t_m | …, t_<m) for a continuation), float64; with
    :func:`continued_tokens`, what :func:`geolens.attribute` reports as ``target_logprob``."""
    k = _n_targets(target)
    if k == 1:
        return torch.log_softmax(logits[:, -1].to(torch.float64), dim=-1)[:, int(target)]
    logp = torch.log_softmax(logits[:, -k:].to(torch.float64), dim=-1)  # [row, k, vocab]
    return logp.gather(-1, target.to(logp.device)[None, :, None].expand(logp.shape[0], k, 1)).sum((1, 2))


def _input_and_gradient(model, tokens: Int[Tensor, "pos"], target: Target) -> tuple[Tensor, Tensor]:
    """x (the residual entering block 0, ``[pos, d_model]``) and ∂f/∂x from one forward and one
    backward of the tokens: a hook at block 0's input makes x the leaf that f is differentiated
    against, so x needs no forward of its own (:func:`input_embeddings` followed by a forward from
    x gives the same numbers to the bit, one forward more)."""
    hook = adapter_for(model).resid_pre_hook(0)
    seen: dict[str, Tensor] = {}

    def leaf(x: Tensor, hook=None) -> Tensor:
        seen["x"] = x.detach().requires_grad_(True)
        return seen["x"]

    device = next(model.parameters()).device
    scored = last_predictions_hook(model, tokens.shape[0] + 1, _n_targets(target))
    with torch.enable_grad(), applied(model, [(hook, leaf), scored]):
        logits = model(tokens[None].to(device), return_type="logits")
        (grad,) = torch.autograd.grad(target_logprob(logits, target).sum(), seen["x"])
    return seen["x"].detach()[0], grad[0].detach()


def _logprob_and_gradient(model, x: Float[Tensor, "row pos d_model"], target: int) -> tuple[Tensor, Tensor]:
    """(f, ∂f/∂x) for each row, f of :func:`_logprobs`."""
    x = x.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        f = _logprobs(model, x, target)
        (grad,) = torch.autograd.grad(f.sum(), x)
    return f.detach(), grad.detach()


def check_position(position, n: int) -> int:
    """``position`` of a sequence of ``n`` tokens as an index in [0, n) (negative counts from the
    end); a one-line TypeError for a non-integer, IndexError out of range (the error vocabulary of
    :func:`geolens.validation.check_layer`).

    >>> check_position(-1, 8)
    7
    """
    if isinstance(position, bool) or not isinstance(position, (int, np.integer)):
        raise TypeError(f"position must be an integer token index, got {position!r}")
    if not -n <= int(position) < n:
        raise IndexError(
            f"position={int(position)} is out of range: the text has {n} tokens (0…{n - 1}, or -{n}…-1 from the end)"
        )
    return int(position) % n


def prefix_mean_baseline(x: Float[Tensor, "pos d_model"], erasable: Sequence[int]) -> Float[Tensor, "pos d_model"]:
    """x′ of the flow erasure test's protocol 2 (docs/flow/v2/PROTOCOL.md): every erasable
    position's input embedding replaced by the mean input embedding of the erasable positions,
    the others (BOS, the predicting position) kept. It inserts no token, so it differs from every
    erasure replacement.

    >>> import torch
    >>> x = torch.tensor([[1.0, 0.0], [2.0, 4.0], [4.0, 0.0], [9.0, 9.0]])
    >>> prefix_mean_baseline(x, [1, 2]).tolist()
    [[1.0, 0.0], [3.0, 2.0], [3.0, 2.0], [9.0, 9.0]]
    """
    idx = torch.as_tensor(list(erasable), dtype=torch.long)
    if idx.numel() == 0 or int(idx.min()) < 0 or int(idx.max()) >= x.shape[0]:
        raise ValueError(f"erasable positions must be a non-empty subset of 0..{x.shape[0] - 1}, got {list(erasable)}")
    out = x.clone()
    out[idx] = x[idx].mean(0, keepdim=True)
    return out


def gradient_x_input(
    model,
    tokens: Int[Tensor, "pos"],
    position: int = -1,
    *,
    target: int | None = None,
    baseline_embeddings: Float[Tensor, "pos d_model"] | None = None,
) -> Float[Tensor, "pos"]:
    """Gradient × input of f = log p(target) at ``position`` (default target: the clean top-1):
    a_j = Σ_d x_jd ∂f/∂x_jd for j ≤ position, x the input embeddings (:func:`input_embeddings`);
    0 after ``position``. Float64. With ``baseline_embeddings`` x′ (rows 0..position):
    a_j = Σ_d (x_jd − x′_jd) ∂f/∂x_jd, the first-order term of integrated gradients from x′.

    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")
    >>> tuple(gradient_x_input(model, tiny_tokens(model, length=8)[0], 5).shape)
    (8,)
    """
    tokens = as_row(tokens)
    position = check_position(position, tokens.shape[-1])
    if target is None:
        target = int(last_position_logprobs(model, tokens[None, : position + 1])[0].argmax())
    target = check_target(target, adapter_for(model).cfg.d_vocab)
    x, grad = _input_and_gradient(model, continued_tokens(tokens, position, target), target)
    x, grad = x[: position + 1], grad[: position + 1]  # a continuation's own tokens are not scored
    delta = x if baseline_embeddings is None else x - _check_embeddings(baseline_embeddings, x)
    out = torch.zeros(tokens.shape[0], dtype=torch.float64)
    out[: position + 1] = (delta.to(torch.float64) * grad.to(torch.float64)).sum(-1).cpu()
    return out


def _target_value(target: Target) -> int | tuple[int, ...]:
    return int(target) if isinstance(target, int) else tuple(int(t) for t in target)


def _check_embeddings(xb: Tensor, x: Tensor) -> Tensor:
    if tuple(xb.shape) != tuple(x.shape):
        raise ValueError(f"baseline_embeddings must be [pos={x.shape[0]}, d_model={x.shape[1]}], got {tuple(xb.shape)}")
    return xb.to(x)


REL_GAP_FLOOR = 0.01  # nats: the least |f(x) − f(x′)| the relative completeness gap divides by


def relative_gap(ig_sum, f_input, f_baseline):
    """Integrated gradients' stopping rule (docs/flow/v2/PROTOCOL.md): |Σ_j IG_j − (f(x) − f(x′))|
    divided by max(|f(x) − f(x′)|, 0.01 nats), so that a flat path does not inflate it.

    Elementwise on floats, NumPy arrays and pandas columns (an erasure run's
    ``ig_sum``, ``ig_f_input``, ``ig_f_baseline``); the one definition the adaptive step rule,
    :func:`geolens.flow.erasure_summary` and ``scripts/ig_path_check.py`` use.

    >>> relative_gap(1.75, -1.0, -3.0)  # gap 0.25 over a path that climbs 2 nats
    0.125
    >>> relative_gap(0.005, -2.0, -2.0)  # flat path: divided by the 0.01 floor
    0.5
    """
    delta = f_input - f_baseline
    out = abs(ig_sum - delta) / np.maximum(abs(delta), REL_GAP_FLOOR)
    return float(out) if np.ndim(out) == 0 else out


@dataclass
class IntegratedGradients:
    """:func:`integrated_gradients`' result: per-position attributions and the two ends of the path."""

    attributions: Float[Tensor, "pos"]  # IG_j, float64, 0 after the position
    f_input: float  # f(x)
    f_baseline: float  # f(x′)
    n_steps: int  # gradient evaluations (the midpoints of the grid)
    target: int | tuple[int, ...]  # a token id, or a continuation's ids
    n_forward: int = 0  # forward-only evaluations of f at interval ends (grid="local")
    edges: Float[Tensor, "edge"] | None = None  # the grid's interval ends in α, float64, 0 … 1

    @property
    def completeness_gap(self) -> float:
        """Σ_j IG_j − (f(x) − f(x′)): 0 up to the Riemann sum's discretisation error."""
        return float(self.attributions.sum()) - (self.f_input - self.f_baseline)

    @property
    def rel_gap(self) -> float:
        """|completeness gap| / max(|f(x) − f(x′)|, 0.01): the gap relative to what the path
        integrates (:func:`relative_gap`)."""
        return relative_gap(float(self.attributions.sum()), self.f_input, self.f_baseline)


def integrated_gradients(
    model,
    tokens: Int[Tensor, "pos"],
    baseline: Int[Tensor, "pos"],
    position: int = -1,
    *,
    target: int | None = None,
    n_steps: int = 32,
    batch_size: int = 8,
    baseline_embeddings: Float[Tensor, "pos d_model"] | None = None,
    tolerance: float | None = None,
    max_steps: int = 864,
    grid: Literal["even", "local", "gauss_legendre"] = "even",
) -> IntegratedGradients:
    """Integrated gradients (Sundararajan, Taly & Yan 2017) of f = log p(target) at ``position``
    on the input embeddings, from the input of the ``baseline`` tokens (same length) to that of
    ``tokens``, along the straight path, by the midpoint rule:

        IG_j = Σ_d (x_jd − x′_jd) · (1/S) Σ_{s=1..S} ∂f/∂x_jd (x′ + α_s (x − x′)),   α_s = (s − ½)/S.

    Σ_j IG_j = f(x) − f(x′) up to the discretisation error (:attr:`IntegratedGradients.completeness_gap`).
    ``batch_size`` interpolation steps go through one forward and backward.

    ``baseline_embeddings`` gives x′ itself (rows 0..position, e.g. :func:`prefix_mean_baseline`)
    instead of ``baseline`` tokens (pass ``baseline=None``). With ``tolerance``, the number of
    steps triples (S, 3S, 9S, …, at most ``max_steps``; the midpoints of S are among those of 3S,
    so each round only adds the new ones) until :attr:`IntegratedGradients.rel_gap` ≤ ``tolerance``;
    ``n_steps`` of the result is the number used.

    ``grid="local"`` (with ``tolerance``) refines where the path needs it instead: after the first
    S midpoints, f is evaluated at the S − 1 interval ends (forward passes only), and each round
    splits in three the intervals [a, b] whose local completeness error |f′(c)(b − a) − (f(b) −
    f(a))| is largest (c the midpoint, f′(c) = Σ_j a_j(c) the gradient's share of the path's
    direction), until the global gap is within ``tolerance`` or ``max_steps`` gradients are spent.
    Each split keeps the old midpoint (it is the middle third's) and adds two gradients and two
    forward passes, so a narrow dip of f costs steps only where it is. The sum is still a midpoint
    Riemann sum, IG_j = Σ_k (b_k − a_k) a_j(c_k), on an uneven grid (docs/method.md §10.1).

    ``grid="gauss_legendre"`` takes the ``n_steps`` Gauss–Legendre nodes α_k = (1 + t_k)/2 with
    weights w_k/2 (the quadrature captum and inseq use), IG_j = Σ_k (w_k/2) a_j(α_k): exact for a
    path whose f is a polynomial of degree < 2 n_steps. With ``tolerance``, the count doubles (its
    nodes are not nested: each round computes all of them again) until the gap is within it or
    ``max_steps`` gradients would be passed; ``n_steps`` of the result is the gradients spent.

    >>> from geolens.flow.erasure import erase
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")
    >>> t = tiny_tokens(model, length=8)[0]
    >>> ig = integrated_gradients(model, t, erase(t, torch.arange(8) > 0, 5), 6, n_steps=64)
    >>> abs(ig.completeness_gap) < 1e-2 * max(1.0, abs(ig.f_input - ig.f_baseline))
    True
    """
    tokens = as_row(tokens)
    if (baseline is None) == (baseline_embeddings is None):
        raise ValueError("give exactly one of baseline (tokens) and baseline_embeddings")
    if int(n_steps) < 1 or int(batch_size) < 1:
        raise ValueError(f"n_steps and batch_size must be positive integers, got {n_steps!r} and {batch_size!r}")
    if tolerance is not None and not float(tolerance) > 0:
        raise ValueError(f"tolerance must be positive, got {tolerance!r}")
    if grid not in ("even", "local", "gauss_legendre"):
        raise ValueError(f"grid must be 'even', 'local' or 'gauss_legendre', got {grid!r}")
    if grid == "local" and tolerance is None:
        raise ValueError("grid='local' refines until a tolerance: give tolerance")
    position = check_position(position, tokens.shape[-1])
    if target is None:
        target = int(last_position_logprobs(model, tokens[None, : position + 1])[0].argmax())
    target = check_target(target, adapter_for(model).cfg.d_vocab)
    x = input_embeddings(model, continued_tokens(tokens, position, target))
    if baseline is not None:
        baseline = as_row(baseline)
        if baseline.shape != tokens.shape:
            raise ValueError(f"baseline has shape {tuple(baseline.shape)}, the tokens {tuple(tokens.shape)}")
        xb = input_embeddings(model, baseline[: position + 1])
    else:
        xb = _check_embeddings(baseline_embeddings, x[: position + 1])
    xb = torch.cat([xb, x[position + 1 :]])  # a continuation stays as it is along the path
    with threads.for_rows(int(batch_size) * x.shape[0]):  # large batches take every core (geolens.threads)
        diff = x - xb
        with torch.no_grad():  # f(x), f(x′): forward only
            ends = _logprobs(model, torch.stack([x, xb]), target).cpu()
        total = torch.zeros(x.shape, dtype=torch.float64)

        shares = []  # grid="local": a_j at each midpoint, [point, pos] per batch (the local rounds reuse them)

        def add(alphas: Tensor) -> None:
            for points in _path_points(x, xb, alphas, batch_size):
                _, grad = _logprob_and_gradient(model, points, target)
                total.add_(grad.to(torch.float64).sum(0).cpu())
                if grid == "local":
                    shares.append(_share_rows(grad, x, xb))

        def result(steps: int) -> IntegratedGradients:
            out = torch.zeros(tokens.shape[0], dtype=torch.float64)
            out[: position + 1] = (diff.to(torch.float64).cpu() * total / steps).sum(-1)[: position + 1]
            edges = torch.linspace(0.0, 1.0, steps + 1, dtype=torch.float64)
            return IntegratedGradients(out, float(ends[0]), float(ends[1]), steps, _target_value(target), edges=edges)

        steps = int(n_steps)
        if grid == "gauss_legendre":
            return _gauss_legendre(
                model, x, xb, target, tokens.shape[0], position + 1, ends, steps, batch_size, tolerance, max_steps
            )
        add((torch.arange(steps, dtype=torch.float64) + 0.5) / steps)
        ig = result(steps)
        if grid == "local":
            if ig.rel_gap <= float(tolerance) or steps + 2 > int(max_steps):
                return ig
            first = torch.cat(shares)
            return _refine_locally(
                model, x, xb, target, tokens.shape[0], position + 1, ends, first, batch_size, tolerance, max_steps
            )
        while tolerance is not None and ig.rel_gap > float(tolerance) and 3 * steps <= int(max_steps):
            s = torch.arange(3 * steps, dtype=torch.float64)
            new = s[(s % 3) != 1]  # (s + ½)/(3S) with s ≡ 1 (mod 3) are the midpoints of S
            steps *= 3
            add((new + 0.5) / steps)
            ig = result(steps)
        return ig


def _gauss_legendre(
    model, x, xb, target, length, n_scored, ends, steps, batch_size, tolerance, max_steps
) -> IntegratedGradients:
    """:func:`integrated_gradients` with ``grid="gauss_legendre"``: ``steps`` nodes, doubled while the
    gap exceeds ``tolerance`` and the gradients spent stay within ``max_steps``."""
    spent = 0
    while True:
        t, w = np.polynomial.legendre.leggauss(steps)
        alphas, weights = torch.from_numpy((t + 1.0) / 2.0), torch.from_numpy(w / 2.0)
        shares = _shares(model, x, xb, alphas, target, batch_size)  # [node, pos] a_j(α_k), float64
        spent += steps
        out = torch.zeros(length, dtype=torch.float64)
        out[:n_scored] = (weights[:, None] * shares).sum(0)[:n_scored]
        ig = IntegratedGradients(out, float(ends[0]), float(ends[1]), spent, _target_value(target))
        if tolerance is None or ig.rel_gap <= float(tolerance) or spent + 2 * steps > int(max_steps):
            return ig
        steps *= 2


def _path_points(x: Tensor, xb: Tensor, alphas: Tensor, batch_size: int):
    """The inputs x′ + α (x − x′) [batch, pos, d_model], ``batch_size`` values of ``alphas`` at a time."""
    diff = x - xb
    for start in range(0, len(alphas), int(batch_size)):
        a = alphas[start : start + int(batch_size)].to(x.dtype).to(x.device)
        yield xb[None] + a[:, None, None] * diff[None]


def _shares(model, x: Tensor, xb: Tensor, alphas: Tensor, target: int, batch_size: int) -> Tensor:
    """a_j(α) = Σ_d (x − x′)_jd ∂f/∂x_jd at x′ + α (x − x′), one row [pos] per α (float64)."""
    rows = [
        _share_rows(_logprob_and_gradient(model, points, target)[1], x, xb)
        for points in _path_points(x, xb, alphas, batch_size)
    ]
    return torch.cat(rows)


def _share_rows(grad: Tensor, x: Tensor, xb: Tensor) -> Tensor:
    """a_j = Σ_d (x − x′)_jd ∂f/∂x_jd for each row of ``grad`` [point, pos, d_model] (float64, CPU)."""
    return (grad.to(torch.float64).cpu() * (x - xb).to(torch.float64).cpu()[None]).sum(-1)


def _path_logprobs(model, x: Tensor, xb: Tensor, alphas: Tensor, target: int, batch_size: int) -> Tensor:
    """f = log p(target) at the last position, at x′ + α (x − x′) for each α, forward only (float64)."""
    with torch.no_grad():
        out = [_logprobs(model, points, target).cpu() for points in _path_points(x, xb, alphas, batch_size)]
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64)


def _refine_locally(
    model, x, xb, target, length, n_scored, ends, shares, batch_size, tolerance, max_steps
) -> IntegratedGradients:
    """:func:`integrated_gradients`' local rounds, from the even grid whose midpoints' a_j are
    ``shares`` [interval, pos] and which missed the tolerance."""
    steps = shares.shape[0]
    edges = torch.linspace(0.0, 1.0, steps + 1, dtype=torch.float64)
    lo, hi = edges[:-1].clone(), edges[1:].clone()
    n_grad, n_forward = steps, 0
    f_input, f_baseline = float(ends[0]), float(ends[1])
    f_lo = f_hi = None

    def result() -> IntegratedGradients:
        out = torch.zeros(length, dtype=torch.float64)
        out[:n_scored] = ((hi - lo)[:, None] * shares).sum(0)[:n_scored]
        edges = torch.cat([lo, hi[-1:]])
        return IntegratedGradients(
            out, f_input, f_baseline, n_grad, _target_value(target), n_forward=n_forward, edges=edges
        )

    ig = result()
    while ig.rel_gap > float(tolerance) and n_grad + 2 <= int(max_steps):
        if f_lo is None:
            inner = _path_logprobs(model, x, xb, edges[1:-1], target, batch_size)
            f_edges = torch.cat([ends[1:], inner, ends[:1]])
            f_lo, f_hi, n_forward = f_edges[:-1].clone(), f_edges[1:].clone(), steps - 1
        error = (shares.sum(-1) * (hi - lo) - (f_hi - f_lo)).abs()
        order = torch.argsort(error, descending=True, stable=True)
        cumulative = error[order].cumsum(0)
        n = int(torch.searchsorted(cumulative, 0.5 * cumulative[-1])) + 1  # the largest errors, half the sum
        n = min(max(n, int(batch_size) // 2, 1), len(lo), (int(max_steps) - n_grad) // 2)
        pick = order[:n].sort().values
        a, b = lo[pick], hi[pick]
        third = (b - a) / 3
        p1, p2 = a + third, a + 2 * third
        f_new = _path_logprobs(model, x, xb, torch.cat([p1, p2]), target, batch_size)
        new_shares = _shares(model, x, xb, torch.cat([a + third / 2, b - third / 2]), target, batch_size)
        keep = torch.ones(len(lo), dtype=torch.bool)
        keep[pick] = False
        lo = torch.cat([lo[keep], a, p1, p2])
        hi = torch.cat([hi[keep], p1, p2, b])
        f_lo = torch.cat([f_lo[keep], f_lo[pick], f_new[:n], f_new[n:]])
        f_hi = torch.cat([f_hi[keep], f_new[:n], f_new[n:], f_hi[pick]])
        shares = torch.cat([shares[keep], new_shares[:n], shares[pick], new_shares[n:]])
        order = torch.argsort(lo)
        lo, hi, f_lo, f_hi, shares = lo[order], hi[order], f_lo[order], f_hi[order], shares[order]
        n_grad, n_forward = n_grad + 2 * n, n_forward + 2 * n
        ig = result()
    return ig


@dataclass
class IntegrationPath:
    """:func:`integration_path`'s result: f = log p(target) at ``alphas`` along x′ + α (x − x′)."""

    alphas: Float[Tensor, "point"]  # float64, increasing
    f: Float[Tensor, "point"]  # float64
    target: int

    @property
    def net(self) -> float:
        """f at the last α minus f at the first: f(x) − f(x′) on the whole path."""
        return float(self.f[-1] - self.f[0])

    @property
    def total_variation(self) -> float:
        """Σ |f(α_{k+1}) − f(α_k)|: |net| on a monotone path, far more on one that dips and recovers
        (a lower bound of the path's total variation, exact as the grid refines)."""
        return float(self.f.diff().abs().sum())

    @property
    def steepest(self) -> tuple[float, float]:
        """(α_k, f(α_{k+1}) − f(α_k)) of the grid interval where f changes most."""
        k = int(self.f.diff().abs().argmax())
        return float(self.alphas[k]), float(self.f[k + 1] - self.f[k])


def integration_path(
    model,
    tokens: Int[Tensor, "pos"],
    position: int = -1,
    *,
    baseline_embeddings: Float[Tensor, "pos d_model"],
    target: int | None = None,
    alphas: Sequence[float] | Tensor | int = 257,
    batch_size: int = 16,
) -> IntegrationPath:
    """f = log p(target) at ``position`` along the straight path x′ + α (x − x′) that
    :func:`integrated_gradients` integrates (x the input embeddings of ``tokens[: position + 1]``,
    x′ = ``baseline_embeddings``), forward passes only. ``alphas``: the points in [0, 1], or their
    number on an even grid from 0 to 1. Default target: the clean top-1.

    The midpoint rule's error grows with the path's curvature: when
    :attr:`IntegrationPath.total_variation` is many times ``|net|``, f falls and recovers on the way
    and many steps are needed (docs/results.md, flow erasure version 2).

    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")
    >>> t = tiny_tokens(model, length=8)[0]
    >>> x = input_embeddings(model, t[:6])
    >>> path = integration_path(model, t, 5, baseline_embeddings=prefix_mean_baseline(x, range(1, 5)), alphas=9)
    >>> path.total_variation >= abs(path.net)
    True
    """
    tokens = as_row(tokens)
    position = check_position(position, tokens.shape[-1])
    x = input_embeddings(model, tokens[: position + 1])
    xb = _check_embeddings(baseline_embeddings, x)
    if isinstance(alphas, (int, np.integer)) and not isinstance(alphas, bool):
        if int(alphas) < 2:
            raise ValueError(f"alphas must be at least 2 points, got {alphas!r}")
        a = torch.linspace(0.0, 1.0, int(alphas), dtype=torch.float64)
    else:
        a = torch.as_tensor(alphas, dtype=torch.float64).flatten()
        if a.numel() < 2 or bool((a < 0).any() | (a > 1).any()) or bool((a.diff() <= 0).any()):
            raise ValueError("alphas must be at least 2 increasing points in [0, 1]")
    if int(batch_size) < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if target is None:
        target = int(last_position_logprobs(model, tokens[None, : position + 1])[0].argmax())
    return IntegrationPath(a, _path_logprobs(model, x, xb, a, target, batch_size), int(target))
