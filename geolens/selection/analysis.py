"""Corpus-level token-selection geometry with the authors' protocol (docs/method.md §5; Mudarisov et al. 2026).

:class:`SelectionAnalysis` (a :class:`geolens.streaming.CorpusAnalysis`, run by
:func:`geolens.runner.run_corpus`) scores, for every window of the corpus, the final query (or
every query) of all layers × query heads, for N in ``sizes``, under several conditions
(:class:`Condition`: space, distance, ranking, sink handling). For each condition it keeps:

- per-document (window) means of P_N, R_N, F_N for the top-N selection and for ``n_random``
  random rankings nested across N, averaged repeats → heads and layers → one row per document
  (the document-bootstrap CIs of :func:`geolens.selection.baseline.paired_comparison` need those
  rows; nothing else of a batch is kept), and the per-document share of (layer, head, query)
  cases where top-N beats the mean of the random draws;
- per-layer means of F_N (top-N and random), ``[layer, N]`` :class:`Moments`;
- counts of bound violations (docs/method.md §5 properties, expected 0) over every top-N case (and the
  random cases with ``random_bounds=True``; off by default because GInv is the costliest part);
- the share of cases whose top-N set contains the sink.

For the main condition (first in the list) it also keeps per-(layer, head) means of R_N and F_N
and the pooled correlation between R_N and two sink similarities of the same (window, layer,
head): the signed sink alignment mean_{j>0} cos(u_0, u_j) and cos(y_0, s_N) (the sink's
contribution against the selected aggregate).

Sliding-window layers (:mod:`geolens.visibility`): every query is scored over its true visible set
T_t (the last W keys), so a query t ≥ W has no sink among its sources; it still counts in the
scores, but it is left out of the sink-in-top-N share and of the cos(y_0, s_N) correlation, and
the sink alignment uses the keys 1 … W − 1 that share a window with the sink.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from geolens import geometry
from geolens.adapter import PATTERN, VALUE, get_attention_layer, hook_name, model_mode, sliding_window
from geolens.selection.baseline import (
    document_means,
    document_means_ci,
    paired_comparison,
    random_rankings,
    win_tie_loss,
)
from geolens.selection.bounds import bound_violations
from geolens.selection.scores import Separation, _norms, aggregate, layer_contributions, selection_scores_multi
from geolens.streaming import Accumulator, CorpusAnalysis, Moments, Sum
from geolens.validation import check_choice
from geolens.visibility import sink_window_keys

METRICS = ("precision", "recall", "f")


@dataclass(frozen=True)
class Condition:
    """One scoring condition: ``space`` value|projected, ``distance`` euclidean|cosine,
    ``by`` attention|norm, ``sink`` keep|exclude|force, ``random`` whether to score random sets.

    >>> Condition("value", "cosine", "attention", "exclude").name
    'value/cosine/attention/sink-exclude'
    """

    space: str = "value"
    distance: str = "euclidean"
    by: str = "attention"
    sink: str = "keep"
    random: bool = True

    @property
    def name(self) -> str:
        return f"{self.space}/{self.distance}/{self.by}/sink-{self.sink}"


DEFAULT_CONDITIONS = (
    Condition("value", "euclidean", "attention", "keep"),
    Condition("value", "cosine", "attention", "keep"),
    Condition("value", "euclidean", "attention", "exclude"),
    Condition("value", "cosine", "attention", "exclude"),
    Condition("value", "euclidean", "attention", "force", random=False),
    Condition("value", "cosine", "attention", "force", random=False),
    Condition("value", "euclidean", "norm", "keep", random=False),
    Condition("value", "cosine", "norm", "keep", random=False),
    Condition("projected", "euclidean", "attention", "keep", random=False),
    Condition("projected", "cosine", "attention", "keep", random=False),
)


class Rows(Accumulator):
    """Per-document rows (a list of ``[n, ...]`` tensors); merging concatenates."""

    def __init__(self):
        self.rows: list[Tensor] = []

    def update(self, x: Tensor) -> "Rows":
        self.rows.append(x.detach().to("cpu", torch.float64).clone())
        return self

    def merge(self, other: "Rows") -> "Rows":
        self.rows += [r.clone() for r in other.rows]
        return self

    def value(self) -> Tensor:
        return torch.cat(self.rows) if self.rows else torch.zeros(0)

    def state_dict(self) -> dict[str, Any]:
        return {"rows": [r.clone() for r in self.rows]}

    def load_state_dict(self, state: dict[str, Any]) -> "Rows":
        self.rows = [r.clone() for r in state["rows"]]
        return self


class _CorrSums(Accumulator):
    """Sums n, Σx, Σy, Σx², Σy², Σxy per trailing shape, for a pooled Pearson correlation."""

    def __init__(self, shape: tuple[int, ...]):
        self.s = torch.zeros((6,) + shape, dtype=torch.float64)

    def update(self, x: Tensor, y: Tensor, dim: int | tuple[int, ...] = 0) -> "_CorrSums":
        x, y = torch.broadcast_tensors(x.to(torch.float64).cpu(), y.to(torch.float64).cpu())
        ok = ~(torch.isnan(x) | torch.isnan(y))
        x, y = torch.where(ok, x, 0), torch.where(ok, y, 0)
        for k, t in enumerate((ok.to(torch.float64), x, y, x * x, y * y, x * y)):
            self.s[k] += t.sum(dim)
        return self

    def merge(self, other: "_CorrSums") -> "_CorrSums":
        self.s += other.s
        return self

    def pearson(self) -> Tensor:
        n, sx, sy, sxx, syy, sxy = self.s
        cov = sxy / n - sx * sy / n**2
        vx, vy = sxx / n - (sx / n) ** 2, syy / n - (sy / n) ** 2
        den = (vx * vy).clamp_min(0).sqrt()
        return torch.where(den > 1e-12, cov / den.clamp_min(1e-300), torch.full_like(cov, float("nan")))


class SelectionAnalysis(CorpusAnalysis):
    """Streams the authors' protocol over a corpus; see the module docstring.

    >>> from geolens.runner import run_corpus
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")
    >>> analysis = SelectionAnalysis.for_model(model, 16, conditions=[Condition("value", "cosine")], n_random=2)
    >>> _ = run_corpus(model, tiny_tokens(model, length=16), [analysis], progress=False)
    >>> res = analysis.result(n_boot=50)  # tables: comparison, scores, by_layer, heads, ...
    >>> res["comparison"].N.tolist(), res["main_condition"]
    ([1, 2, 4, 8], 'value/cosine/attention/sink-keep')
    """

    def __init__(
        self,
        n_layers: int,
        n_heads: int,
        sizes: Sequence[int],
        *,
        conditions: Sequence[Condition] = DEFAULT_CONDITIONS,
        n_random: int = 16,
        queries: str = "final",
        seed: int = 0,
        random_bounds: bool = False,
    ):
        check_choice(queries, ("final", "all"), name="queries")
        if not conditions:
            raise ValueError("at least one condition is needed")
        self.n_layers, self.n_heads = n_layers, n_heads
        self.sizes = [int(n) for n in sizes]
        self.conditions = list(conditions)
        self.n_random = n_random
        self.queries = queries
        self.seed = seed
        self.random_bounds = random_bounds
        self.n_docs_seen = 0
        self.model_mode = ""
        nN = len(self.sizes)
        self.doc = {}
        self.layer_f = {}
        self.violations = {}
        self.sink_in_top = {}
        for c in self.conditions:
            kinds = ["top"] + (["random"] if c.random else [])
            for kind in kinds:
                for m in METRICS:
                    self.doc[f"{c.name}|{kind}|{m}"] = Rows()
                self.layer_f[f"{c.name}|{kind}"] = Moments((n_layers, nN))
                self.violations[f"{c.name}|{kind}"] = Sum((4,))
            if c.random:
                self.doc[f"{c.name}|win"] = Rows()
                self.doc[f"{c.name}|tie"] = Rows()
            self.sink_in_top[c.name] = Moments((nN,))
        self.head_recall = Moments((n_layers, n_heads, nN))
        self.head_f = Moments((n_layers, n_heads, nN))
        self.head_sink_alignment = Moments((n_layers, n_heads))
        self.corr_alignment = _CorrSums((nN,))
        self.corr_sink_aggregate = _CorrSums((nN,))

    @classmethod
    def for_model(cls, model, seq_len: int, *, max_n: int = 256, **kwargs) -> "SelectionAnalysis":
        from geolens.selection.scores import power_of_two_sizes

        return cls(model.cfg.n_layers, model.cfg.n_heads, power_of_two_sizes(seq_len, cap=max_n), **kwargs)

    # --- CorpusAnalysis protocol -------------------------------------------------------
    def hook_names(self, model) -> list[str]:
        return [hook_name(l, n) for l in range(self.n_layers) for n in (PATTERN, VALUE)]

    def state_dict(self) -> dict[str, Any]:
        out = {}
        for k, v in vars(self).items():
            if isinstance(v, dict) and v and isinstance(next(iter(v.values())), Accumulator):
                out[k] = {"__accs__": {kk: vv.state_dict() for kk, vv in v.items()}}
            elif isinstance(v, Accumulator):
                out[k] = {"__acc__": v.state_dict()}
            else:
                out[k] = v
        return out

    def load_state_dict(self, state: dict[str, Any]) -> "SelectionAnalysis":
        for k, v in state.items():
            if isinstance(v, dict) and "__accs__" in v:
                for kk, vv in v["__accs__"].items():
                    getattr(self, k)[kk].load_state_dict(vv)
            elif isinstance(v, dict) and "__acc__" in v:
                getattr(self, k).load_state_dict(v["__acc__"])
            else:
                setattr(self, k, v)
        return self

    def merge(self, other: "SelectionAnalysis") -> "SelectionAnalysis":
        if other.sizes != self.sizes or other.conditions != self.conditions or other.n_layers != self.n_layers:
            raise ValueError("cannot merge selection analyses with different sizes, conditions or shapes")
        for name in ("doc", "layer_f", "violations", "sink_in_top"):
            for k, acc in getattr(self, name).items():
                acc.merge(getattr(other, name)[k])
        for name in ("head_recall", "head_f", "head_sink_alignment", "corr_alignment", "corr_sink_aggregate"):
            getattr(self, name).merge(getattr(other, name))
        self.n_docs_seen += other.n_docs_seen
        self.model_mode = self.model_mode or other.model_mode
        return self

    def update(self, model, cache, tokens) -> None:
        self.model_mode = model_mode(model)
        B = tokens.shape[0]
        nN = len(self.sizes)
        # per condition and kind: [layer, batch, head, query, N] stacks, built layer by layer
        per_layer: dict[str, list[Separation]] = {}
        wins: dict[str, list[Tensor]] = {}
        ties: dict[str, list[Tensor]] = {}
        for l in range(self.n_layers):
            layer = get_attention_layer(model, cache, l, dtype=torch.float64)
            n_q = layer.pattern.shape[2]
            q_slice = slice(n_q - 1, n_q) if self.queries == "final" else slice(0, n_q)
            window = sliding_window(model, l)
            y, visible = layer_contributions(layer, q_slice, window=window)  # [b,h,q,k,d], [q,k]
            pattern = layer.pattern[:, :, q_slice]
            grams = {"value": None, "projected": geometry.gram(layer.W_O)[:, None]}
            rand = self.draw_rankings(tokens, l, visible.expand(pattern.shape)).to(pattern.dtype)
            groups: dict[tuple, list[Condition]] = {}
            for c in self.conditions:
                groups.setdefault((c.space, c.by, c.sink), []).append(c)
            for (space, by, sink), conds in groups.items():
                gram = grams[space]
                ranking = pattern if by == "attention" else _norms(y, gram)
                kinds = tuple(dict.fromkeys(c.distance for c in conds))
                tops = selection_scores_multi(y, ranking, visible, self.sizes, distances=kinds, gram=gram, sink=sink)
                rand_kinds = tuple(dict.fromkeys(c.distance for c in conds if c.random))
                rnds = (
                    selection_scores_multi(
                        y,
                        rand,
                        visible,
                        self.sizes,
                        distances=rand_kinds,
                        gram=gram,
                        sink=sink,
                        bounds=self.random_bounds,
                    )
                    if rand_kinds
                    else {}
                )
                sink_sel = self._sink_selected(ranking, visible, sink).reshape(-1, nN)
                for c in conds:
                    top = tops[c.distance]
                    per_layer.setdefault(f"{c.name}|top", []).append(top)
                    self.sink_in_top[c.name].update(sink_sel, dim=0)
                    if c.random:
                        rnd = rnds[c.distance]
                        rnd_mean = Separation(**{k: getattr(rnd, k).mean(0) for k in Separation.FIELDS})
                        self._count_violations(f"{c.name}|random", rnd)
                        per_layer.setdefault(f"{c.name}|random", []).append(rnd_mean)
                        w, t, _ = win_tie_loss(top.f, rnd_mean.f)
                        valid = ~torch.isnan(top.f)
                        wins.setdefault(c.name, []).append(torch.where(valid, w.double(), torch.nan))
                        ties.setdefault(c.name, []).append(torch.where(valid, t.double(), torch.nan))
                    self._count_violations(f"{c.name}|top", top)
                    if c == self.conditions[0]:
                        self._head_stats(l, layer, y, ranking, visible, top, window)
        for key, seps in per_layer.items():
            for m in METRICS:
                x = torch.stack([getattr(s, m) for s in seps])  # [layer, b, h, q, N]
                self.doc[f"{key}|{m}"].update(torch.stack([document_means(x[..., k], 1) for k in range(nN)], -1))
            f = torch.stack([s.f for s in seps])  # [L, b, h, q, N]
            self.layer_f[key].update(f.permute(1, 2, 3, 0, 4).reshape(-1, self.n_layers, nN), dim=0)
        for name in wins:
            for store, src in ((self.doc[f"{name}|win"], wins[name]), (self.doc[f"{name}|tie"], ties[name])):
                x = torch.stack(src)
                store.update(torch.stack([document_means(x[..., k], 1) for k in range(nN)], -1))
        self.n_docs_seen += B

    # --- helpers -----------------------------------------------------------------------
    def draw_rankings(self, tokens: Tensor, layer: int, visible: Tensor) -> Tensor:
        """``[n_random, batch, head, query, key]`` random rankings of one layer.

        Each window's draws come from a generator seeded by (seed, layer, the window's token
        ids), so they do not depend on batch order or sharding (merges and resumed runs give
        the same numbers)."""
        rows = []
        for b in range(tokens.shape[0]):
            key = zlib.crc32(tokens[b].detach().cpu().numpy().astype(np.int64).tobytes())
            gen = torch.Generator().manual_seed((self.seed * 1_000_003 + layer * 7_919 + key) % (2**63))
            rows.append(random_rankings(visible[b], self.n_random, generator=gen))
        return torch.stack(rows, dim=1)

    def _sink_selected(self, ranking: Tensor, visible: Tensor, sink: str) -> Tensor:
        """[b, h, q, N]: 1 if the sink is in the top-N set (ties by index: rank = #{r_j > r_0});
        NaN for a query that cannot see the sink (sliding window), which is left out of the share."""
        shape = ranking.shape[:-1] + (len(self.sizes),)
        if sink == "exclude":
            out = torch.zeros(shape, dtype=torch.float64)
        elif sink == "force":
            out = torch.ones(shape, dtype=torch.float64)
        else:
            r = ranking.masked_fill(~visible, float("-inf"))
            ahead = (r > r[..., :1]).sum(-1, keepdim=True)
            out = (ahead < torch.tensor(self.sizes, device=r.device)).to(torch.float64).cpu()
        seen = torch.broadcast_to(visible[..., 0], ranking.shape[:-1]).cpu()
        return out.masked_fill(~seen[..., None], float("nan"))

    def _count_violations(self, key: str, sep: Separation) -> None:
        v = bound_violations(sep)
        self.violations[key].update(
            torch.tensor([v["n_cases"], v["precision_bound"], v["recall_bound"], v["equivalence"]], dtype=torch.float64)
        )

    def _head_stats(
        self, l: int, layer, y: Tensor, ranking: Tensor, visible: Tensor, top: Separation, window: int | None = None
    ) -> None:
        nN = len(self.sizes)
        h = top.f.shape[1]
        for acc, x in ((self.head_recall, top.recall), (self.head_f, top.f)):
            _merge_slice(acc, l, Moments((h, nN)).update(x.permute(0, 2, 1, 3).reshape(-1, h, nN), dim=0))
        u = layer.v  # [b, k, h, d], value space
        u0 = u[:, :1]
        cos = geometry.gram_cosine(u0, u[:, 1:], eps=1e-12)  # [b, k-1, h]
        tail = sink_window_keys(u.shape[1], window, device=u.device)[1:]  # keys sharing a window with the sink
        align = cos[:, tail].mean(1)  # [b, h]: signed sink alignment of the window
        _merge_slice(self.head_sink_alignment, l, Moments((h,)).update(align, dim=0))
        self.corr_alignment.update(
            align[:, :, None, None].expand_as(top.recall).reshape(-1, nN), top.recall.reshape(-1, nN), dim=0
        )
        # cos(y_0, s_N): the sink's contribution against the top-N aggregate of the main condition
        sink = self.conditions[0].sink
        y0 = y[..., 0, :]
        sims = []
        for n in self.sizes:
            s = aggregate(y, ranking, visible, n, sink)
            sims.append(geometry.gram_cosine(y0, s, eps=1e-12))
        sim = torch.where(torch.isnan(top.recall), torch.nan, torch.stack(sims, -1))  # [b, h, q, N]
        sim = sim.masked_fill(~visible[..., 0][None, None, :, None], float("nan"))  # no sink among the sources
        self.corr_sink_aggregate.update(sim.reshape(-1, nN), top.recall.reshape(-1, nN), dim=0)

    # --- results -----------------------------------------------------------------------
    def per_document(self, key: str) -> np.ndarray:
        return self.doc[key].value().numpy()

    def result(self, *, n_boot: int = 2000, seed: int = 0) -> dict:
        """Tables (pandas): ``comparison`` (per condition and N: top-N vs random, CIs, win
        share), ``scores`` (per condition, kind, metric and N: mean with CI), ``by_layer``,
        ``violations``, ``sink_in_top``, ``heads`` (main condition, per head and N) and
        ``correlations`` (pooled Pearson r of R_N with the sink similarities, and across heads)."""
        comparison, scores, by_layer, viol, sink_rows = [], [], [], [], []
        for c in self.conditions:
            kinds = ["top"] + (["random"] if c.random else [])
            if c.random:
                t = paired_comparison(
                    self.per_document(f"{c.name}|top|f"),
                    self.per_document(f"{c.name}|random|f"),
                    self.per_document(f"{c.name}|win"),
                    self.sizes,
                    n_boot=n_boot,
                    seed=seed,
                )
                t.insert(0, "condition", c.name)
                t["tie_share"] = np.nanmean(self.per_document(f"{c.name}|tie"), axis=0)
                comparison.append(t)
            for kind in kinds:
                for m in METRICS:
                    mean, lo, hi = document_means_ci(
                        self.per_document(f"{c.name}|{kind}|{m}"), n_boot=n_boot, seed=seed
                    )
                    for k, n in enumerate(self.sizes):
                        scores.append(
                            dict(
                                condition=c.name,
                                space=c.space,
                                distance=c.distance,
                                by=c.by,
                                sink=c.sink,
                                kind=kind,
                                metric=m,
                                N=n,
                                mean=mean[k],
                                lo=lo[k],
                                hi=hi[k],
                            )
                        )
                lf = self.layer_f[f"{c.name}|{kind}"].mean
                for l in range(self.n_layers):
                    for k, n in enumerate(self.sizes):
                        by_layer.append(dict(condition=c.name, kind=kind, layer=l, N=n, f=float(lf[l, k])))
                v = self.violations[f"{c.name}|{kind}"].total.tolist()
                viol.append(
                    dict(
                        condition=c.name,
                        kind=kind,
                        n_cases=int(v[0]),
                        precision_bound=int(v[1]),
                        recall_bound=int(v[2]),
                        equivalence=int(v[3]),
                    )
                )
            for k, n in enumerate(self.sizes):
                sink_rows.append(dict(condition=c.name, N=n, sink_in_top_share=float(self.sink_in_top[c.name].mean[k])))
        heads = []
        for l in range(self.n_layers):
            for h in range(self.n_heads):
                for k, n in enumerate(self.sizes):
                    heads.append(
                        dict(
                            layer=l,
                            head=h,
                            N=n,
                            recall=float(self.head_recall.mean[l, h, k]),
                            f=float(self.head_f.mean[l, h, k]),
                            sink_alignment=float(self.head_sink_alignment.mean[l, h]),
                        )
                    )
        heads = pd.DataFrame(heads)
        corr = []
        r_align = self.corr_alignment.pearson()
        r_agg = self.corr_sink_aggregate.pearson()
        for k, n in enumerate(self.sizes):
            hk = heads[heads.N == n]
            corr.append(
                dict(
                    N=n,
                    pooled_r_sink_alignment_recall=float(r_align[k]),
                    pooled_r_sink_aggregate_recall=float(r_agg[k]),
                    across_heads_pearson=float(hk[["sink_alignment", "recall"]].corr().iloc[0, 1]),
                    across_heads_spearman=float(hk[["sink_alignment", "recall"]].corr(method="spearman").iloc[0, 1]),
                )
            )
        return {
            "comparison": pd.concat(comparison, ignore_index=True) if comparison else pd.DataFrame(),
            "scores": pd.DataFrame(scores),
            "by_layer": pd.DataFrame(by_layer),
            "violations": pd.DataFrame(viol),
            "sink_in_top": pd.DataFrame(sink_rows),
            "heads": heads,
            "correlations": pd.DataFrame(corr),
            "main_condition": self.conditions[0].name,
            "n_documents": int(self.doc[f"{self.conditions[0].name}|top|f"].value().shape[0]),
            "sizes": self.sizes,
            "queries": self.queries,
            "n_random": self.n_random,
            "model_mode": self.model_mode,
        }


def _merge_slice(acc: Moments, l: int, part: Moments) -> None:
    """Merge ``part`` into ``acc[l]`` (Moments over a leading layer axis updated layer by layer)."""
    sub = Moments(tuple(acc.count.shape[1:]))
    sub.count, sub.mean, sub.m2 = acc.count[l].clone(), acc.mean[l].clone(), acc.m2[l].clone()
    sub.merge(part)
    acc.count[l], acc.mean[l], acc.m2[l] = sub.count, sub.mean, sub.m2
