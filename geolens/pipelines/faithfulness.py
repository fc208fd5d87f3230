"""The faithfulness pipeline (docs/method.md §3, paper A §2.3, §3.1): comprehensiveness and
sufficiency curves of attribution metrics by causal masking, their AUCs and paired differences.

:func:`geolens.faithfulness.faithfulness_curves` runs over the documents in blocks of ``block``
documents (all at once by default); after each block the results so far are one
:class:`~geolens.faithfulness.FaithfulnessResult` (``on_block`` sees it: ``geolens
faithfulness`` rewrites its tables and figures then, so an interrupted run keeps a consistent set,
and ``--resume`` passes the documents already done as ``done``). The report's faithfulness
section runs it on its held-out windows. Multiple choice under masks (``geolens faithfulness
--mc-task``) is one call of :func:`geolens.multiple_choice.mc_accuracy_under_masks`, made by
the command.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Sequence

import pandas as pd

from geolens.claims import PROTOCOL_MIN_DOCUMENTS, Claim, sample_size
from geolens.faithfulness import CLAIMED_STEPS, MIN_DOCUMENTS, FaithfulnessResult, Protocol, claimed_order_holds, faithfulness_curves
from geolens.pipelines import TopicRun

QUANTITY = "delta_logprob"  # of the claims: mean Δ log-prob is linear in the NLL, so not dominated by the largest k as ΔPPL is


@dataclass
class FaithfulnessParams:
    """Parameters of :func:`run_faithfulness`."""

    protocol: Protocol = field(default_factory=Protocol)
    metrics: Sequence[str] | None = None  # None: every metric registered with default=True (geolens.metrics), in registry order
    chunk_size: int = 12  # masks per batched forward
    seed: int = 0
    n_boot: int = 1000
    block: int | None = None  # documents per block (None: all in one)


@dataclass(kw_only=True)
class FaithfulnessRun(TopicRun):
    """:func:`run_faithfulness`'s result: the :class:`~geolens.faithfulness.FaithfulnessResult`
    with its tables (per-document results, curves, AUCs, paired differences), the curve figures
    and the claims. ``FaithfulnessRun.of(result)`` wraps a result read back from disk."""

    result: FaithfulnessResult

    @classmethod
    def of(cls, result: FaithfulnessResult, parameters: dict | None = None) -> "FaithfulnessRun":
        tables = {"per_sequence": result.per_sequence, "clean": result.clean, "curves": result.curves, "auc": result.auc(), "pairs": result.pairs()}
        return cls(parameters=dict(parameters or {}), tables=tables, result=result)

    @property
    def figures(self) -> dict:
        from geolens.viz.faithfulness import faithfulness_curves_plot

        text = self.result.protocol_text()
        return {f"curves_{q}": partial(faithfulness_curves_plot, self.result.curves, q, subtitle=text) for q in ("delta_ppl", "delta_logprob")}

    def claims(self, windows: str = "documents") -> list:
        """Paper A's faithfulness claims; each carries its sample (the documents, named ``windows``),
        decided only on the protocol's minimum of :data:`~geolens.claims.PROTOCOL_MIN_DOCUMENTS` documents."""
        sample = sample_size(len(self.result.clean), windows=windows, minimum=PROTOCOL_MIN_DOCUMENTS)
        claims = faithfulness_claims(self.tables["pairs"], self.result.range_check())
        for c in claims:
            c.numbers["sample"] = sample
        return claims


def run_faithfulness(
    model,
    tokens,
    params: FaithfulnessParams = FaithfulnessParams(),
    *,
    progress: bool = True,
    done: tuple[pd.DataFrame, pd.DataFrame] | None = None,
    meta: Callable[[int], dict] | None = None,
    on_block: Callable[[FaithfulnessResult], None] | None = None,
) -> FaithfulnessRun | None:
    """The faithfulness curves over the documents ``tokens`` ``[n, seq]``, block by block.

    ``done``: ``(per_sequence, clean)`` of the first documents, already computed (a resumed
    run): the blocks start after them. ``meta(n_done)``: the result's ``meta`` after ``n_done``
    documents (default: :func:`faithfulness_curves`' own, with ``n_sequences = n_done``).
    ``on_block(result)`` is called after every block with the result so far. Returns None when
    ``done`` already covers every document.
    """
    from geolens.metrics import metric_names

    metrics = tuple(params.metrics) if params.metrics is not None else metric_names(default_only=True)
    parts, cleans = ([done[0]], [done[1]]) if done is not None else ([], [])
    start0 = len(done[1]) if done is not None else 0
    step = params.block or max(1, int(tokens.shape[0]))
    result = None
    for start in range(start0, tokens.shape[0], step):
        res = faithfulness_curves(
            model, tokens[start : start + step], params.protocol, metrics,
            chunk_size=params.chunk_size, seed=params.seed, progress=progress, n_boot=params.n_boot, first_sequence=start,
        )  # fmt: skip
        parts.append(res.per_sequence)
        cleans.append(res.clean)
        n_done = start + len(res.clean)
        result = FaithfulnessResult(
            protocol=params.protocol.to_dict(model), per_sequence=pd.concat(parts, ignore_index=True),
            clean=pd.concat(cleans, ignore_index=True), n_boot=params.n_boot,
            meta=meta(n_done) if meta is not None else {**res.meta, "n_sequences": n_done},
        )  # fmt: skip
        if on_block is not None:
            on_block(result)
    if result is None:
        return None
    parameters = {"protocol": result.protocol, "metrics": list(metrics), "chunk_size": params.chunk_size, "seed": params.seed,
                  "n_boot": params.n_boot, "n_sequences": len(result.clean)}  # fmt: skip
    return FaithfulnessRun.of(result, parameters)


