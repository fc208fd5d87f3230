"""The contribution-flow pipeline (docs/method.md §10): the input-token erasure test of the flow
methods against gradient baselines and random (docs/flow/PROTOCOL.md), and the induction
known-answer check.

:func:`run_flow` runs both on one window per document (:func:`geolens.flow.erasure.measure_document`
for each, then :func:`geolens.flow.summary.erasure_summary`) and returns a :class:`FlowRun`.
``geolens flow --erasure`` runs the same per-document function under the pre-registered protocol,
saving each document as it finishes, and builds its :class:`FlowRun` from the saved tables with
:meth:`FlowRun.of`. :meth:`FlowRun.load` reads a finished run folder (e.g.
``docs/flow/<model>/``) back, so that a report can show a published run without recomputing it.

:func:`prompt_flow` is the one-prompt look of ``geolens flow "prompt"`` and of the report's flow
section: every listed method's attribution row of the last prediction
(:func:`geolens.contribution_flow`) and its information-flow routes
(:func:`geolens.flow.routes.flow_routes`), from one cached forward.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable

import pandas as pd
import torch

from geolens.flow import DIRECTIONS, FLOW_METHODS, ErasureSettings, induction_check, induction_summary, measure_document
from geolens.flow.summary import curves_table, erasure_summary
from geolens.pipelines import TopicRun

LABELS = {
    "random": "random",
    "attention_rollout": "attention rollout",
    "value_zeroing_rollout": "Value Zeroing rollout",
    "alti": "ALTI",
    "contribution": "contribution flow",
    "grad_x_input": "gradient × input",
    "integrated_gradients": "integrated gradients",
}
CITED = {
    "attention_rollout": "attention rollout (Abnar & Zuidema 2020)",
    "value_zeroing_rollout": "Value Zeroing rollout (Mohebbi et al. 2023)",
    "alti": "ALTI (Ferrando, Gállego & Costa-jussà 2022)",
    "grad_x_input": "gradient × input",
    "integrated_gradients": "integrated gradients (Sundararajan, Taly & Yan 2017)",
}
SOURCE = (
    "geolens contribution flow; erasure test after DeYoung et al. 2020 (docs/method.md §10.1; docs/flow/PROTOCOL.md)"
)
PROTOCOL_MIN_DOCUMENTS = 100  # docs/flow/protocol.json, data.min_documents


LISTED = ("contribution", "alti", "attention_rollout")  # listed by default; value_zeroing_rollout reruns the model


@dataclass
class PromptFlow:
    """:func:`prompt_flow`'s result: the attribution row ``rows[method]`` ``[pos]`` of the
    prediction at ``position`` (its residual stream after the last layer) by each method, the
    token strings, the routes (None when not asked for), and what the model predicts there:
    ``predicted`` (the most probable next token) with its probability ``p_predicted``."""

    words: list[str]
    position: int
    rows: dict[str, torch.Tensor]
    routes: object | None = None  # geolens.flow.routes.FlowGraph
    predicted: str | None = None
    p_predicted: float | None = None

    def top(self, k: int) -> dict[str, list[dict]]:
        """Per method, the ``k`` largest shares as (position, token, share) records, largest first
        (ties by position)."""
        return {m: top_tokens(row, self.words, k) for m, row in self.rows.items()}

    def table(self, k: int) -> pd.DataFrame:
        """:meth:`top` as one table: method, rank (1 = largest), position, token, share."""
        rows = [
            dict(method=m, rank=r + 1, **entry) for m, entries in self.top(k).items() for r, entry in enumerate(entries)
        ]
        return pd.DataFrame(rows, columns=["method", "rank", "position", "token", "share"])


def top_tokens(row: torch.Tensor, words: list[str], k: int) -> list[dict]:
    """The ``k`` largest entries of one attribution row, as (position, token, share) records.

    >>> top_tokens(torch.tensor([0.25, 0.5, 0.25]), ["<s>", "a", "b"], 2)
    [{'position': 1, 'token': 'a', 'share': 0.5}, {'position': 0, 'token': '<s>', 'share': 0.25}]
    """
    idx = torch.argsort(row, descending=True, stable=True)[:k].tolist()
    return [{"position": j, "token": words[j], "share": float(row[j])} for j in idx]


def prompt_flow(
    model,
    tokens: torch.Tensor,
    methods=LISTED,
    *,
    threshold: float = 0.05,
    route_method: str = "contribution",
    routes: bool = True,
) -> PromptFlow:
    """The last prediction of ``tokens`` ``[1, pos]`` (BOS first): each of ``methods``' row of
    :func:`geolens.contribution_flow` at the last position, and, with ``routes``, the
    information-flow routes of that prediction (:func:`geolens.flow.routes.flow_routes`, edges
    whose ``route_method`` share exceeds ``threshold``), all from one cached forward.

    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")
    >>> pf = prompt_flow(model, tiny_tokens(model)[:1], threshold=0.1)
    >>> sorted(pf.rows), round(float(pf.rows["contribution"].sum()), 4), pf.routes.position == pf.position
    (['alti', 'attention_rollout', 'contribution'], 1.0, True)
    """
    from geolens.flow import contribution_flow, flow_names_filter
    from geolens.flow.routes import flow_routes, token_strings

    if tokens.ndim != 2 or tokens.shape[0] != 1 or tokens.shape[1] < 2:
        raise ValueError(f"tokens must be one prompt [1, pos ≥ 2] (BOS first), got shape {tuple(tokens.shape)}")
    words = token_strings(model, tokens, 0, tokens.shape[1])
    last = int(tokens.shape[1]) - 1
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens, names_filter=flow_names_filter(model))
        rows = {m: contribution_flow(model, cache, m, tokens=tokens)[0, last].detach().cpu() for m in methods}
        graph = flow_routes(model, cache, last, threshold, method=route_method, tokens=tokens) if routes else None
    probs = torch.softmax(logits[0, last].detach().float().cpu(), dim=-1)
    top = int(probs.argmax())
    return PromptFlow(
        words=words,
        position=last,
        rows=rows,
        routes=graph,
        predicted=token_strings(model, torch.tensor([top]), 0, 1)[0],
        p_predicted=float(probs[top]),
    )


@dataclass
class FlowParams:
    """Parameters of :func:`run_flow` (defaults: the settings of the flow protocol's version 3,
    docs/flow/v3/protocol.json: both gradient methods from the prefix-mean baseline, integrated
    gradients from 32 even steps refined on a local grid, at most 864 gradients, until the
    completeness gap is within 1 %)."""

    erasure: ErasureSettings = field(
        default_factory=lambda: ErasureSettings(
            ig_baseline="prefix_mean", ig_tolerance=0.01, ig_max_steps=864, ig_grid="local"
        )
    )
    induction: bool = True  # run the known-answer check
    induction_tokens: int = 20
    induction_seed: int = 0

    @classmethod
    def quick(cls) -> "FlowParams":
        """Small settings for a quick look (two predictions per window, 8 integrated-gradient
        steps from the prefix-mean baseline, not adaptive, 1000 resamples): nothing it finds is a
        verdict."""
        return cls(erasure=ErasureSettings(positions=(15, 31), ig_steps=8, n_boot=1000, ig_baseline="prefix_mean"))


@dataclass(kw_only=True)
class FlowRun(TopicRun):
    """:func:`run_flow`'s result. ``tables``: ``conditions``, ``predictions``, ``rankings`` (per
    document), ``naopc`` (per method, family and direction), ``pairs`` (every pair of both
    families, and the exploratory Δp pairs), ``curves`` (mean outcome per fraction),
    ``replacements`` (each method's nAOPC difference between the two replacements, when both ran)
    and ``induction``; ``summary``: :func:`geolens.flow.summary.erasure_summary` plus the known-answer
    check; ``status``: ``"pre-registered"`` or ``"exploratory"`` (only the former decides claims)."""

    summary: dict
    settings: ErasureSettings
    status: str = "exploratory"

    @classmethod
    def of(
        cls,
        tables: dict,
        settings: ErasureSettings,
        *,
        induction: pd.DataFrame | None = None,
        status: str = "exploratory",
        parameters: dict | None = None,
        induction_skipped: str | None = None,
        verdicts: bool = True,
    ) -> "FlowRun":
        """The run from its per-document tables (``conditions``, ``predictions``, ``rankings``);
        ``induction_skipped``: why the known-answer check did not run (recorded in the summary);
        ``verdicts=False`` (an exploratory run under a protocol): every pair's verdict is
        ``not decided (exploratory)`` and no method is named most faithful."""
        summary = erasure_summary(tables, settings)
        if not verdicts:
            from geolens.preregistration import withhold_verdicts

            for family in summary["families"].values():
                family["pairs"] = withhold_verdicts(family["pairs"])
            summary["most_faithful"] = {d: None for d in summary["most_faithful"]}
            if "verdict_changes" in summary:
                summary["verdict_changes"] = []
        if induction is not None:
            summary["induction_check"] = induction_summary(induction)
        elif induction_skipped is not None:
            summary["induction_check"] = {"skipped": induction_skipped}
        all_tables = dict(tables)
        all_tables.update(
            naopc=_naopc_rows(summary), pairs=_pair_rows(summary), curves=curves_table(tables["conditions"], settings)
        )
        summary["curves"] = all_tables["curves"].to_dict("records")
        moved = summary.get("replacement_differences")
        if moved is not None and moved["tests"]:
            all_tables["replacements"] = pd.DataFrame(moved["tests"]).assign(
                primary=moved["primary"], robustness=moved["robustness"]
            )
        if induction is not None:
            all_tables["induction"] = induction
        params = {"erasure": settings.to_dict(), **(parameters or {})}
        return cls(parameters=params, tables=all_tables, summary=summary, settings=settings, status=status)

    @classmethod
    def load(cls, folder: str | Path) -> "FlowRun":
        """A finished run folder written by ``geolens flow --erasure`` (``summary.json`` and the
        per-document tables ``erasure_*.csv.gz``), refused in one line when incomplete."""
        from geolens.run_folder import require_complete

        folder = require_complete(Path(folder))
        saved = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
        settings = ErasureSettings(**saved["settings"])
        tables = {
            name: pd.read_csv(folder / f"erasure_{name}.csv.gz", dtype={"order": str} if name == "rankings" else None)
            for name in ("conditions", "predictions", "rankings")
        }
        induction = pd.read_csv(folder / "induction.csv") if (folder / "induction.csv").is_file() else None
        from geolens.preregistration import NOT_DECIDED

        withheld = any(p.get("verdict") == NOT_DECIDED for f in saved["families"].values() for p in f["pairs"])
        return cls.of(
            tables,
            settings,
            induction=induction,
            status=saved.get("status", "exploratory"),
            parameters={"folder": str(folder)},
            verdicts=not withheld,  # an exploratory run under a protocol decides nothing, loaded or not
        )

    @property
    def figures(self) -> dict[str, Callable]:
        from geolens.viz.flow import erasure_naopc_plot

        if not (self.tables["naopc"]["family"] == "primary").any():
            return {}  # no prediction passed the range check
        subtitle = (
            f"{self.summary['n_documents']} documents, {self.summary['n_predictions']} predictions ({self.status})"
        )
        return {"naopc": partial(erasure_naopc_plot, self.tables["naopc"], labels=LABELS, subtitle=subtitle)}

    def claims(self, windows: str = "documents") -> list:
        """:func:`flow_claims` of the run; ``windows`` names the units of its sample (e.g. the
        report's "corpus windows")."""
        return flow_claims(self.summary, self.settings, status=self.status, windows=windows)


def run_flow(model, windows, params: FlowParams = FlowParams(), *, progress: bool = True, texts=None) -> FlowRun:
    """The erasure test on ``windows`` ``[document, pos]`` (one window per document, BOS first;
    row d is document d) and the known-answer check of the flow methods among the settings'
    methods. ``texts``: the documents whose unigram counts give the ``unigram`` replacement
    (default: the Lee corpus)."""
    from tqdm.auto import tqdm

    from geolens.data import load_corpus
    from geolens.flow import space_token, unigram_counts

    s = params.erasure
    counts = (
        unigram_counts(model, load_corpus("lee") if texts is None else texts) if "unigram" in s.replacements else None
    )
    space_id = space_token(model) if "space" in s.replacements else None
    parts = []
    for d in tqdm(range(int(windows.shape[0])), desc="erasure", disable=not progress):
        parts.append(measure_document(model, windows[d], d, s, space_id=space_id, counts=counts))
    tables = {
        name: pd.concat([p[name] for p in parts], ignore_index=True)
        for name in ("conditions", "predictions", "rankings")
    }
    flows = [m for m in s.methods if m in FLOW_METHODS]  # the known-answer check of the flows under test
    induction, skipped = None, None
    if params.induction and flows:
        induction, skipped = checked_induction(
            model, n_tokens=params.induction_tokens, seed=params.induction_seed, methods=flows
        )
    parameters = {"n_documents": int(windows.shape[0]), "seq_len": int(windows.shape[1])}
    return FlowRun.of(tables, s, induction=induction, induction_skipped=skipped, parameters=parameters)


def checked_induction(model, **kwargs) -> tuple[pd.DataFrame | None, str | None]:
    """(:func:`geolens.flow.induction.induction_check`'s table, None), or (None, why) when the
    vocabulary is too small for the sequence (the tiny test models)."""
    try:
        return induction_check(model, **kwargs), None
    except ValueError as err:
        return None, str(err)


def _rows(summary: dict, key: str, columns: list[str]) -> pd.DataFrame:
    """The ``key`` entries ("methods" or "pairs") of every family of ``summary`` as one table."""
    families = [(name, f) for name, f in summary["families"].items()] + [
        ("exploratory", f) for f in summary["exploratory_delta_p"].values()
    ]
    rows = [
        dict(family=name, replacement=f["replacement"], outcome=f["outcome"], **entry)
        for name, f in families
        for entry in f[key]
    ]
    return pd.DataFrame(rows, columns=None if rows else columns)


def _naopc_rows(summary: dict) -> pd.DataFrame:
    return _rows(
        summary, "methods", ["family", "replacement", "outcome", "direction", "method", "naopc", "ci_low", "ci_high"]
    )


def _pair_rows(summary: dict) -> pd.DataFrame:
    return _rows(
        summary,
        "pairs",
        ["family", "replacement", "outcome", "direction", "a", "b", "delta", "ci_low", "ci_high", "verdict"],
    )


def _favour(pair: dict | None, method: str) -> str:
    """The pair's verdict read from ``method``'s side: "for", "against", "tie", "not testable", or
    "missing" (no prediction passed the range check)."""
    if pair is None:
        return "missing"
    v = pair["verdict"]
    if v in ("tie", "not testable"):
        return v
    wins = (v == "holds") == (pair["b"] == method)
    return "for" if wins else "against"


def _pair(pairs: list[dict], direction: str, x: str, y: str) -> dict | None:
    for p in pairs:
        if p["direction"] == direction and {p["a"], p["b"]} == {x, y}:
            return p
    return None


def _said(p: dict | None, method: str) -> str:
    """Δ in ``method``'s favour with its interval at the Holm level (the pair's verdict word stays in
    the numbers: the claim's own verdict follows :mod:`geolens.claims`)."""
    if p is None:
        return "no prediction in range"
    if p["verdict"] == "not testable":
        return "identical rankings by construction"
    sign = 1.0 if p["b"] == method else -1.0
    lo, hi = sorted((sign * p["ci_low"], sign * p["ci_high"]))
    return f"{sign * p['delta']:+.3g} [{lo:+.3g}, {hi:+.3g}]"


NO_RULE = "the protocol pre-registers no decision rule for this comparison (docs/flow/PROTOCOL.md §5)"


def replacement_claim(moved: dict, *, windows: str = "documents", status: str = "pre-registered"):
    """The claim that the erasure outcomes do not depend on the replacement token, from
    :func:`geolens.flow.summary.replacement_differences`: each method's nAOPC difference
    (robustness − primary replacement, KL) per direction with its interval at its Holm level. The
    protocol fixes no margin or rule for it, so the claim is indicative whatever its intervals say
    (its sample is marked with that reason), and its numbers are reported as they are."""
    from geolens.claims import Claim, sample_size

    sample = sample_size(
        moved["n_documents"], windows=windows, minimum=PROTOCOL_MIN_DOCUMENTS, exploratory=status != "pre-registered"
    )
    sample = dict(
        sample, low_power=True, low_power_reason="; ".join(r for r in (sample["low_power_reason"], NO_RULE) if r)
    )
    first, second = moved["primary"], moved["robustness"]
    tests = moved["tests"]
    if not tests:
        measured = f"no prediction in range under both the {first} and the {second} replacement"
    else:
        apart = [t for t in tests if t["excludes_zero"]]
        largest = max(tests, key=lambda t: abs(t["delta"]))
        shown = apart or [largest]
        measured = (
            f"nAOPC ({moved['outcome'].upper()}) under {second} minus under {first}, {moved['n_predictions']} predictions in range under both: "
            f"{len(apart)} of {len(tests)} intervals at their Holm level exclude 0"
            + ("" if apart else "; the largest difference")
            + ": "
            + "; ".join(
                f"{LABELS[t['method']]} {t['direction'][:4]}. {t['delta']:+.3g} [{t['ci_low']:+.3g}, {t['ci_high']:+.3g}]"
                for t in shown[:6]
            )
            + (f" (and {len(shown) - 6} more)" if len(shown) > 6 else "")
        )
    if status != "pre-registered":
        measured += f"; {status} run"
    return Claim(
        claim="The erasure outcomes do not depend on the replacement token",
        source=SOURCE,
        measured=measured,
        holds=None,
        ci=True,
        criterion=f"indicative: {NO_RULE}; each method's paired nAOPC difference between the {second} and the {first} replacement, "
        "per direction, with its document-cluster bootstrap interval at its Holm level (one Holm family over methods and directions)",
        numbers={"sample": sample, "replacement_differences": moved},
    )


def flow_claims(summary: dict, settings: ErasureSettings, *, status: str, windows: str = "documents") -> list:
    """The claims of the erasure test (primary family: KL, primary replacement), each decided by
    its pairs' intervals within Holm's step-down; claims of an exploratory run are indicative
    (its sample is marked low-power: :func:`geolens.claims.sample_size`'s ``exploratory``).
    Each claim's sample (:func:`geolens.claims.sample_size`) counts the primary family's
    ``windows`` (the documents with a prediction in range) against the protocol's minimum."""
    from geolens.claims import Claim, sample_size

    primary = summary["families"]["primary"]
    pairs, methods = primary["pairs"], settings.methods
    decided = status == "pre-registered"
    sample = sample_size(
        primary["n_documents"], windows=windows, minimum=PROTOCOL_MIN_DOCUMENTS, exploratory=not decided
    )
    rc = summary["range_check"][primary["replacement"]]
    tail = f"; {rc['excluded_kl']} of {rc['n_predictions']} predictions out of range" + (
        "" if decided else f"; {status} run"
    )
    claims = []

    def decide(found: list[str]) -> bool | None:
        if "against" in found:
            return False
        return True if found and all(f == "for" for f in found) else None

    if "contribution" in methods:
        for other in [m for m in methods if m not in ("contribution", "random")]:
            found, said = [], []
            for d in DIRECTIONS:
                p = _pair(pairs, d, "contribution", other)
                found.append(_favour(p, "contribution"))
                said.append(f"{d}: {_said(p, 'contribution')}")
            claims.append(
                Claim(
                    claim=f"Contribution flow attributes next-token predictions to input tokens more faithfully than {CITED.get(other, LABELS[other])}",
                    source=SOURCE,
                    measured="paired nAOPC difference in contribution flow's favour (KL, "
                    + primary["replacement"]
                    + " replacement) "
                    + "; ".join(said)
                    + tail,
                    holds=decide(found),
                    ci=True,
                    criterion="in both directions the pair's interval at its Holm level (primary family) lies on contribution flow's side; "
                    "false when either lies on the other side",
                    numbers={"sample": sample, "pairs": [_pair(pairs, d, "contribution", other) for d in DIRECTIONS]},
                )
            )
    if "random" in methods:
        found, said = [], []
        for m in [m for m in methods if m != "random"]:
            for d in DIRECTIONS:
                p = _pair(pairs, d, "random", m)
                found.append(_favour(p, m))
                said.append(f"{LABELS[m]} {d[:4]}. {_said(p, m)}")
        claims.append(
            Claim(
                claim="Every attribution method erases more faithfully than a random ranking",
                source=SOURCE,
                measured="; ".join(said) + tail,
                holds=decide(found),
                ci=True,
                criterion="every method's pair with random, in both directions, is decided in the method's favour (primary family)",
                numbers={"sample": sample},
            )
        )
    best = summary.get("most_faithful", {})
    said = []
    for d in DIRECTIONS:
        b = best.get(d)
        said.append(
            f"{d}: "
            + (
                f"{LABELS[b['method']]}, by at least {b['by']:+.3g} [{b['ci_low']:+.3g}, {b['ci_high']:+.3g}] over {LABELS[b['against']]}"
                if b
                else "no method beats every other"
            )
        )
    claims.append(
        Claim(
            claim="The most faithful method at input level",
            source=SOURCE,
            measured="; ".join(said) + tail,
            holds=None,
            criterion="descriptive: the method whose pairs with every other method are decided in its favour (primary family)",
            numbers={"sample": sample, "most_faithful": best},
        )
    )
    moved = summary.get("replacement_differences")
    if moved is not None and moved["robustness"] is not None:
        claims.append(replacement_claim(moved, windows=windows, status=status))
    if "induction_check" in summary and "skipped" not in summary["induction_check"]:
        ic = summary["induction_check"]
        said = [
            f"{LABELS.get(m, m)} {r['passed']}/{r['n']} (without BOS {r['passed_no_bos']}/{r['n']}; median rank of the copied source "
            f"{r['median_rank_target']:g}, median gap {r['median_gap_when_failing']:.3g})"
            for m, r in ic.items()
        ]
        claims.append(
            Claim(
                claim="Known answer: on a repeated random sequence the flow into the second occurrence of a token puts its largest share outside "
                "the position itself on the token that followed the first occurrence",
                source="known-answer check (docs/flow/PROTOCOL.md §6)",
                measured="queries that pass: " + "; ".join(said),
                holds=None,
                criterion="descriptive: a check on one sequence, reported per method with the margin by which it misses",
                numbers={"induction_check": ic},
            )
        )
    return claims


__all__ = [
    "LISTED",
    "FlowParams",
    "FlowRun",
    "PromptFlow",
    "flow_claims",
    "prompt_flow",
    "replacement_claim",
    "run_flow",
    "top_tokens",
]
