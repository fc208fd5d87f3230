"""Sink value scaling in one call: :func:`scale_sink_values` and its result :class:`SinkScaling`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from geolens.claims import counted
from geolens.intervene._common import _Edit, _model, _texts
from geolens.interventions.sink_values import scale_sink_value
from geolens.stats import verdict


@dataclass(repr=False)
class SinkScaling(_Edit):
    """What :func:`scale_sink_values` measured: v_0 ← λ v_0 against the clean model.

    Attributes:
        lam: λ.
        layers, kv_heads, query_heads: the edited layers, the kv heads whose v_0 is scaled and the
            query heads that read them (all heads of a kv group: grouped-query attention).
        clean_logits, edited_logits: ``[n, pos, vocab]`` (texts of one length) or a list of
            such tensors (one per length); None when nothing was measured.
        summary: one row per λ (λ = 1 is the clean model): ``loss`` (nats), ``ppl``,
            ``delta_loss``, ``delta_ppl``, and the mean cone cosine and output norm of the
            low-norm heads and of the other edited heads.
        per_layer: one row per (λ, edited layer): ``cos_cone_low_norm``, ``cos_cone_other``
            (mean cosine of the heads' outputs with the semantic cone), ``out_norm_low_norm``,
            ``out_norm_other``, ``n_low_norm``.
        drift: the whole :class:`geolens.sinks.DriftResult` (per head and λ).
        n_texts: how many texts (or token rows) were measured.

    >>> import geolens
    >>> from geolens.testing import tiny_bridge
    >>> s = geolens.intervene.scale_sink_values(tiny_bridge("gqa"), ["the cat sat", "a dog ran"], lam=0.0)
    >>> s.per_text.shape, s.interval()[3] in ("holds", "reversed", "tie")
    ((2, 4), True)
    """

    model: object
    lam: float
    layers: tuple[int, ...]
    kv_heads: tuple[int, ...]
    query_heads: tuple[int, ...]
    fwd_hooks: list
    drift: object = None
    n_texts: int = 0
    order: list = field(default_factory=list)  # the call's index of each row of drift.row_nll

    @property
    def measured(self) -> bool:
        return self.drift is not None

    @property
    def description(self) -> str:
        edit = f"v_0 ← {self.lam:g}·v_0 in layers {list(self.layers)}, kv heads {list(self.kv_heads)}"
        if not self.measured:
            return edit + " (not measured)"
        row = self.summary.set_index("lambda").loc[self.lam]
        return (
            f"{edit}; {counted(self.n_texts, 'text')}: loss {row.loss - row.delta_loss:.4f} → {row.loss:.4f} nats "
            f"(Δ {row.delta_loss:+.4f}), perplexity Δ {row.delta_ppl:+.3f}"
        )

    @property
    def summary(self) -> pd.DataFrame:
        self._need()
        s = self.drift.summary.rename(columns={"nll": "loss"})
        clean = float(s.loc[s["lambda"] == 1.0, "loss"].iloc[0])
        s.insert(3, "delta_loss", s["loss"] - clean)
        keep = ["lambda", "loss", "ppl", "delta_loss", "delta_ppl"]
        keep += [f"{c}_{g}" for c in ("cos_cone", "out_norm") for g in ("low_norm", "other")]
        return s[keep].reset_index(drop=True)

    @property
    def per_layer(self) -> pd.DataFrame:
        self._need()
        h = self.drift.heads
        rows = []
        for (lam, layer), g in h.groupby(["lambda", "layer"], sort=True):
            low, other = g[g.low_norm], g[~g.low_norm]
            rows.append(
                {
                    "lambda": float(lam),
                    "layer": int(layer),
                    "cos_cone_low_norm": float(low.cos_cone.mean()) if len(low) else float("nan"),
                    "cos_cone_other": float(other.cos_cone.mean()) if len(other) else float("nan"),
                    "out_norm_low_norm": float(low.out_norm.mean()) if len(low) else float("nan"),
                    "out_norm_other": float(other.out_norm.mean()) if len(other) else float("nan"),
                    "n_low_norm": int(len(low)),
                }
            )
        return pd.DataFrame(rows)

    @property
    def per_text(self) -> pd.DataFrame:
        """One row per text (in the call's order): ``text``, ``clean_loss``, ``edited_loss``,
        ``delta_loss`` (mean next-token NLL, nats). :attr:`summary` pools the tokens of all texts;
        this table and :meth:`interval` weigh each text the same."""
        self._need()
        rows = np.argsort(self.order)
        clean, edited = self.drift.row_nll[1.0][rows], self.drift.row_nll[self.lam][rows]
        return pd.DataFrame(
            {"text": range(len(rows)), "clean_loss": clean, "edited_loss": edited, "delta_loss": edited - clean}
        )

    def interval(self, level: float = 0.95, *, n_boot: int = 2000, seed: int = 0) -> tuple[float, float, float, str]:
        """(estimate, low, high, verdict) of the mean Δloss over texts, by a percentile bootstrap
        over texts (:func:`geolens.stats.mean_ci`); ``"holds"``: the edit raises the loss,
        ``"reversed"``: it lowers it, ``"tie"``: the interval holds 0; ``"not testable"`` at λ = 1
        (no edit). One text gives a zero-width interval: measure several."""
        from geolens.stats import mean_ci

        d = self.per_text["delta_loss"].to_numpy()
        est, lo, hi = mean_ci(d, n_boot=n_boot, level=level, seed=seed)
        return float(est), float(lo), float(hi), verdict(lo, hi, testable=self.lam != 1.0)

    @property
    def clean_logits(self):
        return self._logits(1.0)

    @property
    def edited_logits(self):
        return self._logits(self.lam)

    def _logits(self, lam: float):
        self._need()
        if self.drift.logits is None:
            raise ValueError("the logits were not kept: call scale_sink_values with keep_logits=True")
        return self.drift.logits[lam]

    def plot(self):
        """The drift figure (:func:`geolens.viz.sinks.drift_plot`): cone cosine and relative output
        norm of low-norm against other heads, and ΔPPL, against λ, naming the edited layers."""
        from geolens.viz.sinks import drift_plot

        self._need()
        return drift_plot(self.drift)

    def _need(self):
        if not self.measured:
            raise ValueError("nothing was measured: call scale_sink_values with texts")


def scale_sink_values(
    model,
    texts=None,
    lam: float = 0.0,
    *,
    layers=None,
    heads=None,
    kv_heads=None,
    lambdas: Sequence[float] = (),
    low_norm_quantile: float = 0.25,
    batch_size: int = 8,
    progress: bool = False,
    keep_logits: bool = True,
) -> SinkScaling:
    """Scale the sink value, v_0 ← λ v_0, and measure the loss change and the semantic drift.

    The edit multiplies ``blocks.{l}.attn.hook_v[:, 0]`` by λ in ``layers`` (default: all) and
    heads (``heads``: query heads covering whole kv groups, or ``kv_heads``; default all), so
    every head output loses (λ = 0) or rescales the term α_i0 ṽ_0 without renormalising the
    attention (:func:`geolens.interventions.sink_values.scale_sink_value`). Measured on ``texts``:
    the clean and edited logits, the loss and perplexity change, and per edited layer the mean
    cosine between the low-norm heads' outputs and their semantic cone (the mean direction of the
    non-sink projected values a query sees) against the other heads' (:mod:`geolens.sinks.drift`;
    low-norm: the bottom ``low_norm_quantile`` of relative output norm at λ = 1). ``lambdas``
    adds more λ to the drift curve (the plot).

    Whether λ = 0 raises perplexity depends on which layers are edited: it is measured here, not
    assumed (docs/results.md).

    Args:
        model: a loaded model or a :func:`geolens.load_model` name.
        texts: a text, a list of texts, or token ids ``[n, seq]`` (BOS first); None: nothing is
            measured, the result only applies the edit as a context manager.
        lam: λ (finite); 1 changes nothing.
        keep_logits: keep the clean and edited logits (``[n, pos, vocab]`` each; False saves the
            memory on many texts or a large vocabulary).

    >>> import geolens
    >>> from geolens.testing import tiny_bridge
    >>> model = tiny_bridge("gqa")
    >>> s = geolens.intervene.scale_sink_values(model, "the cat sat on the mat", lam=0.0, layers=[1])
    >>> s.layers, s.query_heads, list(s.summary["lambda"])
    ((1,), (0, 1, 2, 3), [0.0, 1.0])
    >>> with s:  # the same edit on your own forward pass; hooks removed on exit
    ...     logits = model(model.to_tokens("the cat sat on the mat"))
    >>> bool(torch.allclose(logits, s.edited_logits, atol=1e-5))
    True
    """
    from geolens.sinks.drift import semantic_drift

    model = _model(model)
    lam = float(lam)
    edit = scale_sink_value(model, lam, layers=layers, heads=heads, kv_heads=kv_heads)
    result = SinkScaling(model, lam, edit.layers, edit.kv_heads, edit.query_heads, edit.fwd_hooks)
    if texts is None:
        return result
    t = _texts(model, texts)
    with torch.no_grad():
        result.drift = semantic_drift(
            model,
            t.groups,
            lambdas=(lam, *lambdas),
            layers=edit.layers,
            heads=heads,
            kv_heads=edit.kv_heads if heads is None else None,
            low_norm_quantile=low_norm_quantile,
            batch_size=batch_size,
            progress=progress,
            keep_logits=keep_logits,
        )
    result.n_texts = t.n
    result.order = [i for index in t.index for i in index]
    return result
