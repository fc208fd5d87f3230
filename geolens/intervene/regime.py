"""Regime ablation in one call: :func:`ablate_regime` (one regime of the Retriever / Mixer /
Reset taxonomy against as many random heads) and its result :class:`RegimeAblation`."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from geolens.claims import counted
from geolens.intervene._common import Head, _Edit, _model, _Texts, _texts
from geolens.intervene.heads import _means, _nll_per_condition
from geolens.interventions.ablation import AblationMode, head_ablation_hooks
from geolens.stats import control_difference_samples, percentile_ci, verdict

Regime = Literal["reset", "mixer", "retriever"]
REGIME_NAMES = {"reset": "Reset", "mixer": "Mixer", "retriever": "Retriever"}


@dataclass(repr=False)
class RegimeAblation(_Edit):
    """What :func:`ablate_regime` measured: one regime's heads ablated against random heads.

    Attributes:
        regime: ``"Reset"``, ``"Mixer"`` or ``"Retriever"``; ``heads``: its ``(layer, head)`` pairs.
        taxonomy: the :class:`geolens.taxonomy.TaxonomyResult` the regimes come from.
        clean_loss ``[text]``, regime_loss ``[text]``, random_loss ``[draw, text]``: mean
            next-token NLL (nats); ``random_heads``: each draw's heads (as many as ``heads``,
            uniformly among all the model's heads).
        difference: regime Δloss − random Δloss (mean over texts and draws) with its bootstrap
            interval ``(estimate, low, high)`` at ``level`` and the verdict (``"holds"``: the
            regime hurts more than random heads; ``"reversed"``: less; ``"tie"``).

    >>> import geolens
    >>> from geolens.testing import tiny_bridge
    >>> r = geolens.intervene.ablate_regime(tiny_bridge("gqa"), "the cat sat on the mat", "reset", n_random=3)
    >>> list(r.summary.condition), r.summary.n_heads.tolist()
    (['Reset', 'random draw 0', 'random draw 1', 'random draw 2'], [8, 8, 8, 8])
    """

    model: object
    regime: str
    heads: list
    how: str
    fwd_hooks: list
    taxonomy: object = None
    clean_loss: np.ndarray | None = None
    regime_loss: np.ndarray | None = None
    random_loss: np.ndarray | None = None
    random_heads: list = field(default_factory=list)
    level: float = 0.95
    n_boot: int = 2000
    seed: int = 0
    means_from: str | None = None

    @property
    def measured(self) -> bool:
        return self.clean_loss is not None

    @property
    def delta_loss(self) -> float:
        """The regime's Δloss, mean over texts (nats per token)."""
        return float(np.mean(self.regime_loss - self.clean_loss))

    @property
    def random_delta_loss(self) -> np.ndarray:
        """Each draw's Δloss, mean over texts ``[draw]`` (nats per token)."""
        return (self.random_loss - self.clean_loss[None]).mean(-1)

    @cached_property
    def difference_samples(self) -> np.ndarray:
        """The bootstrap distribution ``[n_boot]`` of regime Δloss − random Δloss behind
        :attr:`difference` (texts and draws resampled together; seeded)."""
        return control_difference_samples(
            self.regime_loss - self.clean_loss,
            self.random_loss - self.clean_loss[None],
            n_boot=self.n_boot,
            seed=self.seed,
        )

    @property
    def testable(self) -> bool:
        """False when every random draw is the regime's own head set (they cannot differ)."""
        return any(sorted(d) != sorted(self.heads) for d in self.random_heads)

    @cached_property
    def difference(self) -> tuple[float, float, float, str]:
        """(estimate, low, high, verdict) of regime Δloss − random Δloss; the bootstrap resamples
        texts and draws together (two-stage), so the interval covers both the choice of texts and
        the luck of the draws; with one text it covers the draws only. When every draw is the
        regime's own head set (a regime of all heads), the two cannot differ by construction: the
        verdict is ``"not testable"``."""
        estimate = float(
            (self.regime_loss - self.clean_loss).mean() - (self.random_loss - self.clean_loss[None]).mean()
        )
        lo, hi = percentile_ci(self.difference_samples, self.level)
        return estimate, float(lo), float(hi), verdict(lo, hi, testable=self.testable)

    @property
    def description(self) -> str:
        what = f"{counted(len(self.heads), self.regime + ' head')} {self.how}-ablated"
        if not self.measured:
            return what + " (not measured)"
        est, lo, hi, v = self.difference
        r = self.random_delta_loss
        return (
            f"{what}; {counted(len(self.clean_loss), 'text')}: Δloss {self.delta_loss:+.4f} nats against "
            f"{r.mean():+.4f} for {len(r)} random draws of {len(self.heads)} heads; difference {est:+.4f} "
            f"[{lo:+.4f}, {hi:+.4f}] ({self.level:.0%} interval): {v}"
        )

    @property
    def summary(self) -> pd.DataFrame:
        """One row per condition: ``condition`` (the regime, then each random draw), ``n_heads``,
        ``delta_loss`` (mean over texts, nats per token)."""
        rows = [{"condition": self.regime, "n_heads": len(self.heads), "delta_loss": self.delta_loss}]
        rows += [
            {"condition": f"random draw {k}", "n_heads": len(self.heads), "delta_loss": float(d)}
            for k, d in enumerate(self.random_delta_loss)
        ]
        return pd.DataFrame(rows)

    def plot(self):
        """The random draws' Δloss (dots) against the regime's (a line), with the interval of
        the difference in the title."""
        from geolens.viz.common import PlotView, new_figure

        r = self.random_delta_loss
        est, lo, hi, v = self.difference
        fig = new_figure(figsize=(6, 2.8))
        ax = fig.subplots()
        jitter = np.random.default_rng(0).uniform(-0.15, 0.15, len(r))
        ax.scatter(r, jitter, color="tab:gray", s=18, label=f"random heads ({counted(len(r), 'draw')})")
        ax.axvline(self.delta_loss, color="tab:red", lw=2, label=f"{self.regime} heads")
        ax.axvline(float(r.mean()), color="k", lw=1, ls="--", label="random, mean")
        ax.set_yticks([])
        ax.set_ylim(-0.6, 0.6)
        ax.set_xlabel(f"Δ loss when {counted(len(self.heads), 'head')} are {self.how}-ablated (nats per token)")
        ax.set_title(
            f"{self.regime} − random: {est:+.3f} [{lo:+.3f}, {hi:+.3f}] ({self.level:.0%} interval, "
            f"{counted(len(self.clean_loss), 'text')}): {v}",
            fontsize=8,
        )
        ax.legend(fontsize=7, loc="upper left")
        fig.tight_layout()
        return PlotView(fig, title="regime ablation", data={"summary": self.summary})


