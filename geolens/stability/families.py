"""The published Holm families, each recomputed from its stored rows with a subset left out.

A :class:`Family` knows one published family of one model: where its rows are, the verdicts as
published, the units it can leave out (documents, or questions for multiple choice; layers where
the rows carry them) and how to recompute the family, by the function that produced it, on the
remaining rows (:meth:`Family.compute`). :func:`published_families` lists them as the registered
plan names them (``docs/stability/protocol.json``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from geolens.files import read_json

KEY_FIELDS = ("family", "kind", "endpoint", "scope", "direction", "a", "b")


def key_of(test: dict) -> str:
    """A readable key naming one test of a family (its family, kind, scope, direction, a → b).

    >>> key_of({"direction": "comprehensiveness", "a": "raw_attention", "b": "contribution"})
    'comprehensiveness: raw_attention → contribution'
    """
    head = [str(test[k]) for k in KEY_FIELDS[:-2] if test.get(k) not in (None, "")]
    pair = f"{test['a']} → {test['b']}" if test.get("a") else str(test.get("b"))
    return ": ".join([" / ".join(head), pair]) if head else pair


@dataclass
class Family:
    """One published Holm family of one model, recomputable with units left out."""

    name: str
    model: str
    folder: Path
    published: list[dict]
    documents: list
    layers: list | None
    recompute: Callable[[object, object], list[dict]]  # (document left out, layer left out) -> tests
    unit: str = "document"
    layers_why: str = ""
    notes: list[str] = field(default_factory=list)

    def compute(self, document=None, layer=None) -> list[dict]:
        """The family's tests with ``document`` (a unit) or ``layer`` left out (None: all rows)."""
        return self.recompute(document, layer)


def _json(path: Path) -> dict:
    return read_json(path, str(path))  # geolens.files: a file that is not JSON is one line naming it


def _keep(frame: pd.DataFrame, document, layer, *, doc="document", lay="layer") -> pd.DataFrame:
    mask = np.ones(len(frame), dtype=bool)
    if document is not None:
        mask &= frame[doc].to_numpy() != document
    if layer is not None:
        mask &= frame[lay].to_numpy() != layer
    return frame[mask]


def _tests(pairs) -> list[dict]:
    return [dict(p) for p in (pairs.to_dict("records") if isinstance(pairs, pd.DataFrame) else pairs)]


# ---------------------------------------------------------------------------------------------
# One builder per kind of family


def per_term_p2(docs: Path, model: str) -> Family:
    from geolens.faithfulness.ground_truth import ground_truth_summary

    folder = docs / "faithfulness" / model
    twin = _json(docs / "faithfulness" / "protocol.json")
    st = twin["statistics"]
    rows = pd.read_csv(folder / "per_term_rows.csv.gz")
    pairs = [tuple(p) for p in twin["pairs"]]

    def recompute(document, layer):
        part = ground_truth_summary(
            _keep(rows, document, layer),
            pairs,
            n_boot=int(st["n_boot"]),
            seed=int(st["seed"]),
            alpha=float(st["alpha"]),
        )
        return _tests(part["pairs"])

    published = _json(folder / "summary.json")["per_term_effects"]["pairs"]
    return Family(
        "protocol 2 per-term", model, folder, published, sorted(set(rows.document)), sorted(set(rows.layer)), recompute
    )


def masking_p2(docs: Path, model: str) -> Family:
    from geolens.faithfulness.masking_summary import masking_summary

    folder = docs / "faithfulness" / model
    twin = _json(docs / "faithfulness" / "protocol.json")
    rows = pd.read_csv(folder / "masking_rows.csv.gz")

    def recompute(document, layer):
        return _tests(masking_summary(_keep(rows, document, layer), twin, family_only=True)["pairs"])

    published = _json(folder / "summary.json")["masking"]["pairs"]
    return Family(
        "protocol 2 masking", model, folder, published, sorted(set(rows.document)), sorted(set(rows.layer)), recompute
    )


def per_term_p3(docs: Path, model: str) -> Family:
    from geolens.faithfulness.norm_controlled_stats import statistics_table
    from geolens.faithfulness.norm_controlled_summary import norm_controlled_summary

    folder = docs / "faithfulness" / "v3" / model
    twin = _json(docs / "faithfulness" / "v3" / "protocol.json")
    terms = pd.read_csv(folder / "per_term_terms.csv.gz")
    positions = pd.read_csv(folder / "per_term_positions.csv.gz")
    factor = float(twin["numerical_floor"]["resolvable_factor"])
    stats = statistics_table(terms, positions, resolvable_factor=factor)  # per position: computed once
    layer_of = positions.set_index(["document", "position"]).layer

    def recompute(document, layer):
        keep = _keep(positions, document, layer)
        index = pd.MultiIndex.from_frame(stats[["document", "position"]])
        wanted = pd.MultiIndex.from_frame(keep[["document", "position"]])
        part = norm_controlled_summary(None, keep, twin, stats=stats[index.isin(wanted)], family_only=True)
        return _tests(part["pairs"])

    published = _json(folder / "summary.json")["per_term_effects"]["norm_controlled"]["pairs"]
    return Family(
        "protocol 3 per-term",
        model,
        folder,
        published,
        sorted(set(positions.document)),
        sorted(set(layer_of)),
        recompute,
    )