def _decided(order: dict) -> bool | None:
    """True/False when every step has a CI verdict; None (undecided) otherwise."""
    return bool(order["holds"]) if order["decided"] else None


def _steps_text(steps: dict) -> str:
    """Each step's paired difference and 95% CI (its verdict word stays in ``numbers``: the claim's
    own verdict follows :mod:`geolens.claims`)."""
    return ", ".join(
        f"{k.replace(' < ', ' → ')}: " + ("identical masks by construction" if v["verdict"] == "not testable" else
                                         f"{v['auc_diff']:+.3g} [{v['ci'][0]:+.3g}, {v['ci'][1]:+.3g}]")
        for k, v in steps.items()
    )  # fmt: skip


def faithfulness_claims(pairs, range_check: dict) -> list:
    """Paper A's claimed faithfulness order, decided from the paired differences ``pairs``."""
    comp = claimed_order_holds(pairs, "comprehensiveness", QUANTITY)
    suff = claimed_order_holds(pairs, "sufficiency", QUANTITY)
    steps = comp["steps"]
    gains = {f"{a} → {b}": steps[f"{a} < {b}"]["auc_diff"] for a, b in CLAIMED_STEPS if f"{a} < {b}" in steps}
    cos_step = "output_normalized → contribution"
    others = [k for k in gains if k != cos_step]
    if comp["decided"] and cos_step in gains and others:
        largest = max(gains, key=gains.get)
        # the alignment step must be the largest gain and its CI must exclude 0 (it "holds")
        alignment = largest == cos_step and steps["output_normalized < contribution"]["verdict"] == "holds"
    else:
        alignment = None

    def why(order: dict) -> str:  # why the order's intervals could not decide it ("" when they did)
        return "" if order["decided"] else f" (undecided: {'no range' if not range_check.get('has_range') else f'fewer than {MIN_DOCUMENTS} documents'})"

    rc = f"range check: random ΔPPL at k = {range_check['max_fraction']}: {100 * (range_check.get('random_delta_ppl_rel_at_max_fraction') or 0):+.2f} %"
    return [
        Claim(claim="Faithfulness order raw attention < value-weighted < output-normalised < contribution weights (comprehensiveness)", source="paper A §3.1",
              measured=f"paired Δ log-prob AUC differences (b − a, + = b more faithful; 95% CI): {_steps_text(steps)}; {rc}{why(comp)}",
              holds=_decided(comp), criterion="every step's paired 95% bootstrap CI over documents lies above 0, after the range check (random ranking moves PPL ≥ 1 %)",
              numbers={"steps": steps, "range_check": range_check}, ci=True),
        Claim(claim="The same order under sufficiency (removing the least important terms hurts least for contribution weights)", source="paper A §3.1",
              measured=f"paired sufficiency Δ log-prob AUC differences (b − a, + = b more faithful; 95% CI): {_steps_text(suff['steps'])}{why(suff)}",
              holds=_decided(suff), criterion="every step's paired 95% CI of the sufficiency Δ log-prob AUC difference lies above 0, after the range check",
              numbers={"steps": suff["steps"]}, ci=True),
        Claim(claim="Alignment (the cosine factor) gives the largest single gain in faithfulness", source="paper A §3.1",
              measured="comprehensiveness Δ log-prob AUC gains per step: " + ", ".join(f"{k} {v:+.3g}" for k, v in gains.items()) + why(comp),
              holds=alignment, criterion="the output-normalised → contribution step has the largest gain of the three and its paired CI lies above 0",
              numbers={"gains": gains}),
    ]
