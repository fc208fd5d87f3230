"""The pruning pipeline (docs/method.md §6, Mudarisov et al. 2026): head-pruning curves by order,
and the single-head sensitivity scan.

References (head taxonomy, attention entropy, mean ``hook_z`` for mean-ablation) are streamed in
one pass over the reference windows; ΔPPL is measured on other (evaluation) windows for each
order of :func:`geolens.pruning.pruning_orders` (regime: Reset → Mixer → Retriever; weight
magnitude; attention entropy; random seeds) at each retention level, then (``scan_sequences``
> 0) one head at a time on the first evaluation windows. ``geolens pruning`` runs it and writes
it; the report's pruning section runs it with the report's corpus windows as references (their
analyses in the shared corpus pass) and its held-out windows for ΔPPL.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import partial
from typing import Sequence

from geolens.claims import Claim, sample_size
from geolens.interventions.ablation import MeanHeadZ
from geolens.pipelines import TopicRun, streamed
from geolens.pruning import RETENTION, AttentionEntropy, head_sensitivity, pruning_curves, pruning_orders
from geolens.taxonomy import TaxonomyAnalysis


@dataclass
class PruningParams:
    """Parameters of :func:`run_pruning`."""

    retention: Sequence[float] = RETENTION
    seeds: Sequence[int] = (0, 1, 2)  # seeds of the random orders
    mode: str = "mean"  # "mean" or "zero" ablation of hook_z
    n_scored: int | None = None  # score only the last N predictions of each window
    scan_sequences: int = 0  # first N evaluation windows for the single-head scan (0: skip it)
    batch_size: int = 8
    description: str = ""  # subtitle of the pruning-curve figure


def pruning_analyses(model, tokens, params: PruningParams) -> dict:
    """The reference analyses of the pruning pipeline (one pass over the reference windows)."""
    cfg = model.cfg
    return {
        "taxonomy": TaxonomyAnalysis.for_model(model),
        "entropy": AttentionEntropy(cfg.n_layers, cfg.n_heads),
        "mean_z": MeanHeadZ.for_model(model),
    }


@dataclass(kw_only=True)
class PruningRun(TopicRun):
    """:func:`run_pruning`'s result: the reference taxonomy, the orders, the curves (``tables["pruning"]``)
    and the single-head scan (``sensitivity``, None when skipped)."""

    taxonomy: object
    orders: dict
    curves: object
    sensitivity: object | None = None
    scan_windows: int = 0
    seq_len: int = 0

    @property
    def figures(self) -> dict:
        from geolens.viz.faithfulness import pruning_curves_plot, sensitivity_map_plot

        out = {"pruning": partial(pruning_curves_plot, self.curves, subtitle=self.parameters["description"])}
        if self.sensitivity is not None:
            sens = self.sensitivity
            subtitle = (
                f"{self.parameters['mode']}-ablation, one head at a time, {self.scan_windows} windows × {self.seq_len}"
            )
            out["sensitivity"] = partial(sensitivity_map_plot, sens.delta_ppl, sens.critical, subtitle=subtitle)
        return out

    def claims(self, windows: str = "evaluation windows") -> list:
        """The regime-order claim; its sample is the evaluation windows (named ``windows``) and the random seeds."""
        n_eval = int(self.parameters["eval_windows"])
        return pruning_claims(self.curves, sample_size(n_eval, windows=windows, n_seeds=len(self.parameters["seeds"])))


def run_pruning(
    model,
    reference,
    evaluation,
    params: PruningParams = PruningParams(),
    *,
    analyses: dict | None = None,
    progress: bool = True,
) -> PruningRun:
    """The pruning pipeline: references on the windows ``reference``, ΔPPL on ``evaluation``.

    ``analyses``: :func:`pruning_analyses` already run over ``reference`` (then no pass here).
    """
    analyses = streamed(
        model,
        reference,
        analyses,
        lambda: pruning_analyses(model, reference, params),
        batch_size=params.batch_size,
        progress=progress,
        desc="references",
    )
    tax = analyses["taxonomy"].result()
    orders = pruning_orders(
        model,
        reference,
        taxonomy_table=tax.table,
        entropy=analyses["entropy"].result(),
        seeds=params.seeds,
        batch_size=params.batch_size,
    )
    means = analyses["mean_z"].result() if params.mode == "mean" else None
    df = pruning_curves(
        model,
        evaluation,
        orders,
        params.retention,
        mode=params.mode,
        means=means,
        batch_size=params.batch_size,
        n_scored=params.n_scored,
        progress=progress,
    )
    wide = df.pivot_table(index="order", columns="retention", values="delta_ppl", sort=False)
    tables = {"taxonomy": tax.table, "pruning": df, "pruning_wide": wide}
    sens, scan = None, evaluation[: params.scan_sequences]
    if params.scan_sequences > 0:
        sens = head_sensitivity(model, scan, mode=params.mode, means=means, n_scored=params.n_scored, progress=progress)
        tables["sensitivity"] = sens.table.merge(tax.table[["layer", "head", "regime"]], on=["layer", "head"])
        tables["critical_heads"] = sens.critical.merge(
            tax.table[["layer", "head", "regime", "share_sink", "share_current", "share_other"]], on=["layer", "head"]
        )
    parameters = {
        **asdict(params),
        "eval_windows": int(evaluation.shape[0]),
        "reference_windows": int(reference.shape[0]),
    }
    return PruningRun(
        parameters=parameters,
        tables=tables,
        taxonomy=tax,
        orders=orders,
        curves=df,
        sensitivity=sens,
        scan_windows=int(scan.shape[0]),
        seq_len=int(evaluation.shape[1]),
    )


def pruning_claims(df, sample: dict | None = None) -> list:
    """The pruning claim of Mudarisov et al. 2026, decided from the curves ``df`` (mean ΔPPL over
    retention levels)."""
    mean = df.groupby("order", sort=False).delta_ppl.mean()
    rand = mean[[o for o in mean.index if o.startswith("random")]]
    regime, random_mean = float(mean["regime"]), float(rand.mean())
    others = {o: float(mean[o]) for o in ("weight", "entropy") if o in mean.index}
    return [
        Claim(
            claim="Pruning heads in regime order (Reset first, Retrievers last) hurts less than pruning at random",
            source="paper B (docs/method.md §6)",
            measured=f"mean ΔPPL over retention levels: regime {regime:.3g}, random {random_mean:.3g} "
            f"({len(rand)} seeds); " + ", ".join(f"{k} {v:.3g}" for k, v in others.items()),
            holds=bool(regime < random_mean),
            criterion="regime-order mean ΔPPL < mean of the random orders",
            numbers={"regime": regime, "random": random_mean, **others, **({"sample": sample} if sample else {})},
        )
    ]