def masking_addendum(docs: Path, model: str, *, corrected: bool) -> Family:
    from geolens.faithfulness.masking_summary import masking_summary_no_exclusion

    folder = docs / "faithfulness" / "v3" / "masking" / model
    twin = _json(docs / "faithfulness" / "v3" / "masking" / "protocol.json")
    p4 = _json(docs / "faithfulness" / "v4" / "protocol.json")
    drop = [tuple(t) for t in p4["addendum_correction"]["drop"]] if corrected else []
    rows = pd.read_csv(folder / "masking_rows.csv.gz")

    def recompute(document, layer):
        part = masking_summary_no_exclusion(_keep(rows, document, layer), twin, drop=drop, family_only=True)
        return _tests(part["pairs"])

    summary = _json(folder / "summary.json")
    if corrected:
        correction = docs / "faithfulness" / "v4" / f"{model}-addendum-correction" / "corrected_family.json"
        if not correction.is_file():
            raise FileNotFoundError(f"{correction}: run scripts/protocol4.py addendum-correction first")
        published = _json(correction)["corrected_tests"]
        name = "protocol 3 addendum masking (corrected, 15 tests)"
    else:
        published, name = summary["masking"]["pairs"], "protocol 3 addendum masking (as published, 16 tests)"
    return Family(name, model, folder, published, sorted(set(rows.document)), sorted(set(rows.layer)), recompute)


def multiple_choice(docs: Path, model: str, *, addendum: bool) -> Family:
    from geolens.faithfulness.mc_stats import pair_tests

    base = docs / "faithfulness" / ("v3/masking" if addendum else "")
    folder = base / f"{model}-mc"
    twin = _json(base / "protocol.json")
    summary = _json(folder / "summary.json")
    table = pd.read_csv(folder / "mc_questions.csv")
    metrics = [c.split(":", 1)[1] for c in table.columns if c.startswith("margin_drop:")]
    masked = table[table[f"margin_drop:{metrics[0]}"].notna()].reset_index(drop=True)
    columns = {m: [c for c in masked.columns if c.startswith(f"margin:{m}:L")] for m in metrics}
    layers = sorted({int(c.split(":L")[1].split(":")[0]) for c in columns[metrics[0]]})
    pairs = [(p["a"], p["b"]) for p in summary["pairs"]]
    identical = {(p["a"], p["b"]) for p in summary["pairs"] if p.get("identical_masks")}
    mc = twin.get("multiple_choice", {})
    n_boot, seed = int(mc.get("n_boot", 2000)), int(mc.get("seed", twin.get("statistics", {}).get("seed", 0)))
    alpha = float(twin.get("statistics", {}).get("alpha", 0.05))
    keys = masked.task.astype(str) + "/" + masked.qid.astype(str)

    def recompute(question, layer):
        keep = np.ones(len(masked), dtype=bool) if question is None else (keys != question).to_numpy()
        part = masked[keep]
        drops = {}
        for m in metrics:
            cols = [c for c in columns[m] if layer is None or int(c.split(":L")[1].split(":")[0]) != layer]
            drops[m] = (part.margin - part[cols].mean(axis=1)).to_numpy()
        tests = pair_tests(
            drops, part.task.to_numpy(), pairs, identical=identical, n_boot=n_boot, seed=seed, alpha=alpha
        )
        return _tests(tests)

    name = "protocol 3 addendum multiple choice" if addendum else "protocol 2 multiple choice"
    return Family(name, model, folder, summary["pairs"], list(keys), layers, recompute, unit="question")


def flow(docs: Path, model: str, version: str) -> Family:
    from geolens.flow.erasure import ErasureSettings
    from geolens.flow.summary import family_tables, naopc_table

    folder = docs / "flow" / (f"{version}/" if version != "v1" else "") / model
    summary = _json(folder / "summary.json")
    settings = ErasureSettings(**summary["settings"])
    conditions = pd.read_csv(folder / "erasure_conditions.csv.gz")
    rankings = pd.read_csv(folder / "erasure_rankings.csv.gz", dtype={"order": str})
    roles = list(zip(("primary", "robustness"), settings.replacements))

    def recompute(document, layer):
        naopc = naopc_table(_keep(conditions, document, None), settings)
        ranks = _keep(rankings, document, None)
        out = []
        for role, r in roles:
            pairs = family_tables(naopc, ranks, settings, r, "kl", verdicts=True)["pairs"]
            out += [dict(p, family=role) for p in _tests(pairs)]
        return out

    published = [dict(p, family=role) for role, _ in roles for p in summary["families"][role]["pairs"]]
    return Family(
        f"flow {version}",
        model,
        folder,
        published,
        sorted(set(conditions.document)),
        None,
        recompute,
        layers_why="input tokens are erased: no layer",
    )


