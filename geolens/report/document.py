"""The report's data model and its two renderings: one self-contained HTML page and one JSON file.

A report is a list of :class:`Section` objects (each with its figures, tables, numbers and paper
claims, :class:`geolens.claims.Claim`) plus the run's parameters and versions. :func:`render_html`
fills the page template (``templates/report.html.j2``, :mod:`geolens.report.pages`); the page needs
no network: circuitsvis' local JavaScript bundle is inlined once in ``<head>``, matplotlib figures
are embedded as base64 PNG. :func:`report_json` holds every figure's numbers, every table, every
claim with the numbers behind it, the parameters and the versions.
"""

from __future__ import annotations

import json
import platform
from dataclasses import dataclass, field
from datetime import datetime, timezone
from html import escape
from typing import Any

import pandas as pd

from geolens.claims import Claim
from geolens.report.citations import REFERENCES, cite_text, references_html, references_of, source_html
from geolens.report.columns import header, humanise_values, legend
from geolens.report.pages import render_page
from geolens.viz.common import HTMLView, PlotView, bundle_script, circuitsvis_version, to_jsonable


@dataclass
class Section:
    """One section of the report: text, figures (matplotlib or circuitsvis), tables, numbers."""

    key: str
    title: str
    intro: str
    figures: list[PlotView | HTMLView] = field(default_factory=list)
    # (caption, table) or (caption, table, note): the note opens the table's one-line legend
    tables: list[tuple] = field(default_factory=list)
    numbers: dict[str, Any] = field(default_factory=dict)
    claims: list[Claim] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass
class Report:
    sections: list[Section]
    params: dict[str, Any]
    versions: dict[str, str]
    created: str = field(default_factory=lambda: datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))

    @property
    def claims(self) -> list[Claim]:
        return [c for s in self.sections for c in s.claims]


def versions(model=None) -> dict[str, str]:
    """torch, transformers, transformer_lens, circuitsvis, geolens, python; the model's TL mode."""
    from importlib.metadata import PackageNotFoundError, version

    import torch

    import geolens

    out = {"geolens": geolens.__version__, "torch": torch.__version__, "python": platform.python_version()}
    for dist, key in (("transformers", "transformers"), ("transformer-lens", "transformer_lens")):
        try:
            out[key] = version(dist)
        except PackageNotFoundError:
            out[key] = "not installed"
    out["circuitsvis"] = circuitsvis_version()
    if model is not None:
        from geolens.adapter import model_mode

        out["model_mode"] = model_mode(model)
    return out


def report_json(report: Report) -> dict[str, Any]:
    """Every figure's numbers, tables, claims, parameters and versions, JSON-ready."""
    sections = {}
    for s in report.sections:
        sections[s.key] = {
            "title": s.title,
            "seconds": round(s.seconds, 2),
            "params": s.params,
            "numbers": s.numbers,
            "figures": [{"title": cite_text(f.title), "kind": type(f).__name__, "data": f.data} for f in s.figures],
            "tables": {caption: df for caption, df, *_ in s.tables},
            "table_legends": {caption: table_legend(df, *note) for caption, df, *note in s.tables},
            "claims": [_claim_json(c) for c in s.claims],
        }
    out = {
        "geolens_report": 1,
        "created": report.created,
        "params": report.params,
        "versions": report.versions,
        "sections": sections,
        "claims": [dict(_claim_json(c), section=s.key) for s in report.sections for c in s.claims],
        "references": [r.as_json() for r in REFERENCES],
    }
    return to_jsonable(out)


def _claim_json(c: Claim) -> dict[str, Any]:
    """``source`` keeps the machine key ("paper A §3.2"); ``citation`` is its author-year text and
    ``references`` the full citations it refers to; the other texts carry the citation too.

    ``criterion_met`` is the criterion's outcome on this run's numbers and ``ci`` whether it was
    decided by confidence intervals; ``holds`` is that outcome only where the claim is decided
    (:mod:`geolens.claims`), else null; ``decision``, ``verdict`` and ``why`` are what the page shows."""
    return {
        "claim": cite_text(c.claim),
        "source": c.source,
        "citation": cite_text(c.source),
        "references": [r.full for r in references_of(c.source)],
        "measured": cite_text(c.measured),
        "criterion_met": c.holds,
        "ci": c.ci,
        "holds": c.holds if c.decision in ("holds", "does not hold") else None,
        "decision": c.decision,
        "verdict": c.verdict,
        "why": c.why,
        "criterion": cite_text(c.criterion),
        "numbers": c.numbers,
    }