def regime_heads(taxonomy, regime: str) -> list[Head]:
    """The ``(layer, head)`` pairs of ``regime`` in a :func:`geolens.head_taxonomy` result.

    >>> import pandas as pd
    >>> from types import SimpleNamespace
    >>> tax = SimpleNamespace(table=pd.DataFrame({"layer": [0, 0, 1], "head": [0, 1, 0], "regime": ["Reset", "Mixer", "Reset"]}))
    >>> regime_heads(tax, "reset")
    [(0, 0), (1, 0)]
    """
    name = _regime_name(regime)
    table = getattr(taxonomy, "table", taxonomy)
    if not isinstance(table, pd.DataFrame) or not {"layer", "head", "regime"} <= set(table.columns):
        raise TypeError("taxonomy must be a geolens.head_taxonomy result (or its .table: layer, head, regime)")
    rows = table[table["regime"] == name]
    return sorted((int(l), int(h)) for l, h in zip(rows["layer"], rows["head"]))


def _regime_name(regime: str) -> str:
    key = str(regime).lower()
    if key not in REGIME_NAMES:
        close = difflib.get_close_matches(key, list(REGIME_NAMES), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"regime must be one of {', '.join(REGIME_NAMES)}, got {regime!r}{hint}")
    return REGIME_NAMES[key]


def _taxonomy(model, texts: _Texts, batch_size: int):
    from geolens.runner import run_corpus
    from geolens.taxonomy import TaxonomyAnalysis

    analysis = TaxonomyAnalysis.for_model(model)
    for g in texts.groups:
        run_corpus(model, g, [analysis], batch_size=batch_size, progress=False, desc="taxonomy")
    return analysis.result()