def sink_controls(docs: Path, model: str) -> Family:
    from geolens.sinks.controls_dose import read_windows
    from geolens.sinks.controls_protocol import read_protocol
    from geolens.sinks.controls_summary import dose_summary

    folder = docs / "sinks" / f"controls-{model}"
    summary = _json(folder / "controls_summary.json")
    windows = read_windows(folder / "controls_windows.csv")
    protocol = read_protocol(docs / "faithfulness" / "protocol.json")[0]

    def recompute(document, layer):
        part = dose_summary(
            _keep(windows, document, None),
            protocol,
            verdicts=True,
            level=0.95,
            not_testable=summary.get("not_testable"),
        )
        return _tests(part["pairs"])

    return Family(
        "sink controls",
        model,
        folder,
        summary["pairs"],
        sorted(set(windows.document)),
        None,
        recompute,
        layers_why="the sink's value is edited in several layers at once: no layer to leave out",
    )


def beyond_norm(docs: Path, model: str) -> Family | None:
    from geolens.faithfulness.beyond_norm import beyond_norm_summary

    folder = docs / "faithfulness" / "v4" / f"{model}-beyond-norm"
    if not (folder / "summary.json").is_file():
        return None
    twin = _json(docs / "faithfulness" / "v4" / "protocol.json")
    src = twin["beyond_norm"]["source"][model]
    terms = pd.read_csv(docs.parent / src["per_term_terms.csv.gz"]["path"])
    positions = pd.read_csv(docs.parent / src["per_term_positions.csv.gz"]["path"])
    summary = _json(folder / "summary.json")
    cache: dict = {}

    def recompute(document, layer):
        part = beyond_norm_summary(_keep(terms, document, layer), _keep(positions, document, layer), twin, groups=cache)
        return [dict(t, family="primary") for t in part["tests"]] + [
            dict(t, family="within heads") for t in part["sensitivity_tests"]
        ]

    published = [dict(t, family="primary") for t in summary["tests"]] + [
        dict(t, family="within heads") for t in summary["sensitivity_tests"]
    ]
    return Family(
        "protocol 4 beyond the norm",
        model,
        folder,
        published,
        sorted(set(positions.document)),
        sorted(set(positions.layer)),
        recompute,
    )


def matched_masking(docs: Path, model: str) -> Family | None:
    from geolens.faithfulness.matched_summary import matched_masking_summary

    folder = docs / "faithfulness" / "v4" / f"{model}-masking"
    if not (folder / "summary.json").is_file():
        return None
    twin = _json(docs / "faithfulness" / "v4" / "protocol.json")
    rows = pd.read_csv(folder / "matched_masking_rows.csv.gz")
    stored = pd.read_csv(docs.parent / twin["matched_masking"]["stored_rows"][model]["path"])

    def recompute(document, layer):
        return _tests(matched_masking_summary(_keep(rows, document, layer), stored, twin)["tests"])

    published = _json(folder / "summary.json")["tests"]
    return Family(
        "protocol 4 masking against a size-matched control",
        model,
        folder,
        published,
        sorted(set(rows.document)),
        sorted(set(rows.layer)),
        recompute,
    )


def published_families(docs: Path, models=("smollm2-135m", "gemma3-270m")) -> list[Family]:
    """Every family of the registered plan that has results under ``docs``, in the plan's order."""
    out: list[Family] = []
    for model in models:
        builders = [
            lambda: per_term_p2(docs, model),
            lambda: masking_p2(docs, model),
            lambda: multiple_choice(docs, model, addendum=False),
            lambda: per_term_p3(docs, model),
            lambda: masking_addendum(docs, model, corrected=True),
            lambda: masking_addendum(docs, model, corrected=False),
            lambda: multiple_choice(docs, model, addendum=True),
            lambda: flow(docs, model, "v1"),
            lambda: flow(docs, model, "v2") if (docs / "flow" / "v2" / model / "summary.json").is_file() else None,
            lambda: flow(docs, model, "v3"),
            lambda: sink_controls(docs, model),
            lambda: beyond_norm(docs, model),
            lambda: matched_masking(docs, model),
        ]
        for build in builders:
            family = build()
            if family is not None:
                out.append(family)
    return out


__all__ = ["Family", "published_families", "key_of"]
