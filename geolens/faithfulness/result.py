"""What the faithfulness curves yield: per-document results, their statistics, and their files.

:class:`FaithfulnessResult` holds each document's mean NLL under every mask and computes every
statistic from them with one set of bootstrap resamples of documents (corpus-level curves, AUCs,
paired differences with their verdicts, the range check); :meth:`~FaithfulnessResult.save` and
:meth:`~FaithfulnessResult.load` write and read a run's folder, each file written atomically
(:func:`geolens.checkpoint.atomic_write_bytes`); :func:`resume_state` gives the documents an
interrupted run already saved (multiple choice under these masks runs block by block, resumable
in the same way: :func:`geolens.faithfulness.mc_curves.questions_in_blocks`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from geolens.checkpoint import atomic_write_bytes
from geolens.faithfulness.preregistered import write_table
from geolens.faithfulness.protocol import (
    CLAIMED_STEPS,
    DIRECTIONS,
    MIN_RANGE,
    PAIRS,
    QUANTITIES,
    faithfulness_sign,
    layer_span,
    same_ranking_by_construction,
    verdict,
)
from geolens.resume import ResumeRefused
from geolens.stats import bootstrap_indices, percentile_ci, resample_means


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
                rows.append(
                    dict(
                        metric=key[0],
                        direction=key[1],
                        quantity=q,
                        auc=float(a[0]),
                        ci_low=lo,
                        ci_high=hi,
                        n_sequences=b["n"],
                    )
                )
        return pd.DataFrame(rows)

    def range_check(self) -> dict:
        """ΔPPL of the random ranking at the largest k (comprehensiveness) and of the sink alone."""
        b = self._resampled()
        clean = float(np.exp(b["clean_nll"][0]))
        out = dict(clean_ppl=clean, threshold_rel=MIN_RANGE, max_fraction=float(self.protocol["fractions"][-1]))
        if ("random", "comprehensiveness") in b:
            d = b["random", "comprehensiveness"]["delta_ppl"][:, -1]
            lo, hi = self._ci(d[1:])
            out.update(
                random_delta_ppl_at_max_fraction=float(d[0]),
                random_delta_ppl_ci=[lo, hi],
                random_delta_ppl_rel_at_max_fraction=float(d[0]) / clean,
            )
            out["has_range"] = bool(abs(float(d[0])) / clean >= MIN_RANGE)
        else:
            out.update(
                random_delta_ppl_at_max_fraction=None, random_delta_ppl_rel_at_max_fraction=None, has_range=False
            )
            out["note"] = "the random ranking was not run: no range check, no verdict"
        if "sink_delta_ppl" in b:
            s = b["sink_delta_ppl"]
            lo, hi = self._ci(s[1:])
            out.update(
                sink_only_delta_ppl=float(s[0]),
                sink_only_delta_ppl_ci=[lo, hi],
                sink_only_delta_ppl_rel=float(s[0]) / clean,
            )
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
        identical = (
            {frozenset(("value_weighted", "output_normalized"))}
            if same_ranking_by_construction(self.protocol)
            else set()
        )
        rows = []
        for a, bb in pairs:
            for d in DIRECTIONS:
                if (a, d) not in b or (bb, d) not in b:
                    continue
                for q in QUANTITIES:
                    diff = faithfulness_sign(d, q) * (
                        area_under_curve(fr, b[bb, d][q]) - area_under_curve(fr, b[a, d][q])
                    )
                    lo, hi = self._ci(diff[1:])
                    rows.append(
                        dict(
                            a=a,
                            b=bb,
                            direction=d,
                            quantity=q,
                            auc_diff=float(diff[0]),
                            ci_low=lo,
                            ci_high=hi,
                            verdict=verdict(lo, hi, has_range, b["n"], testable=frozenset((a, bb)) not in identical),
                            claimed=(a, bb) in CLAIMED_STEPS,
                            n_sequences=b["n"],
                            n_boot=self.n_boot,
                        )
                    )
        return pd.DataFrame(rows)

    # -- text and files ----------------------------------------------------------------------

    def protocol_text(self) -> str:
        p = self.protocol
        return (
            f"protocol: layers masked together = {p.get('masking_scope', '')} ({layer_span(p['layers'])}); "
            f"ranking = {p['ranking']}; sink (pos 0) removable = {p['allow_sink']}; "
            f"current token removable = {p['allow_current']}; metric mode = {p['mode']}; "
            f"k = {list(p['fractions'])}; scored = every prediction after the first {p['skip_prefix']} positions; "
            "no renormalisation of α; "
            f"{self.meta.get('n_sequences', len(self.clean))} sequences × {self.meta.get('seq_len', '?')} tokens"
        )

    def summary(self) -> dict:
        p = self.protocol
        return dict(
            protocol=dict(
                model=self.meta.get("model", "?"),
                layers=list(p["layers"]),
                masking_scope=p.get("masking_scope"),
                ranking_scope=p["ranking"],
                allow_sink=p["allow_sink"],
                allow_current=p["allow_current"],
                mode=p["mode"],
                fractions=list(p["fractions"]),
                skip_prefix=p["skip_prefix"],
                n_sequences=int(len(self.clean)),
                seq_len=self.meta.get("seq_len"),
                corpus=self.meta.get("corpus"),
                metrics=self.metrics,
                n_boot=self.n_boot,
                n_scored_tokens=int(self.clean.n_scored.sum()),
            ),
            clean_ppl=self.clean_ppl,
            range_check=self.range_check(),
            auc=self.auc().to_dict("records"),
            pairs=self.pairs().to_dict("records"),
            meta=self.meta,
        )

    def __str__(self) -> str:
        rc = self.range_check()
        lines = [self.protocol_text(), f"clean PPL {rc['clean_ppl']:.4f}"]
        if rc.get("random_delta_ppl_at_max_fraction") is not None:
            lines.append(
                f"range check: random ranking at k = {rc['max_fraction']}: ΔPPL {rc['random_delta_ppl_at_max_fraction']:+.4f} "
                f"({100 * rc['random_delta_ppl_rel_at_max_fraction']:+.2f} %)"
                + ("" if rc["has_range"] else f" < {100 * MIN_RANGE:.0f} %: NO RANGE, no claim decided")
            )
        if "sink_only_delta_ppl" in rc:
            lines.append(
                f"sink alone removed: ΔPPL {rc['sink_only_delta_ppl']:+.4f} ({100 * rc['sink_only_delta_ppl_rel']:+.2f} %)"
            )
        table = self.auc().pivot_table(index="metric", columns=["direction", "quantity"], values="auc", sort=False)
        lines += ["AUC over k:", table.to_string(float_format=lambda v: f"{v:.4f}")]
        return "\n".join(lines)

    def save(self, out_dir) -> None:
        """Write the folder that :meth:`load` and :func:`resume_state` read, each file atomically
        (``per_sequence.csv.gz`` gzipped without a timestamp: the same results give the same bytes)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        write_table(self.per_sequence, out / PER_SEQUENCE)
        (out / "per_sequence.csv").unlink(missing_ok=True)  # the uncompressed file of older versions
        write_table(self.clean, out / "clean.csv")
        write_table(self.curves, out / "curves.csv")
        write_table(self.auc(), out / "auc.csv")
        write_table(self.pairs(), out / "pairs.csv")
        atomic_write_bytes(out / "summary.json", json.dumps(self.summary(), indent=2, default=float).encode())

    @classmethod
    def load(cls, out_dir, n_boot: int | None = None) -> "FaithfulnessResult":
        """Read back what :meth:`save` wrote (``per_sequence.csv.gz``, ``clean.csv``, ``summary.json``)."""
        out = Path(out_dir)
        info = json.loads((out / "summary.json").read_text())
        p = info["protocol"]
        protocol = dict(
            layers=p["layers"],
            masking_scope=p.get("masking_scope"),
            ranking=p["ranking_scope"],
            allow_sink=p["allow_sink"],
            allow_current=p["allow_current"],
            mode=p["mode"],
            fractions=tuple(p["fractions"]),
            skip_prefix=p["skip_prefix"],
        )
        return cls(
            protocol=protocol,
            per_sequence=pd.read_csv(per_sequence_path(out)),
            clean=pd.read_csv(out / "clean.csv"),
            meta=info.get("meta", {}),
            n_boot=n_boot or p.get("n_boot", 1000),
        )


