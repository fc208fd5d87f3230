"""Faithfulness of attribution metrics by causal masking (docs/method.md §3, paper A §2.3 and §3.1).

For a metric s_ij^{(l,h)} (an attribution of query i to source j in head h of layer l), the
masking intervention of :mod:`geolens.interventions.masking` removes the terms α_ij ṽ_j of the
chosen sources from the attention sum (α_ij set to 0 in ``hook_pattern``, no renormalisation),
in every layer of the protocol at once.

- **Comprehensiveness** at fraction k: remove the top-k of each ranking group. A more faithful
  metric hurts the model more: larger ΔPPL, more negative Δ log-prob.
- **Sufficiency** at fraction k: remove the bottom-k. A more faithful metric hurts it less.

The :class:`Protocol` (recorded with every result) fixes

- the **masking scope**: the layers masked together (all = the primary protocol; the thirds
  ``early`` / ``middle`` / ``late`` of the stack; one layer);
- the **ranking scope** (:data:`geolens.interventions.masking.RANKING_SCOPES`): ``row`` ranks the
  sources of one (layer, head, query); ``query`` ranks all (head, source) terms of one (layer,
  query) together, so the scores of different heads are compared on their common scale;
  ``source`` ranks one score per (layer, query, source), the sum over heads, and removes a source
  in every head;
- whether the sink (position 0) and the current token (j = i) are removable;
- ``mode``: the output o_i of the output-normalised metric and of c_ij (``inter``: the layer
  output, on which the inter-head contribution weights are a common scale; ``intra``: the head's);
- the fractions k and ``skip_prefix``: every next-token prediction after the first
  ``skip_prefix`` positions is scored.

**Scoring.** Per document, the mean NLL over its scored predictions, clean and under each mask
(and with the sink alone removed: α_i0 = 0 for every query i ≥ 1, every head, every masked layer).
Corpus-level ΔPPL at k = exp(mean NLL masked) − exp(mean NLL clean), means over all scored tokens
of all documents; Δ log-prob = mean log p(target) masked − clean. The area under each curve is
the trapezoid rule over k. Confidence intervals resample documents (≥ 1000 paired resamples: the
same documents for every metric); a claimed-order step "a < b" is decided on the paired
difference of AUCs, signed so that a positive difference means b is more faithful:
**holds** when its 95% CI lies above 0, **reversed** when below 0, **tie** otherwise.

**Range check before any verdict.** The random ranking at the largest fraction must move the
corpus PPL by at least :data:`MIN_RANGE` (1 %) relative; otherwise the protocol cannot separate
metrics and every verdict is ``"no range"``.

Metrics (docs/method.md §2 and §3.1): ``raw_attention`` α_ij, ``value_weighted``
α_ij‖ṽ_j‖, ``output_normalized`` α_ij‖ṽ_j‖/‖o_i‖, ``contribution`` c_ij ranked by signed value,
``contribution_abs`` |c_ij|, ``value_zeroing`` (Mohebbi et al. 2023, :func:`value_zeroing`; one
score per source, shared by the heads of a layer) and ``random`` (uniform scores: the floor).

Note on ties by construction: ‖o_i‖ is one positive number per (layer, query) in ``inter`` mode
and per (layer, head, query) in ``intra`` mode. Dividing by it never changes a ranking inside that
group, so ``output_normalized`` ranks exactly like ``value_weighted`` under ``row`` ranking (both
modes) and under ``query`` / ``source`` ranking in ``inter`` mode; the two differ only under
``query`` / ``source`` ranking in ``intra`` mode, where each head is divided by its own output
norm. Identical rankings give identical masks, a paired difference of exactly 0 and a "tie".
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, Sequence, get_args

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from geolens.adapter import adapter_for, get_attention_layer, names_filter
from geolens.interventions.masking import (
    RANKING_SCOPES,
    RankingScope,
    mask_from_ranks,
    masked_token_nll,
    removal_masks,
    removal_ranks,
    require_pattern_hooks,
    token_nll,
)
from geolens.metrics import LayerInputs, MetricName, SequenceInputs, check_metric_names, get_metric, metric_names
from geolens.stats import bootstrap_indices, percentile_ci, resample_means
from geolens.stats import verdict as ci_verdict

Metric = MetricName  # the built-in metric names (geolens.metrics, where every metric is registered)
ALL_METRICS: tuple[str, ...] = metric_names()  # the built-in ones, registered at import; metric_names() is live
CLAIMED_ORDER = ("raw_attention", "value_weighted", "output_normalized", "contribution")
NormMode = Literal["intra", "inter"]
MODES: tuple[str, ...] = get_args(NormMode)
Direction = Literal["comprehensiveness", "sufficiency"]
DIRECTIONS: tuple[str, ...] = get_args(Direction)
Quantity = Literal["delta_ppl", "delta_logprob"]
QUANTITIES: tuple[str, ...] = get_args(Quantity)
LayerGroup = Literal["all", "early", "middle", "late"]
LAYER_GROUPS: tuple[str, ...] = get_args(LayerGroup)
FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9)
MIN_RANGE = 0.01  # the random ranking must move corpus PPL by ≥ 1 % (relative) at the largest k
MIN_DOCUMENTS = 5  # fewer documents: a bootstrap over documents is degenerate, no verdict
# pairs (a, b) compared: the claimed order's steps first, then the overall gap and the controls
PAIRS = (
    ("raw_attention", "value_weighted"),
    ("value_weighted", "output_normalized"),
    ("output_normalized", "contribution"),
    ("raw_attention", "contribution"),
    ("contribution", "contribution_abs"),
    ("value_zeroing", "contribution"),
    ("random", "raw_attention"),
    ("random", "contribution"),
)
CLAIMED_STEPS = tuple(zip(CLAIMED_ORDER, CLAIMED_ORDER[1:]))


def layer_group(name: str, n_layers: int) -> tuple[int, ...]:
    """``all`` or the ``early`` / ``middle`` / ``late`` third of the stack (sizes differ by ≤ 1)."""
    if name not in LAYER_GROUPS:
        raise ValueError(f"unknown layer group {name!r}; choose from {list(LAYER_GROUPS)}")
    if name == "all":
        return tuple(range(n_layers))
    parts = np.array_split(np.arange(n_layers), 3)
    return tuple(int(l) for l in parts[LAYER_GROUPS.index(name) - 1])


def masking_scope(layers: Sequence[int], n_layers: int) -> str:
    """The name of a layer set: ``all``, ``early``/``middle``/``late``, ``one layer`` or ``layers``."""
    layers = tuple(sorted(layers))
    if len(layers) == 1 and n_layers > 1:
        return "one layer"
    for name in LAYER_GROUPS:
        if layers == layer_group(name, n_layers):
            return name
    return "one layer" if len(layers) == 1 else "layers"


@dataclass(frozen=True)
class Protocol:
    """How sources are masked and scored; recorded with every result.

    Attributes:
        layers: the layers masked together in one forward (None = all layers: the primary
            protocol; :func:`layer_group` gives the thirds).
        ranking: ``row``, ``query`` (the primary) or ``source`` (see the module docstring).
        allow_sink: whether position 0 (the sink) may be removed (primary: True).
        allow_current: whether the query's own token (j = i) may be removed (primary: True).
        mode: which output o_i the output-normalised metric and c_ij use (``inter``: the layer's,
            the primary; ``intra``: the head's).
        fractions: the removal fractions k, each in (0, 1) for a curve (0 and 1 are accepted
            by the mask builders for identity checks).
        skip_prefix: score the next-token predictions of positions ≥ skip_prefix (masks still
            apply to every query).

    >>> import geolens
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")  # 2 layers, 4 query heads sharing 2 kv heads
    >>> p = geolens.Protocol(layers=(1,), ranking="row", allow_sink=False, fractions=(0.1, 0.5))
    >>> p.resolved_layers(model), p.ranking
    ((1,), 'row')
    """

    layers: tuple[int, ...] | None = None
    ranking: RankingScope = "query"
    allow_sink: bool = True
    allow_current: bool = True
    mode: NormMode = "inter"
    fractions: tuple[float, ...] = FRACTIONS
    skip_prefix: int = 8

    def __post_init__(self) -> None:
        if self.ranking not in RANKING_SCOPES:
            raise ValueError(f"unknown ranking scope {self.ranking!r}; choose from {list(RANKING_SCOPES)}")
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}; choose from {list(MODES)}")
        fr = tuple(float(k) for k in self.fractions)
        if not fr:
            raise ValueError("the protocol has no fraction")
        bad = [k for k in fr if not (0.0 <= k <= 1.0) or math.isnan(k)]
        if bad:
            raise ValueError(f"fractions must lie in (0, 1), got {bad}")
        if list(fr) != sorted(set(fr)):
            raise ValueError(f"fractions must be distinct and increasing, got {list(fr)}")
        object.__setattr__(self, "fractions", fr)
        if int(self.skip_prefix) < 0:
            raise ValueError(f"skip_prefix must be ≥ 0, got {self.skip_prefix}")

    def check_curve(self) -> None:
        """A curve needs every k strictly inside (0, 1) (k = 0 masks nothing, k = 1 everything)."""
        bad = [k for k in self.fractions if not 0.0 < k < 1.0]
        if bad:
            raise ValueError(f"fractions must lie in (0, 1), got {bad}")

    def resolved_layers(self, model) -> tuple[int, ...]:
        n = model.cfg.n_layers
        if self.layers is None:
            return tuple(range(n))
        from geolens.validation import check_layer

        try:  # never wrapped past the end; 1.0 / True refused
            out = [check_layer(l, n) for l in self.layers]
        except (IndexError, TypeError) as err:
            raise ValueError(f"protocol layers: {err}") from None
        if not out:
            raise ValueError("the protocol masks no layer")
        return tuple(sorted(set(out)))

    def describe(self, model=None) -> str:
        if model is not None:
            layers = self.resolved_layers(model)
            span = f"{masking_scope(layers, model.cfg.n_layers)} ({_span(layers)})"
        else:
            span = "all" if self.layers is None else _span(self.layers)
        return (
            f"protocol: layers masked together = {span}; ranking = {self.ranking}; "
            f"sink (pos 0) removable = {self.allow_sink}; current token removable = {self.allow_current}; "
            f"metric mode = {self.mode}; k = {list(self.fractions)}; scored = predictions after the first "
            f"{self.skip_prefix} positions; no renormalisation of α"
        )

    def to_dict(self, model=None) -> dict:
        d = asdict(self)
        d["fractions"] = list(self.fractions)
        if model is not None:
            d["layers"] = list(self.resolved_layers(model))
            d["masking_scope"] = masking_scope(d["layers"], model.cfg.n_layers)
        return d


def _span(layers: Sequence[int]) -> str:
    layers = list(layers)
    if layers == list(range(layers[0], layers[-1] + 1)) and len(layers) > 2:
        return f"{layers[0]}–{layers[-1]} ({len(layers)} layers)"
    return ",".join(map(str, layers))


# ---------------------------------------------------------------------------------------------
# Value Zeroing (Mohebbi et al. 2023)


def value_zeroing(
    model,
    tokens: Int[Tensor, "batch pos"],
    layers: Sequence[int] | None = None,
    *,
    chunk_size: int | None = None,
    final_norm: bool = False,
    normalize: bool = False,
    queries=None,
) -> Float[Tensor, "layer batch query key"]:
    """Value Zeroing scores VZ_ij^{(l)} = 1 − cos(x̃_i^{(l)}, x̃_i^{(l), ¬j}) (Mohebbi et al. 2023).

    x̃_i^{(l)} is the output of layer l (``blocks.{l}.hook_resid_post``) at position i, and
    x̃_i^{(l), ¬j} the same output when layer l is rerun with the value vector of token j zeroed
    in every head (``hook_v``; with grouped-query attention, in every kv head, hence in every
    query head), everything before layer l unchanged. Future sources (j > i) score 0. Mohebbi et
    al. normalise each row to sum 1 afterwards; that does not change the per-row ranking, so the
    raw cosine distances are returned. ``queries`` (a list of positions, or ``{layer: positions}``)
    computes those query rows only, the others left 0: a sample of positions costs its rows alone.
    ``final_norm=True`` scores the last layer after the
    model's final norm (``ln_final``), as inseq and Hugging Face ``hidden_states[-1]`` do; the
    other layers are unchanged.

    One clean forward, then no attention is recomputed: zeroing v_j leaves the pattern as it is,
    so the pre-norm attention output without source j is exactly the clean one minus
    Σ_h α_ij^h ṽ_j^h (ṽ_j^h = v_j W_O^h), and only queries i ≥ j change. Only those rows go
    through the rest of the block (post-attention norm where there is one, residual add, MLP;
    :meth:`~geolens.adapter.ModelAdapter.block_after_attention`). ``chunk_size`` bounds the
    sources handled together (default: as many as keep about 4096 rows per MLP call). The
    block's rebuilt clean output is checked against the cached one, so a block this does not
    describe raises instead of giving wrong scores.

    >>> import geolens
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")  # 2 layers, 4 query heads sharing 2 kv heads
    >>> vz = geolens.value_zeroing(model, tiny_tokens(model, length=12), layers=[0])
    >>> tuple(vz.shape)  # [layer, batch, query, key]
    (1, 2, 12, 12)
    """
    from geolens.geometry import layer_output
    from geolens.validation import check_context, check_layer

    if tokens.ndim != 2:
        raise ValueError(f"tokens must be [batch, pos], got shape {tuple(tokens.shape)}")
    n_layers = model.cfg.n_layers
    layers = sorted({check_layer(l, n_layers) for l in (range(n_layers) if layers is None else layers)})
    n_pos = check_context(model, tokens.shape[1])
    if chunk_size is not None and (isinstance(chunk_size, bool) or int(chunk_size) < 1):
        raise ValueError("chunk_size must be a positive integer")
    chunk = max(1, 4096 // n_pos) if chunk_size is None else int(chunk_size)
    if queries is not None and not isinstance(queries, dict):
        queries = {l: queries for l in layers}
    if queries is not None:
        queries = {check_layer(l, n_layers): [int(q) % n_pos for q in qs] for l, qs in queries.items()}
        missing = [l for l in layers if l not in queries]
        if missing:
            raise ValueError(f"value_zeroing: queries name no positions for layers {missing}")
    scores = torch.zeros(len(layers), tokens.shape[0], n_pos, n_pos)
    adapter = adapter_for(model)
    wanted = set()
    for l in layers:
        wanted |= {adapter.resid_pre_hook(l), adapter.resid_post_hook(l), adapter.pattern_hook(l), adapter.value_hook(l)}
    model_dtype = next(model.parameters()).dtype
    for b in range(tokens.shape[0]):
        with torch.no_grad():
            _, cache = model.run_with_cache(tokens[b : b + 1], names_filter=lambda name: name in wanted, stop_at_layer=layers[-1] + 1)
        for n, l in enumerate(layers):
            view = get_attention_layer(model, cache, l)
            resid_pre = cache[adapter.resid_pre_hook(l)][0]
            clean = cache[adapter.resid_post_hook(l)][0]
            attn_out = layer_output(view)[0] + view.b_O  # [query, d_model], float32
            v_tilde = torch.einsum("khd,hdm->hkm", view.v[0], view.W_O)  # [head, key, d_model]
            pattern = view.pattern[0]  # [head, query, key]
            wanted_query = torch.ones(n_pos, dtype=torch.bool, device=pattern.device)
            if queries is not None:
                wanted_query[:] = False
                wanted_query[queries[l]] = True
            with torch.no_grad():
                rebuilt = adapter.block_after_attention(l, resid_pre[None], attn_out.to(model_dtype)[None])[0]
                scale = clean.float().norm(dim=-1).clamp_min(1e-6)
                err = float(((rebuilt - clean).float().norm(dim=-1) / scale).max())
                if err > max(1e-3, 50 * torch.finfo(model_dtype).eps):  # rounding of the model's own dtype
                    raise RuntimeError(
                        f"value_zeroing: layer {l}: the block rebuilt from its attention output differs from "
                        f"the cached block output by {err:.2g} (relative); this block structure is not supported"
                    )
                last = final_norm and l == n_layers - 1
                # the rebuilt clean output is the reference, so a source that changes nothing scores 0
                reference = adapter.final_norm(rebuilt[None])[0] if last else rebuilt
                for start in range(0, n_pos, chunk):
                    sources = torch.arange(start, min(start + chunk, n_pos), device=pattern.device)
                    delta = torch.einsum("hqs,hsm->sqm", pattern[:, :, sources], v_tilde[:, sources])  # [source, query, d_model]
                    visible = (torch.arange(n_pos, device=pattern.device)[None] >= sources[:, None]) & wanted_query[None]
                    s_idx, q_idx = visible.nonzero(as_tuple=True)
                    if s_idx.numel() == 0:
                        continue
                    rows = (attn_out[q_idx] - delta[s_idx, q_idx]).to(model_dtype)  # subtracted in float32
                    out = adapter.block_after_attention(l, resid_pre[q_idx][None], rows[None])[0]
                    if last:
                        out = adapter.final_norm(out[None])[0]
                    cos = torch.nn.functional.cosine_similarity(out.float(), reference[q_idx].float(), dim=-1)
                    scores[n, b, q_idx.cpu(), sources[s_idx].cpu()] = (1.0 - cos).cpu()
    if normalize:
        scores = scores / scores.sum(-1, keepdim=True).clamp_min(torch.finfo(scores.dtype).tiny)
    return scores


# ---------------------------------------------------------------------------------------------
# Metric tensors and masks


def metric_scores(
    model,
    tokens: Int[Tensor, "1 pos"],
    protocol: Protocol,
    metrics: Sequence[str] | None = None,
    *,
    seed: int = 0,
    value_zeroing_chunk: int | None = None,
    cache=None,
) -> dict[str, Float[Tensor, "layer 1 head query key"]]:
    """Each metric's scores on the protocol's layers for one sequence (``metrics``: names in
    :mod:`geolens.metrics`; None = every registered metric).

    The head axis is n_heads, or 1 for a score shared by every head: Value Zeroing always, and
    every metric under ``source`` ranking (scores summed over heads; ``contribution_abs`` is then
    |Σ_h c_ij^h|, the magnitude of the source's total contribution). ``cache`` (a
    ``run_with_cache`` of ``tokens`` holding pattern and v of those layers) saves a forward.
    """
    metrics = metric_names() if metrics is None else metrics
    check_metric_names(metrics)
    layers = protocol.resolved_layers(model)
    summed = protocol.ranking == "source"
    specs = {m: get_metric(m) for m in metrics}
    out: dict[str, Tensor] = {}
    wanted = [m for m in metrics if specs[m].per_layer]
    if wanted:
        if cache is None:
            with torch.no_grad():
                _, cache = model.run_with_cache(tokens, names_filter=names_filter(model, layers))
        per_layer = {m: [] for m in wanted}
        for l in layers:
            inputs = LayerInputs.from_layer(get_attention_layer(model, cache, l), protocol.mode)
            for m in wanted:
                per_layer[m].append(specs[m].layer_scores(inputs, summed))
        del cache
        for m in wanted:
            out[m] = torch.stack(per_layer[m])
    inputs = SequenceInputs(model, tokens, layers, 1 if summed else model.cfg.n_heads, seed, value_zeroing_chunk)
    for m in metrics:
        if not specs[m].per_layer:
            out[m] = specs[m].fn(inputs)
    return {m: out[m] for m in metrics}


def ranked_removals(scores: Tensor, protocol: Protocol) -> dict[str, tuple[Tensor, Tensor, Tensor]]:
    """:func:`removal_ranks` of one metric's scores for each direction, under the protocol."""
    return {
        d: removal_ranks(
            scores, scope=protocol.ranking, largest=d == "comprehensiveness",
            allow_sink=protocol.allow_sink, allow_current=protocol.allow_current,
        )  # fmt: skip
        for d in DIRECTIONS
    }


def curve_masks(scores: Float[Tensor, "layer 1 head query key"], protocol: Protocol) -> torch.Tensor:
    """Masks ``[layer, 2·n_k, head, query, key]``: comprehensiveness for each k, then sufficiency.

    The head axis is the scores' (n_heads or 1) except under ``source`` ranking (always 1).
    """
    options = dict(scope=protocol.ranking, allow_sink=protocol.allow_sink, allow_current=protocol.allow_current)
    return torch.cat(
        [m for d in DIRECTIONS for m in removal_masks(scores, protocol.fractions, largest=d == "comprehensiveness", **options)],
        dim=1,
    )


def sink_only_mask(n_layers: int, n_pos: int) -> torch.Tensor:
    """``[layer, 1, 1, query, key]``: the sink's term α_i0 ṽ_0 removed for every query i ≥ 1, every head."""
    m = torch.zeros(n_layers, 1, 1, n_pos, n_pos, dtype=torch.bool)
    m[..., 1:, 0] = True
    return m


# ---------------------------------------------------------------------------------------------
# Curves and areas


def area_under_curve(fractions: Sequence[float], values) -> np.ndarray:
    """Trapezoid-rule area over the fractions; ``values`` ``[..., n_k]``."""
    x = np.asarray(fractions, dtype=np.float64)
    y = np.asarray(values, dtype=np.float64)
    return ((y[..., 1:] + y[..., :-1]) * np.diff(x) / 2.0).sum(-1)


def auc_ci(
    fractions: Sequence[float], per_sequence, *, n_boot: int = 1000, seed: int = 0, level: float = 0.95
) -> tuple[float, float, float]:
    """(AUC of the mean curve, CI low, CI high) by resampling sequences (rows of ``per_sequence``).

    The AUC of the mean curve over each resample of sequences (:func:`geolens.stats.bootstrap_indices`)
    and the percentile interval of those AUCs (:func:`geolens.stats.percentile_ci`).
    """
    y = np.asarray(per_sequence, dtype=np.float64)
    if y.ndim != 2 or y.shape[1] != len(fractions):
        raise ValueError(f"per_sequence must be [n_sequences, {len(fractions)}], got {y.shape}")
    samples = area_under_curve(fractions, resample_means(y, bootstrap_indices(y.shape[0], n_boot, seed)))
    lo, hi = percentile_ci(samples, level)
    return float(area_under_curve(fractions, y.mean(0))), float(lo), float(hi)




def faithfulness_sign(direction: str, quantity: str) -> float:
    """+1 when a larger AUC of ``quantity`` means a more faithful metric in ``direction``, else −1.

    Comprehensiveness: larger ΔPPL (more negative Δ log-prob) is more faithful; sufficiency:
    smaller ΔPPL (less negative Δ log-prob).
    """
    if direction not in DIRECTIONS or quantity not in QUANTITIES:
        raise ValueError(f"unknown direction/quantity {direction!r}/{quantity!r}")
    sign = 1.0 if direction == "comprehensiveness" else -1.0
    return sign if quantity == "delta_ppl" else -sign


def verdict(
    ci_low: float, ci_high: float, has_range: bool = True, n_documents: int | None = None, *, testable: bool = True
) -> str:
    """``holds`` when the CI of "b more faithful than a" lies above 0, ``reversed`` when below 0,
    ``tie`` otherwise (:func:`geolens.stats.verdict`, ``not testable`` when ``testable`` is False);
    ``no range`` when the protocol failed its range check, ``too few documents`` below
    :data:`MIN_DOCUMENTS` (a bootstrap over 1 document has a zero-width interval). A pair that
    cannot differ by construction is ``not testable`` whatever its data."""
    if not testable:
        return ci_verdict(ci_low, ci_high, testable=False)
    if not has_range:
        return "no range"
    if n_documents is not None and n_documents < MIN_DOCUMENTS:
        return "too few documents"
    return ci_verdict(ci_low, ci_high, testable=testable)


@dataclass
class FaithfulnessResult:
    """Per-document mean NLLs under every mask, with the protocol that produced them.

    ``per_sequence``: sequence, metric, direction, fraction, nll (mean over the document's
    scored predictions), n_removed. ``clean``: sequence, nll, n_scored, sink_nll (the sink alone
    removed). Every statistic is computed from these by :meth:`analysis` (corpus-level curves,
    AUCs, paired differences, the range check), with one set of bootstrap resamples of documents.
    """

    protocol: dict
    per_sequence: pd.DataFrame
    clean: pd.DataFrame
    meta: dict = field(default_factory=dict)
    n_boot: int = 1000
    seed: int = 0
    _cache: dict = field(default_factory=dict, repr=False)

    # -- bootstrap over documents ------------------------------------------------------------

    def _resampled(self) -> dict:
        """Every statistic on the data (row 0) and on ``n_boot`` resamples of documents (rows 1…),
        the same resamples (:func:`geolens.stats.bootstrap_indices`) for every metric: paired."""
        key = (len(self.per_sequence), len(self.clean), self.n_boot, self.seed)
        if self._cache.get("key") == key:
            return self._cache["boot"]
        fr = list(self.protocol["fractions"])
        clean = self.clean.sort_values("sequence")
        seqs = clean.sequence.to_numpy()
        w = clean.n_scored.to_numpy(dtype=np.float64)
        c = clean.nll.to_numpy(dtype=np.float64)
        n = len(seqs)
        idx = np.concatenate([np.arange(n)[None], bootstrap_indices(n, self.n_boot, self.seed)])  # row 0: the data
        wsum = w[idx].sum(1)  # [1 + n_boot]
        clean_nll = (w * c)[idx].sum(1) / wsum
        out = {"clean_nll": clean_nll, "n": n}
        for (metric, direction), df in self.per_sequence.groupby(["metric", "direction"], sort=False):
            wide = df.pivot(index="sequence", columns="fraction", values="nll").reindex(index=seqs, columns=fr)
            y = wide.to_numpy(dtype=np.float64)
            if np.isnan(y).any():
                raise ValueError(f"{metric}/{direction}: missing (sequence, fraction) results")
            nll = np.einsum("bn,bnk->bk", w[idx], y[idx]) / wsum[:, None]  # [1 + n_boot, n_k]
            dppl = np.exp(nll) - np.exp(clean_nll)[:, None]
            dlp = -(nll - clean_nll[:, None])
            out[metric, direction] = {"delta_ppl": dppl, "delta_logprob": dlp, "ppl": np.exp(nll)}
        if "sink_nll" in clean and clean.sink_nll.notna().all():
            s = clean.sink_nll.to_numpy(dtype=np.float64)
            out["sink_delta_ppl"] = np.exp((w * s)[idx].sum(1) / wsum) - np.exp(clean_nll)
        self._cache.update(key=key, boot=out)
        return out

    @staticmethod
    def _ci(x: np.ndarray, level: float = 0.95) -> tuple[float, float]:
        lo, hi = percentile_ci(x, level)
        return float(lo), float(hi)

    @property
    def metrics(self) -> list[str]:
        return list(dict.fromkeys(self.per_sequence.metric))

    @property
    def clean_ppl(self) -> float:
        return float(np.exp(self._resampled()["clean_nll"][0]))

    @property
    def curves(self) -> pd.DataFrame:
        """Corpus-level ΔPPL and Δ log-prob per (metric, direction, k) with bootstrap 95% CIs."""
        b = self._resampled()
        rows = []
        for key, v in b.items():
            if not isinstance(key, tuple):
                continue
            metric, direction = key
            for ki, k in enumerate(self.protocol["fractions"]):
                row = dict(metric=metric, direction=direction, fraction=k, ppl=float(v["ppl"][0, ki]))
                for q in QUANTITIES:
                    lo, hi = self._ci(v[q][1:, ki])
                    row.update({q: float(v[q][0, ki]), f"{q}_lo": lo, f"{q}_hi": hi})
                row["n_sequences"] = b["n"]
                rows.append(row)
        return pd.DataFrame(rows)

    def auc(self, n_boot: int | None = None) -> pd.DataFrame:
        """AUC over k of the corpus-level curves, with bootstrap 95% CIs over documents."""
        if n_boot is not None and n_boot != self.n_boot:
            self.n_boot = n_boot
        b = self._resampled()
        fr = list(self.protocol["fractions"])
        rows = []
        for key, v in b.items():
            if not isinstance(key, tuple):
                continue
            for q in QUANTITIES:
                a = area_under_curve(fr, v[q])
                lo, hi = self._ci(a[1:])
                rows.append(dict(metric=key[0], direction=key[1], quantity=q, auc=float(a[0]), ci_low=lo, ci_high=hi, n_sequences=b["n"]))
        return pd.DataFrame(rows)

    def range_check(self) -> dict:
        """ΔPPL of the random ranking at the largest k (comprehensiveness) and of the sink alone."""
        b = self._resampled()
        clean = float(np.exp(b["clean_nll"][0]))
        out = dict(clean_ppl=clean, threshold_rel=MIN_RANGE, max_fraction=float(self.protocol["fractions"][-1]))
        if ("random", "comprehensiveness") in b:
            d = b["random", "comprehensiveness"]["delta_ppl"][:, -1]
            lo, hi = self._ci(d[1:])
            out.update(random_delta_ppl_at_max_fraction=float(d[0]), random_delta_ppl_ci=[lo, hi],
                       random_delta_ppl_rel_at_max_fraction=float(d[0]) / clean)  # fmt: skip
            out["has_range"] = bool(abs(float(d[0])) / clean >= MIN_RANGE)
        else:
            out.update(random_delta_ppl_at_max_fraction=None, random_delta_ppl_rel_at_max_fraction=None, has_range=False)
            out["note"] = "the random ranking was not run: no range check, no verdict"
        if "sink_delta_ppl" in b:
            s = b["sink_delta_ppl"]
            lo, hi = self._ci(s[1:])
            out.update(sink_only_delta_ppl=float(s[0]), sink_only_delta_ppl_ci=[lo, hi], sink_only_delta_ppl_rel=float(s[0]) / clean)
        return out

    def pairs(self, pairs: Sequence[tuple[str, str]] = PAIRS) -> pd.DataFrame:
        """Paired AUC differences, signed so that a positive ``auc_diff`` means b is more faithful.

        For every (a, b) of ``pairs`` whose metrics both ran, each direction and quantity:
        auc_diff = sign · (AUC_b − AUC_a) (:func:`faithfulness_sign`), its 95% percentile CI over
        the same document resamples for a and b, and the :func:`verdict` (``no range`` when the
        range check failed, ``too few documents`` below :data:`MIN_DOCUMENTS`, ``not testable``
        when the two metrics mask identically by construction: :func:`same_ranking_by_construction`).
        """
        b = self._resampled()
        fr = list(self.protocol["fractions"])
        has_range = self.range_check()["has_range"]
        identical = {frozenset(("value_weighted", "output_normalized"))} if same_ranking_by_construction(self.protocol) else set()
        rows = []
        for a, bb in pairs:
            for d in DIRECTIONS:
                if (a, d) not in b or (bb, d) not in b:
                    continue
                for q in QUANTITIES:
                    diff = faithfulness_sign(d, q) * (area_under_curve(fr, b[bb, d][q]) - area_under_curve(fr, b[a, d][q]))
                    lo, hi = self._ci(diff[1:])
                    rows.append(dict(a=a, b=bb, direction=d, quantity=q, auc_diff=float(diff[0]), ci_low=lo, ci_high=hi,
                                     verdict=verdict(lo, hi, has_range, b["n"], testable=frozenset((a, bb)) not in identical),
                                     claimed=(a, bb) in CLAIMED_STEPS,
                                     n_sequences=b["n"], n_boot=self.n_boot))  # fmt: skip
        return pd.DataFrame(rows)

    # -- text and files ----------------------------------------------------------------------

    def protocol_text(self) -> str:
        p = self.protocol
        return (
            f"protocol: layers masked together = {p.get('masking_scope', '')} ({_span(p['layers'])}); "
            f"ranking = {p['ranking']}; sink (pos 0) removable = {p['allow_sink']}; "
            f"current token removable = {p['allow_current']}; metric mode = {p['mode']}; "
            f"k = {list(p['fractions'])}; scored = every prediction after the first {p['skip_prefix']} positions; "
            "no renormalisation of α; "
            f"{self.meta.get('n_sequences', len(self.clean))} sequences × {self.meta.get('seq_len', '?')} tokens"
        )

    def summary(self) -> dict:
        p = self.protocol
        return dict(
            protocol=dict(model=self.meta.get("model", "?"), layers=list(p["layers"]), masking_scope=p.get("masking_scope"),
                          ranking_scope=p["ranking"], allow_sink=p["allow_sink"], allow_current=p["allow_current"],
                          mode=p["mode"], fractions=list(p["fractions"]), skip_prefix=p["skip_prefix"],
                          n_sequences=int(len(self.clean)), seq_len=self.meta.get("seq_len"), corpus=self.meta.get("corpus"),
                          metrics=self.metrics, n_boot=self.n_boot, n_scored_tokens=int(self.clean.n_scored.sum())),
            clean_ppl=self.clean_ppl,
            range_check=self.range_check(),
            auc=self.auc().to_dict("records"),
            pairs=self.pairs().to_dict("records"),
            meta=self.meta,
        )  # fmt: skip

    def __str__(self) -> str:
        rc = self.range_check()
        lines = [self.protocol_text(), f"clean PPL {rc['clean_ppl']:.4f}"]
        if rc.get("random_delta_ppl_at_max_fraction") is not None:
            lines.append(f"range check: random ranking at k = {rc['max_fraction']}: ΔPPL {rc['random_delta_ppl_at_max_fraction']:+.4f} "
                         f"({100 * rc['random_delta_ppl_rel_at_max_fraction']:+.2f} %)"
                         + ("" if rc["has_range"] else f" < {100 * MIN_RANGE:.0f} %: NO RANGE, no claim decided"))  # fmt: skip
        if "sink_only_delta_ppl" in rc:
            lines.append(f"sink alone removed: ΔPPL {rc['sink_only_delta_ppl']:+.4f} ({100 * rc['sink_only_delta_ppl_rel']:+.2f} %)")
        table = self.auc().pivot_table(index="metric", columns=["direction", "quantity"], values="auc", sort=False)
        lines += ["AUC over k:", table.to_string(float_format=lambda v: f"{v:.4f}")]
        return "\n".join(lines)

    def save(self, out_dir) -> None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        # gzip without a timestamp: the same results give the same bytes (and stay small in git)
        self.per_sequence.to_csv(out / PER_SEQUENCE, index=False, compression=dict(method="gzip", mtime=0))
        (out / "per_sequence.csv").unlink(missing_ok=True)  # the uncompressed file of older versions
        self.clean.to_csv(out / "clean.csv", index=False)
        self.curves.to_csv(out / "curves.csv", index=False)
        self.auc().to_csv(out / "auc.csv", index=False)
        self.pairs().to_csv(out / "pairs.csv", index=False)
        (out / "summary.json").write_text(json.dumps(self.summary(), indent=2, default=float))

    @classmethod
    def load(cls, out_dir, n_boot: int | None = None) -> "FaithfulnessResult":
        """Read back what :meth:`save` wrote (``per_sequence.csv.gz``, ``clean.csv``, ``summary.json``)."""
        out = Path(out_dir)
        info = json.loads((out / "summary.json").read_text())
        p = info["protocol"]
        protocol = dict(layers=p["layers"], masking_scope=p.get("masking_scope"), ranking=p["ranking_scope"],
                        allow_sink=p["allow_sink"], allow_current=p["allow_current"], mode=p["mode"],
                        fractions=tuple(p["fractions"]), skip_prefix=p["skip_prefix"])  # fmt: skip
        return cls(
            protocol=protocol, per_sequence=pd.read_csv(per_sequence_path(out)), clean=pd.read_csv(out / "clean.csv"),
            meta=info.get("meta", {}), n_boot=n_boot or p.get("n_boot", 1000),
        )


PER_SEQUENCE = "per_sequence.csv.gz"  # each document's mean NLL under each mask


def per_sequence_path(out_dir) -> Path:
    """The per-document results in a folder: ``per_sequence.csv.gz``, or the uncompressed
    ``per_sequence.csv`` written by older versions (the path of the first when neither exists)."""
    out = Path(out_dir)
    old = out / "per_sequence.csv"
    return old if old.exists() and not (out / PER_SEQUENCE).exists() else out / PER_SEQUENCE


def same_ranking_by_construction(protocol: "Protocol | dict") -> bool:
    """Whether output-normalised attention ranks exactly like value-weighted attention.

    α‖ṽ‖/‖o_i‖ divides every term of a ranking group by one positive number when ‖o_i‖ is
    constant over the group: under ``row`` ranking in either mode (one head, one query), and
    under ``query`` / ``source`` ranking in ``inter`` mode (the layer output of one query).
    Only ``query`` / ``source`` ranking in ``intra`` mode divides each head by its own norm.
    """
    get = protocol.get if isinstance(protocol, dict) else lambda key: getattr(protocol, key)
    return get("ranking") == "row" or get("mode") == "inter"


def faithfulness_curves(
    model,
    tokens: Int[Tensor, "n pos"],
    protocol: Protocol = Protocol(),
    metrics: Sequence[str] | None = None,
    *,
    chunk_size: int = 12,
    seed: int = 0,
    progress: bool = True,
    n_boot: int = 1000,
    first_sequence: int = 0,
) -> FaithfulnessResult:
    """Comprehensiveness and sufficiency curves per metric over ``tokens`` (one row per document).

    Per document: one cached forward (the attention metrics and the clean NLL), the Value
    Zeroing forwards when asked (batched over source tokens), and the masked forwards, run
    ``chunk_size`` masks per batched forward (each batch row its own mask, every masked layer):
    2·n_k per distinct metric ranking, plus one with the sink alone removed. Metrics whose
    rankings are identical to an earlier metric's reuse its results instead of running the same
    masks again (``same_as`` in the rows): output-normalised reuses value-weighted whenever the
    two rank identically in exact arithmetic (:func:`same_ranking_by_construction`; float32
    rounding would otherwise reorder a few near-ties), other metrics when their rankings are
    equal element for element. Random
    rankings use seed ``seed + first_sequence + document index``. ``metrics``: names in
    :mod:`geolens.metrics` (None = every registered metric).

    >>> import geolens
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")  # 2 layers, 4 query heads sharing 2 kv heads
    >>> protocol = geolens.Protocol(fractions=(0.1, 0.5), skip_prefix=4)
    >>> res = geolens.faithfulness_curves(model, tiny_tokens(model, length=16), protocol,
    ...                                   metrics=["raw_attention", "contribution", "random"], progress=False, n_boot=50)
    >>> res.range_check()["has_range"], sorted(set(res.pairs().verdict))  # a random 2-layer model moves PPL < 1 %
    (False, ['no range'])
    """
    metrics = metric_names() if metrics is None else metrics
    check_metric_names(metrics)
    protocol.check_curve()
    if tokens.ndim != 2 or tokens.shape[1] < 3:
        raise ValueError(f"tokens must be [n_sequences, pos ≥ 3], got shape {tuple(tokens.shape)}")
    n_pos = tokens.shape[1]
    n_scored = n_pos - 1 - protocol.skip_prefix
    if n_scored < 1:
        raise ValueError(f"skip_prefix={protocol.skip_prefix} leaves no prediction to score in {n_pos} tokens")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be ≥ 1, got {chunk_size}")
    layers = protocol.resolved_layers(model)
    require_pattern_hooks(model, layers)
    n_heads = model.cfg.n_heads
    rows, clean_rows = [], []
    for s in tqdm(range(tokens.shape[0]), desc="faithfulness", disable=not progress):
        seq = tokens[s : s + 1]
        doc = first_sequence + s
        with torch.no_grad():
            logits, cache = model.run_with_cache(seq, names_filter=names_filter(model, layers))
        clean_nll = token_nll(logits, seq)[0, protocol.skip_prefix :]
        del logits
        scores = metric_scores(model, seq, protocol, metrics, seed=seed + doc, cache=cache)
        del cache
        ranks, alias = {}, {}
        if same_ranking_by_construction(protocol):  # e.g. output-normalised reuses value-weighted
            twins = {m: get_metric(m).same_ranking_as for m in metrics}
            alias.update({m: t for m, t in twins.items() if t is not None and t in metrics})
        for m in metrics:
            if m in alias:
                continue
            r = ranked_removals(scores[m], protocol)
            same = next((o for o, ro in ranks.items() if all(torch.equal(r[d][0], ro[d][0]) for d in DIRECTIONS)), None)
            if same is not None:
                alias[m] = same
            else:
                ranks[m] = r
        del scores
        jobs = [(m, d, k) for m in ranks for d in DIRECTIONS for k in protocol.fractions] + [("sink_only", None, None)]
        results: dict = {}
        for start in range(0, len(jobs), chunk_size):
            chunk = jobs[start : start + chunk_size]
            masks = []
            for m, d, k in chunk:
                mk = sink_only_mask(len(layers), n_pos) if m == "sink_only" else mask_from_ranks(*ranks[m][d], k)
                masks.append(mk.expand(len(layers), 1, n_heads, n_pos, n_pos))
            remove = torch.cat(masks, dim=1)
            nll = masked_token_nll(model, seq, remove, layers, chunk_size=len(chunk), n_scored=n_scored)
            removed = remove.flatten(2).sum(-1).sum(0)
            for (m, d, k), row_nll, r in zip(chunk, nll, removed):
                results[m, d, k] = (float(row_nll.double().mean()), int(r))
            del remove, masks
        clean_rows.append(dict(sequence=doc, nll=float(clean_nll.double().mean()), n_scored=int(clean_nll.numel()),
                               sink_nll=results["sink_only", None, None][0]))  # fmt: skip
        for m in metrics:
            src = alias.get(m, m)
            for d in DIRECTIONS:
                for k in protocol.fractions:
                    v, r = results[src, d, k]
                    rows.append(dict(sequence=doc, metric=m, direction=d, fraction=k, nll=v, n_removed=r, same_as=alias.get(m, "")))
    meta = dict(
        n_sequences=int(tokens.shape[0]), seq_len=int(n_pos), metrics=list(metrics), seed=seed,
        model=getattr(model.cfg, "model_name", "?"),
    )
    return FaithfulnessResult(
        protocol=protocol.to_dict(model), per_sequence=pd.DataFrame(rows), clean=pd.DataFrame(clean_rows),
        meta=meta, n_boot=n_boot,
    )


def claimed_order_holds(pairs: pd.DataFrame, direction: str = "comprehensiveness", quantity: str = "delta_ppl") -> dict:
    """Paper A's order raw < value-weighted < output-normalised < contribution, step by step.

    ``pairs`` is :meth:`FaithfulnessResult.pairs`. Each step "a < b" gets the verdict of its
    paired CI (``holds`` / ``reversed`` / ``tie``, or ``no range`` / ``too few documents``, or
    ``not testable`` for a step whose two metrics mask identically by construction); the order
    ``holds`` when every testable step's CI lies above 0 (a step that cannot differ under the
    protocol neither supports nor contradicts it); ``decided`` is False when any testable step
    could not be decided (no range, too few documents, a metric missing) or none is testable.
    """
    if direction not in DIRECTIONS or quantity not in QUANTITIES:
        raise ValueError(f"unknown direction/quantity {direction!r}/{quantity!r}")
    sub = pairs[(pairs.direction == direction) & (pairs.quantity == quantity)] if len(pairs) else pairs
    steps = {}
    for a, b in CLAIMED_STEPS:
        r = sub[(sub.a == a) & (sub.b == b)] if len(sub) else sub
        if len(r):
            row = r.iloc[0]
            steps[f"{a} < {b}"] = dict(verdict=row.verdict, auc_diff=float(row.auc_diff), ci=[float(row.ci_low), float(row.ci_high)])
    verdicts = [v["verdict"] for v in steps.values() if v["verdict"] != "not testable"]
    return dict(direction=direction, quantity=quantity, pairs={k: v["verdict"] for k, v in steps.items()}, steps=steps,
                holds=bool(verdicts) and all(v == "holds" for v in verdicts),
                decided=len(steps) == len(CLAIMED_STEPS) and bool(verdicts) and all(v in ("holds", "tie", "reversed") for v in verdicts))  # fmt: skip