def random_head_sets(n_layers: int, n_heads: int, size: int, n_draws: int, seed: int = 0) -> list[list[Head]]:
    """``n_draws`` sets of ``size`` heads drawn uniformly without replacement among all
    ``n_layers × n_heads`` heads (each draw independent, seeded).

    >>> random_head_sets(2, 4, 3, 2, seed=0) == random_head_sets(2, 4, 3, 2, seed=0)
    True
    """
    total = n_layers * n_heads
    if not 0 < size <= total:
        raise ValueError(f"a random draw of {size} heads needs 1 ≤ size ≤ {total}")
    g = torch.Generator().manual_seed(int(seed))
    out = []
    for _ in range(int(n_draws)):
        pick = torch.randperm(total, generator=g)[:size].tolist()
        out.append(sorted((i // n_heads, i % n_heads) for i in pick))
    return out


def ablate_regime(
    model,
    texts=None,
    regime: Regime = "reset",
    *,
    taxonomy=None,
    how: AblationMode = "zero",
    means: Tensor | None = None,
    n_random: int = 20,
    seed: int = 0,
    level: float = 0.95,
    n_boot: int = 2000,
    batch_size: int = 8,
) -> RegimeAblation:
    """Ablate every head of one regime (Reset, Mixer or Retriever) against size-matched random heads.

    The regimes come from ``taxonomy`` (a :func:`geolens.head_taxonomy` result), computed on
    ``texts`` when not given (the same texts are then used to classify and to measure; pass a
    taxonomy of other windows to keep them apart). The control ablates as many heads drawn
    uniformly at random among all heads, ``n_random`` times (seeded); the result gives the
    regime's Δloss, each draw's, and the difference regime − random with a bootstrap interval
    over texts and draws and its verdict (:attr:`RegimeAblation.difference`). ``how`` and
    ``means`` as in :func:`ablate_heads`. All conditions of a text run in batches of
    ``batch_size`` rows.

    >>> import geolens
    >>> from geolens.testing import tiny_bridge
    >>> model = tiny_bridge("gqa")
    >>> texts = ["the cat sat on the mat", "a dog ran"]
    >>> r = geolens.intervene.ablate_regime(model, texts, "reset", n_random=4)
    >>> r.regime, len(r.heads), r.difference[3]  # every head of this tiny model is a Reset head
    ('Reset', 8, 'not testable')
    >>> table = r.taxonomy.table.assign(regime=["Retriever", "Reset"] * 4)  # a hand-made taxonomy
    >>> r = geolens.intervene.ablate_regime(model, texts, "retriever", taxonomy=table, n_random=4)
    >>> r.heads, len(r.random_heads), r.difference[3] in ("holds", "reversed", "tie")
    ([(0, 0), (0, 2), (1, 0), (1, 2)], 4, True)
    """
    name = _regime_name(regime)
    if how not in ("zero", "mean"):
        raise ValueError(f"how must be 'zero' or 'mean', got {how!r}")
    if isinstance(n_random, bool) or not isinstance(n_random, (int, np.integer)) or n_random < 2:
        raise ValueError(f"n_random must be an integer ≥ 2 (the control's draws), got {n_random!r}")
    model = _model(model)
    t = None if texts is None else _texts(model, texts)
    if taxonomy is None:
        if t is None:
            raise ValueError("ablate_regime needs texts or a taxonomy to know the regimes")
        with torch.no_grad():
            taxonomy = _taxonomy(model, t, batch_size)
    heads = regime_heads(taxonomy, name)
    if not heads:
        raise ValueError(f"the taxonomy has no {name} head: nothing to ablate")
    mean_z, means_from = _means(model, t, means, how, batch_size)
    result = RegimeAblation(
        model,
        name,
        heads,
        how,
        list(head_ablation_hooks(model, heads, how, mean_z)),
        taxonomy=taxonomy,
        level=level,
        n_boot=n_boot,
        seed=seed,
        means_from=means_from,
    )
    if t is None:
        return result
    cfg = model.cfg
    draws = random_head_sets(cfg.n_layers, cfg.n_heads, len(heads), n_random, seed)
    nll = _nll_per_condition(model, t, [[], heads, *draws], how, mean_z, batch_size)
    result.clean_loss, result.regime_loss, result.random_loss = nll[0], nll[1], nll[2:]
    result.random_heads = draws
    return result
