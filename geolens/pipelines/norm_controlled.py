"""Protocol 3's per-term endpoint as a pipeline (docs/faithfulness/v3/PROTOCOL.md): what an attribution
metric predicts about the effect of removing one attention term that the norm ‖α_ij^h ṽ_j^h‖ of the
removed term does not, on any set of windows.

:func:`run_norm_controlled` casts the model to float64 for the call (softmax and RMS norms in
float64 too: :func:`geolens.faithfulness.evaluation.float64_model`, which gives every parameter and
buffer its dtype back on exit, exception or not), draws the protocol's positions in each window
(``numpy.random.default_rng([3, document_index])``, the query range cut to the window:
:func:`~geolens.pipelines.faithfulness.query_range`), measures every term's KL there
(:func:`geolens.faithfulness.norm_controlled.norm_controlled_document`) and summarises the run as the
protocol's command does (:func:`geolens.faithfulness.norm_controlled_summary.norm_controlled_summary`:
per metric the mean partial Spearman with the KL given the norm, with document-cluster bootstrap
intervals, the pre-registered pairs as one Holm family, protocol 2's plain Spearman and the other
secondary analyses). Nothing is computed here: this module only runs those functions on the
caller's windows and lays out their result (:class:`NormControlledRun`) and its claims
(:func:`norm_controlled_claims`). The report's faithfulness section runs it on a few positions of
the report's windows; ``geolens faithfulness --protocol docs/faithfulness/v3/protocol.json`` runs
the same functions resumably, document by document, on the protocol's Lee windows
(:func:`geolens.faithfulness.norm_controlled.norm_controlled_stage`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import pandas as pd
import torch
from tqdm.auto import tqdm

from geolens.claims import PROTOCOL_MIN_DOCUMENTS, Claim, sample_size
from geolens.faithfulness.evaluation import float64_model
from geolens.faithfulness.norm_controlled import norm_controlled_document
from geolens.faithfulness.norm_controlled_summary import norm_controlled_summary
from geolens.pipelines import TopicRun
from geolens.pipelines.faithfulness import decide_steps, pair_text, query_range

NORM_CONTROLLED_PAIRS: tuple[tuple[str, str], ...] = (
    ("raw_attention", "value_weighted"),
    ("value_weighted", "output_normalized_intra"),
    ("output_normalized_inter", "contribution"),
    ("raw_attention", "contribution"),
    ("contribution", "contribution_abs"),
    ("contribution_abs", "grad_x_act"),
    ("random", "raw_attention"),
    ("value_weighted", "contribution_abs"),
    ("value_weighted", "grad_x_act"),
)
"""Protocol 3's pre-registered pairs a → b ("b predicts the KL better than a, beyond the norm"),
docs/faithfulness/v3/protocol.json ``pairs``; the first three are the claimed order's steps."""

PROTOCOL3 = {
    "pairs": [list(p) for p in NORM_CONTROLLED_PAIRS],
    "claimed_order_pairs": [0, 1, 2],
    "primary": {"zero_by_construction": ["value_weighted", "output_normalized_inter"]},
    "not_testable_by_construction": [
        {
            "pair": ["value_weighted", "output_normalized_inter"],
            "why": "both partials are 0 at every position: each ranks the terms as the norm does",
        }
    ],
    "not_formed": [
        {
            "pair": ["contribution_abs", "value_zeroing"],
            "why": "Value Zeroing scores sources; this version runs the term scope only",
        }
    ],
    "numerical_floor": {
        "kl": "max over the position's batches of sum_t p_t |delta_t| + eps * sum_t p_t |log p_t|, delta = log-probs "
        "of the in-batch clean row minus the clean reference, eps = 2^-52",
        "resolvable_factor": 1000,
    },
}
"""What :func:`~geolens.faithfulness.norm_controlled_summary.norm_controlled_summary` reads of protocol
3's twin besides the bootstrap's settings (``statistics``), as docs/faithfulness/v3/protocol.json
fixes it (a test keeps the two equal)."""