PER_SEQUENCE = "per_sequence.csv.gz"  # each document's mean NLL under each mask


ResumeError = ResumeRefused  # saved results that cannot be resumed (one line): geolens.resume's


def per_sequence_path(out_dir) -> Path:
    """The per-document results in a folder: ``per_sequence.csv.gz``, or the uncompressed
    ``per_sequence.csv`` written by older versions (the path of the first when neither exists)."""
    out = Path(out_dir)
    old = out / "per_sequence.csv"
    return old if old.exists() and not (out / PER_SEQUENCE).exists() else out / PER_SEQUENCE


def resume_state(out_dir, protocol: dict) -> tuple[pd.DataFrame, pd.DataFrame] | tuple[None, None]:
    """``(per_sequence, clean)`` that a run saved in ``out_dir`` (:meth:`FaithfulnessResult.save`)
    under the same ``protocol`` (:meth:`~geolens.faithfulness.protocol.MaskingConfig.to_dict` of the
    model), to continue after its documents; ``(None, None)`` when the folder holds no saved run.
    :class:`ResumeError` when the saved run used another protocol."""
    out = Path(out_dir)
    if not per_sequence_path(out).exists() or not (out / "summary.json").exists():
        return None, None
    p = json.loads((out / "summary.json").read_text())["protocol"]
    same = (
        p["layers"] == protocol["layers"]
        and p["ranking_scope"] == protocol["ranking"]
        and p["allow_sink"] == protocol["allow_sink"]
        and p["allow_current"] == protocol["allow_current"]
        and p["mode"] == protocol["mode"]
        and list(p["fractions"]) == list(protocol["fractions"])
        and p["skip_prefix"] == protocol["skip_prefix"]
    )
    if not same:
        raise ResumeError(f"--resume: {out}/summary.json was made with another protocol; use a new --out")
    per, clean = pd.read_csv(per_sequence_path(out), keep_default_na=False), pd.read_csv(out / "clean.csv")
    per["fraction"] = per["fraction"].astype(float)
    return per, clean