def table_legend(df: pd.DataFrame, note: str = "") -> str:
    """The one-line legend under a table: what each column holds (:mod:`geolens.report.columns`)."""
    text = legend(df.columns)
    return " ".join(t for t in (cite_text(note), text) if t)


def _table_html(df: pd.DataFrame) -> str:
    """A table with human column names (machine names in report.json); the page puts it in a
    horizontally scrolling box, so that a wide table never widens the page, with its legend under it."""
    shown = humanise_values(df)
    shown.columns = [header(c) for c in df.columns]
    shown.columns.name = None
    return shown.to_html(index=False, border=0, classes="geolens-table", float_format=lambda v: f"{v:.4g}", na_rep="–")


CLAIMS_LEGEND = (
    "paper claim: what the cited paper states (for contribution flow: the hypothesis of geolens' pre-registered erasure "
    "test); source: the paper and its section, with the full citation; "
    "measured: the numbers behind the verdict in this run; verdict: holds / does not hold when the criterion was "
    "decided by confidence intervals on at least the claim's minimum sample (for faithfulness the 100 documents "
    "its protocol fixes, otherwise 20 windows and two seeds), indicative with its sample when not, undecided when "
    "the intervals could not decide, descriptive when the paper gives no criterion; criterion: the rule applied; "
    "section: where the figure and tables are."
)


def _ref_link(key: str) -> str:
    ref = next(r for r in REFERENCES if r.key == key)
    return f'<a href="#ref-{key}">{escape(ref.short)}</a>'


def _figure(fig: PlotView | HTMLView) -> dict:
    if isinstance(fig, HTMLView):
        return {"html": fig.fragment(include_bundle=False)}
    return {"html": None, "title": cite_text(fig.title), "png": fig.to_base64_png()}


def render_html(report: Report) -> str:
    """One self-contained page: bundle inlined, PNGs embedded, no external resource."""
    p, v = report.params, report.versions
    claims = [
        dict(
            claim=cite_text(c.claim),
            source=source_html(c.source),
            measured=cite_text(c.measured),
            verdict=c.verdict,
            decision=c.decision,
            why=c.why,
            criterion=cite_text(c.criterion),
            section_key=s.key,
            section_title=s.title,
        )
        for s in report.sections
        for c in s.claims
    ]
    sections = [
        dict(
            key=s.key,
            title=s.title,
            intro=cite_text(s.intro),  # intros are written by geolens (trusted markup)
            params=json.dumps(to_jsonable(s.params)) if s.params else "",
            seconds=f"{s.seconds:.1f}",
            figures=[_figure(f) for f in s.figures],
            tables=[
                dict(caption=cite_text(caption), html=_table_html(df), legend=table_legend(df, *note))
                for caption, df, *note in s.tables
            ],
        )
        for s in report.sections
    ]
    return render_page(
        "report.html.j2",
        page_class="",
        bundle=bundle_script(),
        references=references_html(),
        model=str(p.get("model")),
        model_mode=v.get("model_mode", "?"),
        corpus=str(p.get("corpus")),
        n_sequences=p.get("n_sequences"),
        seq_len=p.get("seq_len"),
        quick=bool(p.get("quick")),
        created=report.created,
        versions=[(k, str(val)) for k, val in v.items() if k != "model_mode"],
        cite_a=_ref_link("cunningham2026"),
        cite_b=_ref_link("mudarisov2026"),
        claims=claims,
        n_indicative=sum(c["decision"] == "indicative" for c in claims),
        claims_legend=CLAIMS_LEGEND,
        sections=sections,
    )
