"""Input-token erasure: how faithfully a method attributes one prediction to the input tokens
(docs/method.md §10.1, the protocol in docs/flow/PROTOCOL.md).

For a next-token prediction at position i with clean top-1 token t*, every method scores the
erasable input positions 1 … i − 1 (BOS and position i itself are never erased):

- the four contribution flows (:func:`geolens.contribution_flow`, row i of the last layer's
  output): ``contribution``, ``alti``, ``attention_rollout``, ``value_zeroing_rollout``;
- ``grad_x_input``: Σ_d x_jd ∂f/∂x_jd with f = log p(t*) and x_j the residual stream entering the
  first block (:func:`gradient_x_input`);
- ``integrated_gradients`` (Sundararajan, Taly & Yan 2017): the same objective along the straight
  path from a baseline input x′, midpoint Riemann sum (:func:`integrated_gradients`);
- ``random``: uniform scores.

Erasure (DeYoung et al. 2020, ERASER) replaces tokens by a replacement token, positions kept
(:func:`erase`): **comprehensiveness** erases the top n_k = ⌈k·n⌉ tokens of a ranking,
**sufficiency** keeps them and erases the other erasable tokens. The outcomes at position i
against the clean prefix are KL(p_clean ‖ p_erased) and Δp = p_erased(t*) − p_clean(t*)
(:func:`erasure_outcomes`), and a method's **normalised AOPC** over the fractions is
mean_k O(k) / O(all erasable tokens erased). :mod:`geolens.flow.summary` turns the
per-prediction tables of a run into normalised AOPC, per-method intervals and Holm-corrected paired
verdicts (document-cluster bootstrap, :mod:`geolens.stats`); :func:`induction_check` is the
known-answer check on a repeated random sequence (:mod:`geolens.flow.induction`); the gradient
baselines are in :mod:`geolens.flow.baselines`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal, NamedTuple, Sequence, get_args

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from geolens.flow.baselines import (
    as_row,
    gradient_x_input,
    input_embeddings,
    integrated_gradients,
    last_position_logprobs,
    prefix_mean_baseline,
)
from geolens.flow.core import FLOW_METHODS, contribution_flow, flow_names_filter

ErasureMethod = Literal[
    "random",
    "attention_rollout",
    "value_zeroing_rollout",
    "alti",
    "contribution",
    "grad_x_input",
    "integrated_gradients",
]
ERASURE_METHODS: tuple[str, ...] = get_args(ErasureMethod)
GRADIENT_METHODS: tuple[str, ...] = ("grad_x_input", "integrated_gradients")
Direction = Literal["comprehensiveness", "sufficiency"]
DIRECTIONS: tuple[str, ...] = get_args(Direction)
Replacement = Literal["space", "unigram"]
REPLACEMENTS: tuple[str, ...] = get_args(Replacement)
FRACTIONS: tuple[float, ...] = (0.01, 0.02, 0.05, 0.10, 0.20)
OUTCOMES: tuple[str, ...] = ("kl", "delta_p")

# ---------------------------------------------------------------------------------------------
# Settings


@dataclass
class ErasureSettings:
    """Everything a run of the erasure test fixes (docs/flow/protocol.json; defaults = the protocol)."""

    positions: Sequence[int] = (15, 31, 63)
    fractions: Sequence[float] = FRACTIONS
    methods: Sequence[str] = ERASURE_METHODS
    replacements: Sequence[str] = REPLACEMENTS  # the first is the primary one
    ig_steps: int = 32
    seed: int = 2026  # first entry of every per-document generator
    n_boot: int = 10000
    boot_seed: int = 0
    alpha: float = 0.05
    min_kl_all: float = 1e-3
    min_drop_all: float = 0.01
    chunk_size: int = 16  # erased inputs per forward
    ig_batch: int = 8  # interpolation steps per forward and backward
    # docs/flow/v2: x′ of both gradient methods ("replacement": the erased prefix, version 1;
    # "prefix_mean": baselines.prefix_mean_baseline) and integrated gradients' adaptive steps
    ig_baseline: str = "replacement"
    ig_tolerance: float | None = None
    ig_max_steps: int = 864
    # docs/flow/v3: where the adaptive steps go ("even": tripled everywhere, version 2; "local":
    # split where the local completeness error is largest, baselines.integrated_gradients)
    ig_grid: str = "even"

    def __post_init__(self) -> None:
        self.positions = tuple(int(p) for p in self.positions)
        self.fractions = tuple(float(k) for k in self.fractions)
        self.methods = tuple(self.methods)
        self.replacements = tuple(self.replacements)
        if not self.positions or any(p < 2 for p in self.positions) or len(set(self.positions)) != len(self.positions):
            raise ValueError(
                f"positions must be distinct integers ≥ 2 (a prediction needs an erasable token), got {list(self.positions)}"
            )
        if not self.fractions or any(not 0.0 < k <= 1.0 for k in self.fractions):
            raise ValueError(f"fractions must lie in (0, 1], got {list(self.fractions)}")
        unknown = [m for m in self.methods if m not in ERASURE_METHODS]
        if unknown or len(self.methods) < 2 or len(set(self.methods)) != len(self.methods):
            raise ValueError(
                f"methods must be at least two distinct names of {', '.join(ERASURE_METHODS)}; got {list(self.methods)}"
            )
        bad = [r for r in self.replacements if r not in REPLACEMENTS]
        if bad or not self.replacements or len(set(self.replacements)) != len(self.replacements):
            raise ValueError(
                f"replacements must be distinct names of {', '.join(REPLACEMENTS)}; got {list(self.replacements)}"
            )
        for name in ("ig_steps", "n_boot", "chunk_size", "ig_batch"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if not 0.0 < self.alpha < 1.0:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha!r}")
        if self.ig_baseline not in ("replacement", "prefix_mean"):
            raise ValueError(f"ig_baseline must be 'replacement' or 'prefix_mean', got {self.ig_baseline!r}")
        if self.ig_tolerance is not None and not float(self.ig_tolerance) > 0:
            raise ValueError(f"ig_tolerance must be positive, got {self.ig_tolerance!r}")
        if self.ig_grid not in ("even", "local"):
            raise ValueError(f"ig_grid must be 'even' or 'local', got {self.ig_grid!r}")
        if self.ig_grid == "local" and self.ig_tolerance is None:
            raise ValueError("ig_grid 'local' refines until a tolerance: give ig_tolerance")

    @property
    def primary(self) -> str:
        return self.replacements[0]

    @classmethod
    def from_protocol(cls, settings: dict, **overrides) -> "ErasureSettings":
        """The settings of docs/flow/protocol.json (``settings`` is the parsed twin)."""
        r = settings["replacements"]
        stats = settings["statistics"]
        ig = settings["integrated_gradients"]
        adaptive = ig.get("adaptive") or {}
        values = dict(
            positions=settings["predictions"]["positions"],
            fractions=settings["fractions"],
            methods=settings["methods"],
            replacements=(r["primary"], r["robustness"]),
            ig_steps=settings["integrated_gradients"]["steps"],
            n_boot=stats["n_boot"],
            boot_seed=stats["seed"],
            alpha=stats["alpha"],
            min_kl_all=settings["range_check"]["min_kl_all"],
            min_drop_all=settings["range_check"]["min_drop_all"],
        )
        if ig.get("baseline") == "prefix_mean":
            values["ig_baseline"] = "prefix_mean"
        if adaptive:
            values.update(ig_tolerance=float(adaptive["tolerance"]), ig_max_steps=int(adaptive["max_steps"]))
            values["ig_grid"] = adaptive.get("grid", "even")
        values.update(overrides)
        return cls(**values)

    def to_dict(self) -> dict:
        """The settings as JSON; version 2's fields only where they differ from version 1, and
        version 3's ``ig_grid`` only where it differs from version 2 (so an earlier version's
        records and fingerprints keep their bytes)."""
        out = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}
        if self.ig_grid == "even":
            out.pop("ig_grid")
        if self.ig_baseline == "replacement" and self.ig_tolerance is None:
            for key in ("ig_baseline", "ig_tolerance", "ig_max_steps"):
                out.pop(key)
        return out


def method_pairs(methods: Sequence[str]) -> list[tuple[str, str]]:
    """Every pair (a, b) with a before b in ``methods``: the claim "b is more faithful than a".

    >>> method_pairs(["random", "alti", "contribution"])
    [('random', 'alti'), ('random', 'contribution'), ('alti', 'contribution')]
    """
    return [(a, b) for i, a in enumerate(methods) for b in methods[i + 1 :]]


# ---------------------------------------------------------------------------------------------
# Replacement tokens and erasure


def space_token(model) -> int:
    """The tokenizer's single token for ``" "`` (the primary replacement), or ValueError."""
    ids = model.tokenizer(" ", add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise ValueError(
            f"the tokenizer encodes ' ' as {len(ids)} tokens {ids}; the 'space' replacement needs exactly one"
        )
    return int(ids[0])


def unigram_counts(model, texts: Sequence[str]) -> Int[Tensor, "d_vocab"]:
    """Counts of the model's token ids over ``texts`` (no special tokens), ``[d_vocab]`` int64."""
    counts = torch.zeros(model.cfg.d_vocab, dtype=torch.int64)
    for text in texts:
        ids = torch.tensor(model.tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.int64)
        if ids.numel():
            counts += torch.bincount(ids, minlength=model.cfg.d_vocab)[: model.cfg.d_vocab]
    if int(counts.sum()) == 0:
        raise ValueError("the texts give no token: no unigram distribution")
    return counts


def replacement_ids(
    replacement: str,
    n_pos: int,
    *,
    space_id: int | None = None,
    counts: Tensor | None = None,
    rng: np.random.Generator | None = None,
) -> Int[Tensor, "pos"]:
    """The token that replaces an erased token at each position 0 … n_pos − 1.

    ``"space"``: ``space_id`` everywhere; ``"unigram"``: one draw per position from the
    distribution ``counts / counts.sum()`` with ``rng`` (``Generator.choice``).

    >>> replacement_ids("space", 4, space_id=7).tolist()
    [7, 7, 7, 7]
    """
    if replacement == "space":
        if space_id is None:
            raise ValueError("the 'space' replacement needs space_id")
        return torch.full((n_pos,), int(space_id), dtype=torch.long)
    if replacement == "unigram":
        if counts is None or rng is None:
            raise ValueError("the 'unigram' replacement needs counts and rng")
        p = counts.to(torch.float64).numpy()
        return torch.from_numpy(rng.choice(p.size, size=n_pos, p=p / p.sum())).to(torch.long)
    raise ValueError(f"replacement must be one of {', '.join(REPLACEMENTS)}, got {replacement!r}")


def erase(
    tokens: Int[Tensor, "... pos"], erased: Tensor, replacement: Int[Tensor, "pos"] | int
) -> Int[Tensor, "... pos"]:
    """``tokens`` with the positions where ``erased`` is True replaced (positions kept).

    >>> erase(torch.tensor([0, 5, 6, 7]), torch.tensor([False, True, False, True]), 9).tolist()
    [0, 9, 6, 9]
    """
    erased = torch.as_tensor(erased, dtype=torch.bool, device=tokens.device)
    if erased.shape[-1] != tokens.shape[-1]:
        raise ValueError(f"erased has {erased.shape[-1]} positions, the tokens {tokens.shape[-1]}")
    replacement = torch.as_tensor(replacement, dtype=tokens.dtype, device=tokens.device)
    return torch.where(erased, replacement, tokens)


def n_erased(fraction: float, n_erasable: int) -> int:
    """n_k = ⌈k · n⌉, at least 1 and at most n (a tolerance of 1e-9 keeps 0.1 · 30 at 3).

    >>> [n_erased(k, 62) for k in (0.01, 0.02, 0.05, 0.1, 0.2)]
    [1, 2, 4, 7, 13]
    """
    if n_erasable < 1:
        raise ValueError(f"no erasable token (n = {n_erasable})")
    return min(int(n_erasable), max(1, math.ceil(float(fraction) * n_erasable - 1e-9)))


def ranking(scores: Float[Tensor, "pos"], erasable: Sequence[int], *, absolute: bool = False) -> list[int]:
    """The erasable positions by decreasing score (``absolute``: of |score|), ties by increasing position.

    >>> ranking(torch.tensor([9.0, 0.2, 0.5, 0.2, 3.0]), [1, 2, 3])
    [2, 1, 3]
    """
    s = scores.detach().to(torch.float64).cpu()
    if bool(torch.isnan(s).any()):
        raise ValueError("scores contain NaN: no ranking")
    s = s.abs() if absolute else s
    return sorted((int(j) for j in erasable), key=lambda j: (-float(s[j]), j))


def erasure_sets(order: Sequence[int], fractions: Sequence[float], direction: str) -> list[list[int]]:
    """The positions erased at each fraction: the top n_k of ``order`` (comprehensiveness) or all
    but the top n_k (sufficiency).

    >>> erasure_sets([4, 2, 3, 1], [0.25, 0.5], "sufficiency")
    [[2, 3, 1], [3, 1]]
    """
    n = len(order)
    if direction == "comprehensiveness":
        return [list(order[: n_erased(k, n)]) for k in fractions]
    if direction == "sufficiency":
        return [list(order[n_erased(k, n) :]) for k in fractions]
    raise ValueError(f"direction must be one of {', '.join(DIRECTIONS)}, got {direction!r}")


class Outcomes(NamedTuple):
    """Outcomes of erased inputs against the clean one (float64)."""

    kl: Float[Tensor, "row"]  # KL(p_clean ‖ p_erased)
    delta_p: Float[Tensor, "row"]  # p_erased(t*) − p_clean(t*)
    p_clean: float  # p_clean(t*)
    target: int  # t*


def erasure_outcomes(
    model, clean: Int[Tensor, "pos"], rows: Int[Tensor, "row pos"], *, target: int | None = None, chunk_size: int = 16
) -> Outcomes:
    """KL(p_clean ‖ p_row) and Δp of ``target`` (default: the clean top-1) at the last position.

    The clean prefix and every distinct row are run once, together (identical rows share a
    forward); KL = Σ_t p_t (log p_t − log q_t) and Δp = q_{t*} − p_{t*} in float64.
    """
    clean = as_row(clean)
    if rows.ndim != 2 or rows.shape[1] != clean.shape[0]:
        raise ValueError(f"rows must be [row, {clean.shape[0]}], got shape {tuple(rows.shape)}")
    everything = torch.cat([clean[None].to(rows.device), rows])
    unique, inverse = torch.unique(everything, dim=0, return_inverse=True)
    logp = last_position_logprobs(model, unique, chunk_size=chunk_size)
    lp_clean = logp[inverse[0]]
    target = int(lp_clean.argmax()) if target is None else int(target)
    p_clean = lp_clean.exp()
    kl_unique = (p_clean * (lp_clean - logp)).sum(-1).clamp_min(0.0)
    dp_unique = logp[:, target].exp() - p_clean[target]
    idx = inverse[1:]
    return Outcomes(kl_unique[idx], dp_unique[idx], float(p_clean[target]), target)


# ---------------------------------------------------------------------------------------------
# One document


def flow_rows(
    model, tokens: Int[Tensor, "pos"], positions: Sequence[int], methods: Sequence[str]
) -> tuple[dict[str, Tensor], Tensor]:
    """({method: ``[len(positions), pos]`` rows of :func:`geolens.contribution_flow`}, clean
    log-probabilities ``[len(positions), d_vocab]`` at the positions), from one cached forward."""
    tokens = as_row(tokens)
    device = next(model.parameters()).device
    idx = torch.as_tensor(list(positions), dtype=torch.long)
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens[None].to(device), names_filter=flow_names_filter(model))
        rows = {
            m: contribution_flow(model, cache, m, tokens=tokens[None].to(device))[0][idx].detach().cpu()
            for m in methods
        }
    return rows, torch.log_softmax(logits[0, idx].to(torch.float64), dim=-1).cpu()