def claimed_order_holds(pairs: pd.DataFrame, direction: str = "comprehensiveness", quantity: str = "delta_ppl") -> dict:
    """The order of Cunningham & Muça Cirone (2026), raw < value-weighted < output-normalised < contribution, step by step.

    ``pairs`` is :meth:`FaithfulnessResult.pairs`. Each step "a < b" gets the verdict of its
    paired CI (``holds`` / ``reversed`` / ``tie``, or ``no range`` / ``too few documents``, or
    ``not testable`` for a step whose two metrics mask identically by construction); the order
    ``holds`` when every testable step's CI lies above 0 (a step that cannot differ under the
    protocol neither supports nor contradicts it); ``decided`` is False when any testable step
    could not be decided (no range, too few documents, a metric missing) or none is testable.

    >>> verdicts = dict(zip(CLAIMED_STEPS, ["holds", "holds", "reversed"]))
    >>> pairs = pd.DataFrame([dict(a=a, b=b, direction="comprehensiveness", quantity="delta_ppl", verdict=v,
    ...                            auc_diff=0.0, ci_low=0.0, ci_high=0.0) for (a, b), v in verdicts.items()])
    >>> r = claimed_order_holds(pairs)
    >>> r["holds"], r["decided"], r["pairs"]["output_normalized < contribution"]
    (False, True, 'reversed')
    """
    if direction not in DIRECTIONS or quantity not in QUANTITIES:
        raise ValueError(f"unknown direction/quantity {direction!r}/{quantity!r}")
    sub = pairs[(pairs.direction == direction) & (pairs.quantity == quantity)] if len(pairs) else pairs
    steps = {}
    for a, b in CLAIMED_STEPS:
        r = sub[(sub.a == a) & (sub.b == b)] if len(sub) else sub
        if len(r):
            row = r.iloc[0]
            steps[f"{a} < {b}"] = dict(
                verdict=row.verdict, auc_diff=float(row.auc_diff), ci=[float(row.ci_low), float(row.ci_high)]
            )
    verdicts = [v["verdict"] for v in steps.values() if v["verdict"] != "not testable"]
    return dict(
        direction=direction,
        quantity=quantity,
        pairs={k: v["verdict"] for k, v in steps.items()},
        steps=steps,
        holds=bool(verdicts) and all(v == "holds" for v in verdicts),
        decided=len(steps) == len(CLAIMED_STEPS)
        and bool(verdicts)
        and all(v in ("holds", "tie", "reversed") for v in verdicts),
    )
