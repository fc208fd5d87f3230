"""The report's data model and its two renderings: one self-contained HTML page and one JSON file.

A report is a list of :class:`Section` objects (each with its figures, tables, numbers and paper
claims) plus the run's parameters and versions. :func:`render_html` writes a page that needs no
network: circuitsvis' local JavaScript bundle is inlined once in ``<head>``, matplotlib figures are
embedded as base64 PNG. :func:`report_json` holds every figure's numbers, every table, every claim
with the numbers behind it, the parameters and the versions.
"""

from __future__ import annotations

import html
import json
import platform
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import pandas as pd

from geolens.report.citations import REFERENCES, cite_text, references_html, references_of, source_html
from geolens.report.columns import header, humanise_values, legend
from geolens.viz.common import HTMLView, PlotView, bundle_script, circuitsvis_version, to_jsonable


@dataclass
class Claim:
    """A paper claim next to what this run measured.

    ``holds`` is decided from the measured numbers by ``criterion`` (``None`` when the claim is
    descriptive and gives no criterion); ``numbers`` are the values behind ``measured``.
    """

    claim: str
    source: str
    measured: str
    holds: bool | None
    criterion: str
    numbers: dict[str, Any] = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        return {True: "holds", False: "does not hold", None: "descriptive"}[self.holds]


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
    ``references`` the full citations it refers to; the other texts carry the citation too."""
    return {
        "claim": cite_text(c.claim),
        "source": c.source,
        "citation": cite_text(c.source),
        "references": [r.full for r in references_of(c.source)],
        "measured": cite_text(c.measured),
        "holds": c.holds,
        "verdict": c.verdict,
        "criterion": cite_text(c.criterion),
        "numbers": c.numbers,
    }


_CSS = """
body { font-family: -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; margin: 24px auto;
       max-width: 1200px; padding: 0 16px; color: #222; line-height: 1.45; }
h1 { margin-bottom: 0; } h2 { border-bottom: 1px solid #ddd; padding-bottom: 4px; margin-top: 36px; }
.meta { color: #555; font-size: 0.9em; }
table.geolens-table { border-collapse: collapse; font-size: 0.85em; margin: 8px 0 16px 0; }
table.geolens-table th, table.geolens-table td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
table.geolens-table th { background: #f4f4f4; white-space: normal; max-width: 11em; vertical-align: bottom;
                         text-align: center; font-weight: 600; overflow-wrap: break-word; }
table.claims td { text-align: left; vertical-align: top; }
table.claims th { max-width: none; }
p.table-legend { font-size: 0.8em; color: #555; margin: -10px 0 14px 0; max-width: 100%; }
.cite { font-size: 0.85em; color: #555; } ul.references li { margin-bottom: 4px; }
td.holds { color: #11772d; font-weight: bold; } td.fails { color: #b3261e; font-weight: bold; }
td.descriptive { color: #555; }
figure { margin: 12px 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption, .geolens-caption { font-size: 0.85em; color: #555; }
details { margin: 8px 0; } nav a { margin-right: 12px; }
.geolens-view { overflow-x: auto; }
.table-scroll { overflow-x: auto; max-width: 100%; }
"""


def table_legend(df: pd.DataFrame, note: str = "") -> str:
    """The one-line legend under a table: what each column holds (:mod:`geolens.report.columns`)."""
    text = legend(df.columns)
    return " ".join(t for t in (cite_text(note), text) if t)


def _table_html(df: pd.DataFrame, note: str = "") -> str:
    """A table inside a horizontally scrolling box, so a wide table never widens the page; human
    column names (machine names in report.json) and, under it, the one-line legend."""
    shown = humanise_values(df)
    shown.columns = [header(c) for c in df.columns]
    shown.columns.name = None
    table = shown.to_html(index=False, border=0, classes="geolens-table", float_format=lambda v: f"{v:.4g}", na_rep="–")
    text = table_legend(df, note)
    tail = f'<p class="table-legend">{html.escape(text)}</p>' if text else ""
    return f'<div class="table-scroll">{table}</div>{tail}'


def _claims_html(report: Report) -> str:
    if not report.claims:
        return "<p>No section of this run tests a paper claim.</p>"
    rows = []
    for s in report.sections:
        for c in s.claims:
            cls = {True: "holds", False: "fails", None: "descriptive"}[c.holds]
            rows.append(
                "<tr>"
                f"<td>{html.escape(cite_text(c.claim))}</td><td>{source_html(c.source)}</td>"
                f"<td>{html.escape(cite_text(c.measured))}</td><td class=\"{cls}\">{html.escape(c.verdict)}</td>"
                f"<td>{html.escape(cite_text(c.criterion))}</td><td><a href=\"#{s.key}\">{html.escape(s.title)}</a></td>"
                "</tr>"
            )
    head = "<tr><th>paper claim</th><th>source (full citation)</th><th>measured (this run)</th><th>verdict</th><th>criterion</th><th>section</th></tr>"
    return f'<div class="table-scroll"><table class="geolens-table claims">{head}{"".join(rows)}</table></div>' + (
        f'<p class="table-legend">{CLAIMS_LEGEND}</p>'
    )


CLAIMS_LEGEND = (
    "paper claim: what the cited paper states; source: the paper and its section, with the full citation; "
    "measured: the number behind the verdict in this run, with its sample size; verdict: holds / does not hold "
    "by the criterion, or descriptive when the paper gives no criterion (or the run has too few documents); "
    "criterion: the rule applied; section: where the figure and tables are."
)


def _ref_link(key: str) -> str:
    ref = next(r for r in REFERENCES if r.key == key)
    return f'<a href="#ref-{key}">{html.escape(ref.short)}</a>'


def _figure_html(fig: PlotView | HTMLView) -> str:
    if isinstance(fig, HTMLView):
        return fig.fragment(include_bundle=False)
    title = html.escape(cite_text(fig.title))
    return (
        f'<figure><img alt="{title}" src="data:image/png;base64,{fig.to_base64_png()}">'
        f"<figcaption>{title}</figcaption></figure>"
    )


def render_html(report: Report) -> str:
    """One self-contained page: bundle inlined, PNGs embedded, no external resource."""
    p = report.params
    v = report.versions
    meta = (
        f"model <b>{html.escape(str(p.get('model')))}</b> ({html.escape(v.get('model_mode', '?'))}), corpus "
        f"<b>{html.escape(str(p.get('corpus')))}</b>, {p.get('n_sequences')} sequences × {p.get('seq_len')} tokens"
        f"{' (quick mode)' if p.get('quick') else ''}; created {html.escape(report.created)}.<br>"
        + ", ".join(f"{html.escape(k)} {html.escape(str(val))}" for k, val in v.items() if k != "model_mode")
        + ". Every number on this page is in <code>report.json</code>."
    )
    nav = " ".join(f'<a href="#{s.key}">{html.escape(s.title)}</a>' for s in report.sections)
    parts = [
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
        f"<title>geolens report: {html.escape(str(p.get('model')))}</title>",
        f"<style>{_CSS}</style>",
        bundle_script(),
        "</head><body>",
        "<h1>geolens report</h1>",
        f'<p class="meta">{meta}</p>',
        f'<nav><a href="#claims">Paper claim → measured</a> {nav} <a href="#references">References</a></nav>',
        '<section id="claims"><h2>Paper claim → measured</h2>',
        "<p>Each row compares a claim of the source papers, "
        f'{_ref_link("cunningham2026")} (contribution weights, sinks, faithfulness) and '
        f'{_ref_link("mudarisov2026")} (token selection, head taxonomy, pruning), with a number measured in '
        "this run; the verdict follows the stated criterion. Nothing here is copied from a paper.</p>",
        _claims_html(report),
        "</section>",
    ]
    for s in report.sections:
        parts.append(f'<section id="{s.key}"><h2>{html.escape(s.title)}</h2>')
        parts.append(f"<p>{cite_text(s.intro)}</p>")  # intros are written by geolens (trusted markup)
        if s.params:
            parts.append(f'<p class="meta">parameters: {html.escape(json.dumps(to_jsonable(s.params)))}; {s.seconds:.1f} s</p>')
        parts += [_figure_html(f) for f in s.figures]
        for caption, df, *note in s.tables:
            parts.append(f"<details open><summary>{html.escape(cite_text(caption))}</summary>{_table_html(df, *note)}</details>")
        parts.append("</section>")
    parts += [
        '<section id="references"><h2>References</h2>',
        "<p>Cited in the text by author and year; the claim table gives each claim's full citation.</p>",
        references_html(),
        "</section>",
        "</body></html>\n",
    ]
    return "\n".join(parts)