def measure_document(
    model,
    window: Int[Tensor, "pos"],
    document: int,
    settings: ErasureSettings = ErasureSettings(),
    *,
    space_id: int | None = None,
    counts: Tensor | None = None,
):
    """The erasure test on one window (docs/flow/PROTOCOL.md §2–3): returns the tables
    ``{"conditions", "predictions", "rankings"}`` (pandas DataFrames) of its predictions.

    ``conditions``: one row per (position, replacement, method, direction, fraction) with
    ``n_erased``, ``kl`` and ``delta_p``, plus per (position, replacement) the full erasure
    (``method = direction = "all"``, fraction 1). ``predictions``: the clean top-1 token and its
    probability, the number of erasable tokens and integrated gradients' two ends and sum.
    ``rankings``: each method's order of the erasable positions (space-separated).
    ``space_id`` and ``counts`` are needed by the ``space`` and ``unigram`` replacements.
    """
    window = as_row(window).cpu()
    positions = settings.positions
    if max(positions) >= window.shape[0]:
        raise ValueError(f"position {max(positions)} is outside the window of {window.shape[0]} tokens")
    n_pos = max(positions) + 1
    flows = [m for m in settings.methods if m in FLOW_METHODS]
    rows, clean_logp = flow_rows(model, window[:n_pos], positions, flows)
    replacements = {}
    for name in settings.replacements:
        rng = np.random.default_rng([settings.seed, int(document), 2]) if name == "unigram" else None
        replacements[name] = replacement_ids(name, n_pos, space_id=space_id, counts=counts, rng=rng)
    conditions, predictions, rankings = [], [], []
    for p_index, i in enumerate(positions):
        prefix = window[: i + 1]
        erasable = list(range(1, i))
        target = int(clean_logp[p_index].argmax())
        scores: dict[str, Tensor] = {}
        ig = None
        xb = None  # x′ of the gradient methods under docs/flow/v2
        if settings.ig_baseline == "prefix_mean" and any(m in GRADIENT_METHODS for m in settings.methods):
            xb = prefix_mean_baseline(input_embeddings(model, prefix), erasable)
        for m in settings.methods:
            if m in FLOW_METHODS:
                scores[m] = rows[m][p_index, : i + 1]
            elif m == "random":
                scores[m] = torch.from_numpy(
                    np.random.default_rng([settings.seed, int(document), int(i), 1]).random(i + 1)
                )
            elif m == "grad_x_input":
                scores[m] = gradient_x_input(model, prefix, i, target=target, baseline_embeddings=xb)
            elif xb is not None:
                ig = integrated_gradients(
                    model,
                    prefix,
                    None,
                    i,
                    target=target,
                    n_steps=settings.ig_steps,
                    batch_size=settings.ig_batch,
                    baseline_embeddings=xb,
                    tolerance=settings.ig_tolerance,
                    max_steps=settings.ig_max_steps,
                    grid=settings.ig_grid,
                )
                scores[m] = ig.attributions
            else:
                baseline = erase(prefix, _mask(i + 1, erasable), replacements[settings.primary][: i + 1])
                ig = integrated_gradients(
                    model, prefix, baseline, i, target=target, n_steps=settings.ig_steps, batch_size=settings.ig_batch
                )
                scores[m] = ig.attributions
        orders = {m: ranking(scores[m], erasable, absolute=m in GRADIENT_METHODS) for m in settings.methods}
        rankings += [
            dict(document=int(document), position=i, method=m, order=" ".join(map(str, orders[m])))
            for m in settings.methods
        ]
        keys, masks = [], []
        for r in settings.replacements:
            keys.append((r, "all", "all", 1.0, len(erasable)))
            masks.append((r, erasable))
            for m in settings.methods:
                for d in DIRECTIONS:
                    for k, erased in zip(settings.fractions, erasure_sets(orders[m], settings.fractions, d)):
                        keys.append((r, m, d, k, len(erased)))
                        masks.append((r, erased))
        inputs = torch.stack([erase(prefix, _mask(i + 1, erased), replacements[r][: i + 1]) for r, erased in masks])
        out = erasure_outcomes(model, prefix, inputs, target=target, chunk_size=settings.chunk_size)
        for (r, m, d, k, n), kl, dp in zip(keys, out.kl.tolist(), out.delta_p.tolist()):
            conditions.append(
                dict(
                    document=int(document),
                    position=i,
                    replacement=r,
                    method=m,
                    direction=d,
                    fraction=k,
                    n_erased=n,
                    kl=kl,
                    delta_p=dp,
                )
            )
        predictions.append(
            dict(
                document=int(document),
                position=i,
                n_erasable=len(erasable),
                target=target,
                p_clean=out.p_clean,
                ig_f_input=None if ig is None else ig.f_input,
                ig_f_baseline=None if ig is None else ig.f_baseline,
                ig_sum=None if ig is None else float(ig.attributions.sum()),
                ig_steps=settings.ig_steps if ig is None else ig.n_steps,
            )
        )
        if settings.ig_grid == "local":  # docs/flow/v3: the forward passes at the grid's interval ends
            predictions[-1]["ig_forward"] = 0 if ig is None else ig.n_forward
    return {
        "conditions": pd.DataFrame(conditions),
        "predictions": pd.DataFrame(predictions),
        "rankings": pd.DataFrame(rankings),
    }


def _mask(n: int, positions: Sequence[int]) -> Tensor:
    m = torch.zeros(n, dtype=torch.bool)
    m[list(positions)] = True
    return m
