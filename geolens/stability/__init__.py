"""Stability of published verdicts: leave one document out, leave one layer out
(the registered analysis plan, docs/stability/PROTOCOL.md).

A verdict decided by a confidence interval after Holm's correction can still rest on one document
or one layer. For each published Holm family (:func:`geolens.stability.families.published_families`)
:func:`assess` recomputes the whole family, by the function that produced it, once per document
left out and once per layer left out, and reports for each test the share of leave-outs that keep
its verdict and the verdicts it flips to. A verdict kept in fewer than :data:`FRAGILE_BELOW` of
either kind of leave-out is ``"fragile"``, else ``"stable"``; a "not testable" comparison has no
label.

    python -m geolens.stability --out docs/stability/results

>>> from collections import Counter
>>> label_of({"share": 0.99}, {"share": 0.90})
'fragile'
>>> label_of({"share": 1.0}, None)
'stable'
"""

from __future__ import annotations

import time
from collections import Counter

from geolens.stability.families import Family, key_of, published_families

FRAGILE_BELOW = 0.95


def label_of(documents: dict | None, layers: dict | None) -> str:
    """``"fragile"`` when either leave-out keeps the verdict in fewer than 95 % of its cases."""
    shares = [part["share"] for part in (documents, layers) if part is not None and part.get("share") is not None]
    return "fragile" if any(s < FRAGILE_BELOW for s in shares) else "stable"


def _relative(folder) -> str:
    """The folder as the repository names it (``docs/...``), else as given."""
    from pathlib import Path

    parts = Path(folder).resolve().parts
    return "/".join(parts[parts.index("docs") :]) if "docs" in parts else str(folder)


def _tally(published: str, verdicts: list[str]) -> dict:
    flips = Counter(v for v in verdicts if v != published)
    kept = len(verdicts) - sum(flips.values())
    return dict(
        n=len(verdicts), kept=kept, share=kept / len(verdicts) if verdicts else None, flips=dict(sorted(flips.items()))
    )


def assess(family: Family, progress=print) -> dict:
    """The stability of every test of ``family`` (module docstring), and whether recomputing it
    from its rows with nothing left out gives the published verdicts (``reproduces``)."""
    start = time.perf_counter()
    published = {key_of(t): t for t in family.published}
    base = {key_of(t): t["verdict"] for t in family.compute()}
    mismatch = [k for k, t in published.items() if base.get(k) != t["verdict"]]
    by_document = [{key_of(t): t["verdict"] for t in family.compute(document=d)} for d in family.documents]
    by_layer = (
        [{key_of(t): t["verdict"] for t in family.compute(layer=l)} for l in family.layers]
        if family.layers is not None
        else None
    )
    tests = []
    for key, t in published.items():
        entry = dict(test=key, a=t.get("a"), b=t.get("b"), direction=t.get("direction"), verdict=t["verdict"])
        if t["verdict"] == "not testable":
            tests.append(dict(entry, label=None))
            continue
        docs = _tally(t["verdict"], [v.get(key, "absent") for v in by_document])
        layers = None if by_layer is None else _tally(t["verdict"], [v.get(key, "absent") for v in by_layer])
        tests.append(dict(entry, documents=docs, layers=layers, label=label_of(docs, layers)))
    seconds = time.perf_counter() - start
    progress(f"stability: {family.name}, {family.model}: {len(tests)} tests, {seconds:.0f} s")
    return dict(
        family=family.name,
        model=family.model,
        folder=_relative(family.folder),
        unit=family.unit,
        n_units=len(family.documents),
        n_layers=None if family.layers is None else len(family.layers),
        layers_not_applicable=family.layers_why or None,
        reproduces=not mismatch,
        mismatches=mismatch,
        n_fragile=sum(t["label"] == "fragile" for t in tests),
        n_tests=sum(t["label"] is not None for t in tests),
        tests=tests,
        seconds=round(seconds, 1),
    )


__all__ = ["FRAGILE_BELOW", "assess", "label_of", "published_families", "key_of"]