@dataclass
class NormControlledParams:
    """Parameters of :func:`run_norm_controlled` (defaults: protocol 3's, SmolLM2's 2 positions per
    document)."""

    n_positions: int = 2  # (layer, query) positions drawn per window
    queries: tuple[int, int] | None = None  # inclusive; None: 8 … seq_len − 2 (the protocol's 8 … 126 on 128 tokens)
    pairs: Sequence[Sequence[str]] = NORM_CONTROLLED_PAIRS
    n_boot: int = 10_000
    seed: int = 0
    alpha: float = 0.05
    batch_size: int = 128  # removals per batched forward

    def __post_init__(self) -> None:
        if int(self.n_positions) < 1:
            raise ValueError(f"n_positions must be a positive integer, got {self.n_positions!r}")
        if int(self.n_boot) < 1 or not 0.0 < float(self.alpha) < 1.0:
            raise ValueError(f"n_boot must be ≥ 1 and alpha in (0, 1), got {self.n_boot!r} and {self.alpha!r}")

    def query_range(self, seq_len: int) -> tuple[int, int]:
        """The queries drawn from on windows of ``seq_len`` tokens.

        >>> NormControlledParams().query_range(128), NormControlledParams().query_range(64)
        ((8, 126), (8, 62))
        """
        return query_range(self.queries, seq_len)

    def settings(self, n_layers: int) -> dict:
        """The twin-shaped settings :func:`~geolens.faithfulness.norm_controlled_summary.norm_controlled_summary` reads.

        >>> s = NormControlledParams(n_boot=200).settings(30)
        >>> s["statistics"], s["n_layers"], len(s["pairs"])
        ({'n_boot': 200, 'seed': 0, 'alpha': 0.05}, 30, 9)
        """
        stats = {"n_boot": int(self.n_boot), "seed": int(self.seed), "alpha": float(self.alpha)}
        return dict(PROTOCOL3, pairs=[list(p) for p in self.pairs], statistics=stats, n_layers=int(n_layers))


def metrics_table(summary: dict) -> pd.DataFrame:
    """One row per metric: the mean partial Spearman with the KL given the norm (``partial_spearman``,
    its 95 % interval ``ci_low`` … ``ci_high``, positions, documents and excluded positions) beside
    protocol 2's statistic on the same float64 effects (``plain_spearman`` and its interval)."""
    partial = pd.DataFrame(summary["norm_controlled"]["metrics"]).rename(columns={"mean": "partial_spearman"})
    plain = pd.DataFrame(summary["plain"]["metrics"])
    if plain.empty:
        return partial.assign(plain_spearman=float("nan"), plain_ci_low=float("nan"), plain_ci_high=float("nan"))
    plain = plain[["metric", "mean", "ci_low", "ci_high"]].rename(
        columns={"mean": "plain_spearman", "ci_low": "plain_ci_low", "ci_high": "plain_ci_high"}
    )
    return partial.merge(plain, on="metric", how="left")


def pairs_table(summary: dict) -> pd.DataFrame:
    """The Holm family (one row per pre-registered pair: Δ of the mean partials, the interval at the
    pair's Holm level, p, Holm p, verdict) with protocol 2's Δ of the plain means beside it
    (``plain_estimate``: exploratory, it decides nothing)."""
    pairs = pd.DataFrame(summary["norm_controlled"]["pairs"])
    plain = {(p["a"], p["b"]): p["estimate"] for p in summary["plain"].get("pairs", [])}
    if pairs.empty:
        return pairs
    return pairs.assign(plain_estimate=[plain.get((a, b)) for a, b in zip(pairs.a, pairs.b)])


@dataclass(kw_only=True)
class NormControlledRun(TopicRun):
    """:func:`run_norm_controlled`'s result. ``summary``: ``per_term_effects`` of a protocol-3 run
    (:func:`~geolens.faithfulness.norm_controlled_summary.norm_controlled_summary`); ``tables``:
    ``terms`` (every term of every position: KL, Δ log p(next), the norm, the metrics' scores),
    ``positions`` (one row per position: floors, counts), ``metrics`` (:func:`metrics_table`) and
    ``pairs`` (:func:`pairs_table`)."""

    summary: dict
    params: NormControlledParams = field(default_factory=NormControlledParams)

    @classmethod
    def of(
        cls,
        terms: pd.DataFrame,
        positions: pd.DataFrame,
        n_layers: int,
        params: NormControlledParams = NormControlledParams(),
        parameters: dict | None = None,
    ) -> "NormControlledRun":
        summary = norm_controlled_summary(terms, positions, params.settings(n_layers))
        summary["positions_per_document"] = int(params.n_positions)
        tables = {
            "terms": terms,
            "positions": positions,
            "metrics": metrics_table(summary),
            "pairs": pairs_table(summary),
        }
        return cls(parameters=dict(parameters or {}), tables=tables, summary=summary, params=params)

    def claims(self, windows: str = "documents", *, exploratory: bool = False) -> list:
        """:func:`norm_controlled_claims` of the run; ``windows`` names the documents' kind (e.g. the
        report's "corpus windows"), ``exploratory`` marks a run whose settings differ from the protocol's."""
        return norm_controlled_claims(self.summary, windows=windows, exploratory=exploratory)


