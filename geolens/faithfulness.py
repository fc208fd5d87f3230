"""Faithfulness of attribution metrics by causal masking (docs/method.md §3, paper A §2.3 and §3.1).

For a metric s_ij^{(l,h)} (an attribution of query i to source j in head h of layer l), the
masking intervention of :mod:`geolens.interventions.masking` removes the terms α_ij ṽ_j of the
chosen sources from the attention sum (α_ij set to 0 in ``hook_pattern``, no renormalisation),
per (layer, head, query), in every layer of the protocol at once.

- **Comprehensiveness** at fraction k: remove the top-k of each row's eligible sources by the
  metric. A more faithful metric hurts the model more: larger ΔPPL, more negative Δ log-prob.
- **Sufficiency** at fraction k: remove the bottom-k. A more faithful metric hurts it less.

ΔPPL of a sequence = exp(mean NLL masked) − exp(mean NLL clean) over its next-token predictions;
Δ log-prob = mean log p(target) masked − clean. Curves are means over sequences at
k ∈ {0.1, …, 0.9}; the area under each curve is the trapezoid rule over those k (units: the
quantity × fraction), with percentile bootstrap confidence intervals over sequences.

Metrics (docs/method.md §2 and §3.1): ``raw_attention`` α_ij, ``value_weighted``
α_ij‖ṽ_j‖, ``output_normalized`` α_ij‖ṽ_j‖/‖o_i‖, ``contribution`` c_ij (intra-head by default:
the masks are per head), ``value_zeroing`` (Mohebbi et al. 2023, :func:`value_zeroing`; one score
per layer, shared by the heads of that layer) and ``random`` (uniform scores: the floor).
Signed metrics are ranked by their signed value.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from geolens.adapter import VALUE, get_attention_layer, hook_name, names_filter
from geolens.contributions import _metrics_from_layer
from geolens.interventions.base import applied
from geolens.interventions.masking import branch_hook, masked_token_nll, random_scores, removal_mask, token_nll

ATTENTION_METRICS = ("raw_attention", "value_weighted", "output_normalized", "contribution")
ALL_METRICS = ATTENTION_METRICS + ("value_zeroing", "random")
FRACTIONS = tuple(round(0.1 * k, 1) for k in range(1, 10))
DIRECTIONS = ("comprehensiveness", "sufficiency")


@dataclass(frozen=True)
class Protocol:
    """How sources are masked; printed with every result.

    Attributes:
        layers: the layers masked together in one forward (None = all layers).
        allow_sink: whether position 0 (the sink) may be removed.
        allow_current: whether the query's own token (j = i) may be removed.
        mode: which output norm ‖o_i‖ the output-normalised metric and c_ij use ("intra": the
            head's, matching per-head masks; "inter": the layer's).
        fractions: the removal fractions k.
        n_scored: score ΔPPL / Δ log-prob on the last ``n_scored`` next-token predictions of
            each sequence only (None: all); masks still apply to every query.
    """

    layers: tuple[int, ...] | None = None
    allow_sink: bool = False
    allow_current: bool = False
    mode: str = "intra"
    fractions: tuple[float, ...] = FRACTIONS
    n_scored: int | None = None

    def resolved_layers(self, model) -> tuple[int, ...]:
        n = model.cfg.n_layers
        layers = tuple(range(n)) if self.layers is None else tuple(int(l) % n for l in self.layers)
        if not layers:
            raise ValueError("the protocol masks no layer")
        return tuple(sorted(set(layers)))

    def describe(self, model=None) -> str:
        layers = self.resolved_layers(model) if model is not None else self.layers
        span = "all" if layers is None else _span(layers)
        return (
            f"protocol: layers masked together = {span}; sink (pos 0) removable = {self.allow_sink}; "
            f"current token removable = {self.allow_current}; metric mode = {self.mode}; "
            f"k = {list(self.fractions)}; scored predictions = {self.n_scored or 'all'}; no renormalisation of α"
        )

    def to_dict(self, model=None) -> dict:
        d = asdict(self)
        if model is not None:
            d["layers"] = list(self.resolved_layers(model))
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
) -> Float[Tensor, "layer batch query key"]:
    """Value Zeroing scores VZ_ij^{(l)} = 1 − cos(x̃_i^{(l)}, x̃_i^{(l), ¬j}) (Mohebbi et al. 2023).

    x̃_i^{(l)} is the output of layer l (``blocks.{l}.hook_resid_post``) at position i, and
    x̃_i^{(l), ¬j} the same output when layer l is rerun with the value vector of token j zeroed
    in every head (``hook_v``; with grouped-query attention, in every kv head, hence in every
    query head), everything before layer l unchanged. Future sources (j > i) score 0. Mohebbi et
    al. normalise each row to sum 1 afterwards; that does not change the per-row ranking, so the
    raw cosine distances are returned.

    Runs through the model with hooks, batched over source tokens, all ``layers`` in one forward
    per chunk: row 0 is the clean run; row 1 + r zeroes source j_r. At each scored layer's
    ``hook_resid_pre`` the perturbed rows are reset to the clean row, so each layer is "rerun"
    on its clean input, and its ``hook_resid_post`` is compared with row 0. The forward stops
    after the last scored layer.
    """
    if tokens.ndim != 2:
        raise ValueError(f"tokens must be [batch, pos], got shape {tuple(tokens.shape)}")
    n_layers = model.cfg.n_layers
    layers = sorted({int(l) % n_layers for l in (range(n_layers) if layers is None else layers)})
    n_pos = tokens.shape[1]
    chunk = n_pos if chunk_size is None else int(chunk_size)
    if chunk < 1:
        raise ValueError("chunk_size must be a positive integer")
    scores = torch.zeros(len(layers), tokens.shape[0], n_pos, n_pos)
    layer_index = {l: n for n, l in enumerate(layers)}
    for b in range(tokens.shape[0]):
        seq = tokens[b : b + 1]
        for start in range(0, n_pos, chunk):
            sources = torch.arange(start, min(start + chunk, n_pos))
            rows = 1 + len(sources)
            captured: dict[int, Tensor] = {}

            def reset(resid: Tensor, hook) -> Tensor:
                return resid[:1].expand(rows, *resid.shape[1:]).contiguous()

            def zero_value(v: Tensor, hook, sources=sources) -> Tensor:
                v = v.clone()
                v[torch.arange(1, rows, device=v.device), sources.to(v.device)] = 0.0
                return v

            def capture(resid: Tensor, hook) -> None:
                captured[int(hook.name.split(".")[1])] = resid.detach()

            hooks = [branch_hook(layers[0], rows)]
            for l in layers:
                if l != layers[0]:
                    hooks.append((hook_name(l, "hook_resid_pre"), reset))
                hooks.append((hook_name(l, VALUE), zero_value))
                hooks.append((hook_name(l, "hook_resid_post"), capture))
            with torch.no_grad(), applied(model, hooks):
                model(seq, return_type=None, stop_at_layer=layers[-1] + 1)
            for l, resid in captured.items():
                resid = resid.float()
                cos = torch.nn.functional.cosine_similarity(resid[1:], resid[:1], dim=-1)  # [source, query]
                scores[layer_index[l], b][:, sources] = (1.0 - cos).T.cpu()
    causal = torch.ones(n_pos, n_pos, dtype=torch.bool).tril()
    return scores * causal


# ---------------------------------------------------------------------------------------------
# Metric tensors and masks


def metric_scores(
    model,
    tokens: Int[Tensor, "1 pos"],
    protocol: Protocol,
    metrics: Sequence[str] = ALL_METRICS,
    *,
    seed: int = 0,
    value_zeroing_chunk: int | None = None,
    cache=None,
) -> dict[str, Float[Tensor, "layer 1 head query key"]]:
    """Each metric's scores on the protocol's layers for one sequence (head axis 1 for VZ).

    ``cache`` (a ``run_with_cache`` of ``tokens`` holding pattern and v of those layers) saves
    a forward when the caller already has one.
    """
    unknown = sorted(set(metrics) - set(ALL_METRICS))
    if unknown:
        raise ValueError(f"unknown metrics {unknown}; choose from {list(ALL_METRICS)}")
    layers = protocol.resolved_layers(model)
    out: dict[str, Tensor] = {}
    wanted = [m for m in metrics if m in ATTENTION_METRICS]
    if wanted:
        if cache is None:
            with torch.no_grad():
                _, cache = model.run_with_cache(tokens, names_filter=names_filter(model, layers))
        per_layer = {m: [] for m in wanted}
        for l in layers:
            view = get_attention_layer(model, cache, l)
            alpha, relative, _, contribution, value_norm = _metrics_from_layer(view, protocol.mode, 0.0)
            values = {
                "raw_attention": alpha,
                "value_weighted": alpha * value_norm,
                "output_normalized": alpha * relative,
                "contribution": contribution,
            }
            for m in wanted:
                per_layer[m].append(values[m])
        del cache
        for m in wanted:
            out[m] = torch.stack(per_layer[m])
    if "value_zeroing" in metrics:
        out["value_zeroing"] = value_zeroing(model, tokens, layers, chunk_size=value_zeroing_chunk)[:, :, None]
    if "random" in metrics:
        n = tokens.shape[1]
        out["random"] = random_scores((len(layers), 1, model.cfg.n_heads, n, n), seed=seed)
    return {m: out[m] for m in metrics}


def curve_masks(
    scores: Float[Tensor, "layer 1 head query key"], protocol: Protocol
) -> torch.Tensor:
    """Masks ``[layer, 2·n_k, head, query, key]``: comprehensiveness for each k, then sufficiency."""
    masks = [
        removal_mask(scores, k, largest=largest, allow_sink=protocol.allow_sink, allow_current=protocol.allow_current)
        for largest in (True, False)
        for k in protocol.fractions
    ]
    return torch.cat(masks, dim=1)


# ---------------------------------------------------------------------------------------------
# Curves and areas


def area_under_curve(fractions: Sequence[float], values) -> np.ndarray:
    """Trapezoid-rule area over the fractions; ``values`` ``[..., n_k]``."""
    x = np.asarray(fractions, dtype=np.float64)
    y = np.asarray(values, dtype=np.float64)
    return ((y[..., 1:] + y[..., :-1]) * np.diff(x) / 2.0).sum(-1)


def bootstrap_auc(
    fractions: Sequence[float], per_sequence, *, n_boot: int = 1000, seed: int = 0, level: float = 0.95
) -> tuple[float, float, float]:
    """(AUC of the mean curve, CI low, CI high) by resampling sequences (rows of ``per_sequence``)."""
    y = np.asarray(per_sequence, dtype=np.float64)
    if y.ndim != 2 or y.shape[1] != len(fractions):
        raise ValueError(f"per_sequence must be [n_sequences, {len(fractions)}], got {y.shape}")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, y.shape[0], size=(n_boot, y.shape[0]))
    boot = area_under_curve(fractions, y[idx].mean(1))
    a = (1.0 - level) / 2.0
    return float(area_under_curve(fractions, y.mean(0))), float(np.quantile(boot, a)), float(np.quantile(boot, 1 - a))


@dataclass
class FaithfulnessResult:
    """Per-sequence curves, mean curves and AUC tables, with the protocol that produced them."""

    protocol: dict
    per_sequence: pd.DataFrame  # sequence, metric, direction, fraction, delta_ppl, delta_logprob, ...
    clean: pd.DataFrame  # sequence, ppl, mean_logprob
    meta: dict = field(default_factory=dict)
    n_boot: int = 1000

    @property
    def curves(self) -> pd.DataFrame:
        g = self.per_sequence.groupby(["metric", "direction", "fraction"], sort=False)
        out = g[["delta_ppl", "delta_logprob"]].agg(["mean", "sem"])
        out.columns = [f"{a}_{b}" for a, b in out.columns]
        return out.reset_index()

    def auc(self, n_boot: int | None = None) -> pd.DataFrame:
        rows = []
        fr = list(self.protocol["fractions"])
        for (metric, direction), df in self.per_sequence.groupby(["metric", "direction"], sort=False):
            for quantity in ("delta_ppl", "delta_logprob"):
                wide = df.pivot(index="sequence", columns="fraction", values=quantity)[fr].to_numpy()
                value, lo, hi = bootstrap_auc(fr, wide, n_boot=n_boot or self.n_boot)
                rows.append(dict(metric=metric, direction=direction, quantity=quantity, auc=value, ci_low=lo, ci_high=hi))
        return pd.DataFrame(rows)

    def protocol_text(self) -> str:
        p = self.protocol
        return (
            f"protocol: layers masked together = {_span(p['layers'])}; sink (pos 0) removable = {p['allow_sink']}; "
            f"current token removable = {p['allow_current']}; metric mode = {p['mode']}; "
            f"k = {list(p['fractions'])}; scored predictions = {p.get('n_scored') or 'all'} per sequence; "
            "no renormalisation of α; "
            f"{self.meta.get('n_sequences', '?')} sequences × {self.meta.get('seq_len', '?')} tokens"
        )

    def __str__(self) -> str:
        table = self.auc().pivot_table(index="metric", columns=["direction", "quantity"], values="auc", sort=False)
        return self.protocol_text() + "\nAUC over k:\n" + table.to_string(float_format=lambda v: f"{v:.4f}")

    def save(self, out_dir) -> None:
        from pathlib import Path

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.per_sequence.to_csv(out / "per_sequence.csv", index=False)
        self.curves.to_csv(out / "curves.csv", index=False)
        self.auc().to_csv(out / "auc.csv", index=False)
        self.clean.to_csv(out / "clean.csv", index=False)
        (out / "protocol.json").write_text(json.dumps({"protocol": self.protocol, "meta": self.meta}, indent=2))

    @classmethod
    def load(cls, out_dir, n_boot: int = 1000) -> "FaithfulnessResult":
        """Read back what :meth:`save` wrote (``per_sequence.csv``, ``clean.csv``, ``protocol.json``)."""
        from pathlib import Path

        out = Path(out_dir)
        info = json.loads((out / "protocol.json").read_text())
        protocol = dict(info["protocol"])
        protocol["fractions"] = tuple(protocol["fractions"])
        return cls(
            protocol=protocol, per_sequence=pd.read_csv(out / "per_sequence.csv"), clean=pd.read_csv(out / "clean.csv"),
            meta=info.get("meta", {}), n_boot=n_boot,
        )


def faithfulness_curves(
    model,
    tokens: Int[Tensor, "n pos"],
    protocol: Protocol = Protocol(),
    metrics: Sequence[str] = ALL_METRICS,
    *,
    chunk_size: int = 18,
    seed: int = 0,
    progress: bool = True,
    n_boot: int = 1000,
) -> FaithfulnessResult:
    """Comprehensiveness and sufficiency curves (ΔPPL, Δ log-prob) per metric over ``tokens``.

    Each sequence costs one cached forward (the attention metrics), the Value Zeroing forwards
    (batched over source tokens) and ⌈2·n_k·n_metrics / chunk_size⌉ masked forwards that run
    only from the first masked layer on. Random rankings use seed ``seed + sequence index``.
    """
    if tokens.ndim != 2 or tokens.shape[1] < 3:
        raise ValueError(f"tokens must be [n_sequences, pos ≥ 3], got shape {tuple(tokens.shape)}")
    layers = protocol.resolved_layers(model)
    rows, clean_rows = [], []
    n_k = len(protocol.fractions)
    for s in tqdm(range(tokens.shape[0]), desc="faithfulness", disable=not progress):
        seq = tokens[s : s + 1]
        with torch.no_grad():
            logits, cache = model.run_with_cache(seq, names_filter=names_filter(model, layers))
        clean_nll = token_nll(logits, seq)[0]
        if protocol.n_scored is not None:
            clean_nll = clean_nll[-protocol.n_scored :]
        del logits
        clean_ppl = float(torch.exp(clean_nll.mean()))
        clean_lp = float(-clean_nll.mean())
        clean_rows.append(dict(sequence=s, ppl=clean_ppl, mean_logprob=clean_lp))
        scores = metric_scores(model, seq, protocol, metrics, seed=seed + s, cache=cache)
        del cache
        n_heads = model.cfg.n_heads  # VZ masks have head axis 1: broadcast before batching
        masks = torch.cat([curve_masks(scores[m], protocol).expand(-1, -1, n_heads, -1, -1) for m in metrics], dim=1)
        nll = masked_token_nll(model, seq, masks, layers, chunk_size=chunk_size, n_scored=protocol.n_scored)
        ppl = torch.exp(nll.mean(-1))
        lp = -nll.mean(-1)
        removed = masks.flatten(2).sum(-1).sum(0)  # per mask, over layers/heads/queries
        for mi, metric in enumerate(metrics):
            for di, direction in enumerate(DIRECTIONS):
                for ki, k in enumerate(protocol.fractions):
                    r = mi * 2 * n_k + di * n_k + ki
                    rows.append(
                        dict(
                            sequence=s, metric=metric, direction=direction, fraction=k,
                            ppl=float(ppl[r]), delta_ppl=float(ppl[r]) - clean_ppl,
                            delta_logprob=float(lp[r]) - clean_lp, n_removed=int(removed[r]),
                        )
                    )  # fmt: skip
    meta = dict(
        n_sequences=int(tokens.shape[0]), seq_len=int(tokens.shape[1]), metrics=list(metrics), seed=seed,
        model=getattr(model.cfg, "model_name", "?"),
    )
    return FaithfulnessResult(
        protocol=protocol.to_dict(model), per_sequence=pd.DataFrame(rows), clean=pd.DataFrame(clean_rows),
        meta=meta, n_boot=n_boot,
    )


def paired_auc_differences(
    result: "FaithfulnessResult", reference: str = "raw_attention", *, n_boot: int = 1000, seed: int = 0, level: float = 0.95
) -> pd.DataFrame:
    """AUC(metric) − AUC(reference) per direction and quantity, with a paired bootstrap CI.

    The same resampled sequences are used for both metrics, so the interval measures the
    difference itself (much narrower than the two separate AUC intervals when the per-sequence
    curves are correlated, as they are here: the clean perplexity varies a lot between windows).
    """
    fr = list(result.protocol["fractions"])
    df = result.per_sequence
    rows = []
    rng = np.random.default_rng(seed)
    n_seq = df.sequence.nunique()
    idx = rng.integers(0, n_seq, size=(n_boot, n_seq))
    a = (1.0 - level) / 2.0
    for direction in DIRECTIONS:
        for quantity in ("delta_ppl", "delta_logprob"):
            sub = df[df.direction == direction]

            def wide(metric):
                return sub[sub.metric == metric].pivot(index="sequence", columns="fraction", values=quantity)[fr].to_numpy()

            if reference not in set(sub.metric):
                continue
            ref = wide(reference)
            for metric in sub.metric.unique():
                if metric == reference:
                    continue
                d = wide(metric) - ref
                boot = area_under_curve(fr, d[idx].mean(1))
                rows.append(dict(metric=metric, reference=reference, direction=direction, quantity=quantity,
                                 auc_difference=float(area_under_curve(fr, d.mean(0))),
                                 ci_low=float(np.quantile(boot, a)), ci_high=float(np.quantile(boot, 1 - a))))  # fmt: skip
    return pd.DataFrame(rows)


def claimed_order_holds(
    auc: pd.DataFrame, direction: str = "comprehensiveness", quantity: str = "delta_ppl", *, rtol: float = 1e-9
) -> dict:
    """Whether paper A's order raw < value-weighted < output-normalised < contribution holds.

    For comprehensiveness a more faithful metric has a larger ΔPPL AUC; for sufficiency a smaller
    one (so the order is checked on −AUC). Δ log-prob flips the sign again. Each adjacent pair is
    reported as ``"holds"``, ``"tie"`` (equal AUCs: with per-row rankings, α‖ṽ‖ and α‖ṽ‖/‖o_i‖
    rank the sources of a row identically, since ‖o_i‖ is constant along the row) or
    ``"reversed"``; ``holds`` is True only when every pair holds strictly.
    """
    order = ["raw_attention", "value_weighted", "output_normalized", "contribution"]
    sub = auc[(auc.direction == direction) & (auc.quantity == quantity)].set_index("metric")["auc"]
    sign = 1.0 if direction == "comprehensiveness" else -1.0
    if quantity == "delta_logprob":
        sign = -sign
    present = [m for m in order if m in sub.index]
    faith = [sign * float(sub[m]) for m in present]

    def relation(x: float, y: float) -> str:
        if abs(x - y) <= rtol * max(abs(x), abs(y), 1e-300):
            return "tie"
        return "holds" if x < y else "reversed"

    pairs = {f"{a} < {b}": relation(x, y) for a, b, x, y in zip(present, present[1:], faith, faith[1:])}
    return dict(direction=direction, quantity=quantity, holds=all(v == "holds" for v in pairs.values()), pairs=pairs)