def run_norm_controlled(
    model,
    windows: torch.Tensor,
    params: NormControlledParams = NormControlledParams(),
    *,
    progress: bool = True,
    first_document: int = 0,
) -> NormControlledRun:
    """Protocol 3's per-term endpoint on ``windows`` ``[document, pos]`` (one window per document,
    BOS first; row d is document ``first_document + d``, which seeds its position draws), in float64.

    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")
    >>> windows = tiny_tokens(model, ("the cat sat on the mat.", "a dog ran far away!!"), length=16)
    >>> run = run_norm_controlled(model, windows, NormControlledParams(n_positions=1, n_boot=100), progress=False)
    >>> run.summary["effects_dtype"], run.summary["n_positions"], next(model.parameters()).dtype
    ('float64', 2, torch.float32)
    >>> float(run.tables["metrics"].set_index("metric").partial_spearman["value_weighted"])  # the norm itself
    0.0
    """
    if not isinstance(windows, torch.Tensor) or windows.ndim != 2 or windows.dtype.is_floating_point:
        raise ValueError(
            f"windows must be integer token ids [document, pos], got {getattr(windows, 'shape', windows)!r}"
        )
    seq_len = int(windows.shape[1])
    queries = params.query_range(seq_len)
    device = next(model.parameters()).device
    terms, positions = [], []
    with float64_model(model):
        for d in tqdm(range(int(windows.shape[0])), desc="per-term effects (float64)", disable=not progress):
            t, p = norm_controlled_document(
                model,
                windows[d : d + 1].to(device),
                first_document + d,
                n_positions=int(params.n_positions),
                queries=queries,
                batch_size=int(params.batch_size),
            )
            terms.append(t)
            positions.append(p)
    parameters = dict(
        n_documents=int(windows.shape[0]),
        seq_len=seq_len,
        n_positions_per_document=int(params.n_positions),
        queries=list(queries),
        position_rng="numpy.random.default_rng([3, document_index])",
        effects_dtype="float64",
        n_boot=int(params.n_boot),
        seed=int(params.seed),
        alpha=float(params.alpha),
    )
    return NormControlledRun.of(
        pd.concat(terms, ignore_index=True),
        pd.concat(positions, ignore_index=True),
        int(model.cfg.n_layers),
        params,
        parameters,
    )


def norm_controlled_claims(summary: dict, *, windows: str = "documents", exploratory: bool = False) -> list:
    """Claims on protocol 3's per-term endpoint (``summary``: a run's ``per_term_effects``), each
    decided by the pre-registered pairs' intervals within Holm's step-down, on at least the
    protocol's :data:`~geolens.claims.PROTOCOL_MIN_DOCUMENTS` documents and only in a run under the
    protocol's settings (:mod:`geolens.claims`)."""
    nc = summary["norm_controlled"]
    pairs = {(p["a"], p["b"]): p for p in nc["pairs"]}
    sample = sample_size(
        int(summary["n_documents"]), windows=windows, minimum=PROTOCOL_MIN_DOCUMENTS, exploratory=exploratory
    )
    where = f"{summary['n_positions']} (layer, query) positions, float64 effects, outcome KL"
    claimed = NORM_CONTROLLED_PAIRS[:3]
    steps = [pairs.get(pair) for pair in claimed]
    alignment = pairs.get(("output_normalized_inter", "contribution"))
    ranked = ", ".join(
        f"{m['metric']} {m['mean']:+.3f} [{m['ci_low']:+.3f}, {m['ci_high']:+.3f}]"
        for m in sorted(nc["metrics"], key=lambda m: -m["mean"])
    )
    best = max(nc["metrics"], key=lambda m: m["mean"], default=None)
    return [
        Claim(
            claim="Faithfulness order raw attention < value-weighted < output-normalised < contribution weights, "
            "against each term's measured effect beyond its norm",
            source="paper A §3.1",
            measured=f"Δ mean partial Spearman given ‖α ṽ‖ (b − a; + = b predicts more beyond the norm; {where}): "
            + "; ".join(pair_text(p) if p else f"{a} → {b}: not run" for p, (a, b) in zip(steps, claimed)),
            holds=decide_steps(steps),
            criterion="each step's interval at its Holm level (one family: protocol 3's 9 pre-registered pairs) lies "
            "above 0; does not hold when any step's interval does not",
            numbers={"sample": sample, "steps": [p for p in steps if p]},
            ci=True,
        ),
        Claim(
            claim="The alignment of contribution weights with the output predicts each term's measured effect "
            "beyond its norm",
            source="paper A §3.1",
            measured=(pair_text(alignment) if alignment else "output_normalized_inter → contribution: not run")
            + f" (= the mean partial ρ of c, output-normalised inter being 0 by construction; {where})",
            holds=decide_steps([alignment]),
            criterion="the pair's interval at its Holm level lies above 0 (below: does not hold)",
            numbers={"sample": sample, "pair": alignment},
            ci=True,
        ),
        Claim(
            claim="The metric that predicts the per-term effects best beyond the norm",
            source="paper A §3.1",
            measured=f"mean partial Spearman given ‖α ṽ‖ [95% CI] ({where}): {ranked}",
            holds=None,
            criterion="descriptive: the metrics ordered by mean partial Spearman correlation with the measured KL",
            numbers={"sample": sample, "best": None if best is None else best["metric"]},
        ),
    ]


__all__ = [
    "NORM_CONTROLLED_PAIRS",
    "PROTOCOL3",
    "NormControlledParams",
    "NormControlledRun",
    "metrics_table",
    "norm_controlled_claims",
    "pairs_table",
    "run_norm_controlled",
]
