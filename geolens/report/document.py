"""The report's data model and its two renderings: one self-contained HTML page and one JSON file.

A report is a list of :class:`Section` objects (each with its figures, tables, numbers and paper
claims, :class:`geolens.claims.Claim`) plus the run's parameters and versions. :func:`render_html`
fills the page template (``templates/report.html.j2``, :mod:`geolens.report.pages`); the page needs
no network: circuitsvis' local JavaScript bundle is inlined once in ``<head>``, matplotlib figures
are embedded as base64 PNG. :func:`report_json` holds every figure's numbers, every table, every
claim with the numbers behind it, the parameters and the versions.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass, field
from datetime import datetime, timezone
from html import escape
from typing import Any

import numpy as np
import pandas as pd

from geolens.claims import Claim, estimate_text, without_empty_intervals
from geolens.report.citations import REFERENCES, cite_text, references_html, references_of, source_html
from geolens.report.columns import header, humanise_values, legend
from geolens.report.pages import render_page
from geolens.viz.common import HTMLView, PlotView, bundle_script, circuitsvis_version, to_jsonable


@dataclass
class Finding:
    """One headline number of a section, for the report's first screen: ``title`` says what it
    shows, ``what`` what exactly was measured, ``value`` the estimate with its interval ``low`` …
    ``high`` (at ``level``; None when none was computed) over ``n`` units of kind ``units``.

    The section computes it from its pipeline's results; the page only prints it, by
    :func:`geolens.claims.estimate_text` (no interval below two units, none of zero width).
    ``figure`` is the index in the section's figures of the one that shows it (a matplotlib one
    can open the page). ``level_why`` says in words why ``level`` is not 95 % (the interval of a
    Holm step: wider, so that the family of tests keeps a 5 % error rate); the page prints it."""

    title: str
    what: str
    value: float
    low: float | None
    high: float | None
    n: int
    units: str
    fmt: str = "+.3f"
    level: float = 0.95
    figure: int | None = None
    level_why: str | None = None  # why the level is not 95 %, in words (a Holm step's level)

    @property
    def estimate(self) -> str:
        """The value, with its interval only where one is printed (:func:`geolens.claims.estimate_text`)."""
        return estimate_text(self.value, self.low, self.high, self.n, fmt=self.fmt).split(" (", 1)[0]

    @property
    def interval_shown(self) -> bool:
        return self.estimate.endswith("]")

    @property
    def sample(self) -> str:
        """``95% CI, n = 8 corpus windows``, or why no interval is printed: ``n = 1 held-out
        window, no interval``, ``n = 8 corpus windows, no interval`` (none computed),
        ``…, interval of zero width``."""
        units = self.units[:-1] if self.n == 1 and self.units.endswith("windows") else self.units
        if self.interval_shown:
            level = f"{100 * self.level:.3g}% CI"
            if abs(self.level - 0.95) > 1e-9:
                level += f" ({self.level_why or 'a Holm-adjusted level: its family of tests keeps a 5% error rate'})"
            return f"{level}, n = {self.n} {units}"
        why = estimate_text(self.value, self.low, self.high, self.n, fmt=self.fmt).split(" (", 1)[1].rstrip(")")
        return f"n = {self.n} {units}, {why.split(', ')[-1]}"

    def as_json(self, section: str) -> dict[str, Any]:
        """What the first screen prints, with the numbers behind it (``ci_low``/``ci_high`` are
        null when the page prints no interval)."""
        shown = self.interval_shown
        return {
            "section": section,
            "title": cite_text(self.title),
            "what": cite_text(self.what),
            "value": self.value,
            "ci_low": self.low if shown else None,
            "ci_high": self.high if shown else None,
            "level": self.level if shown else None,
            "n": self.n,
            "units": self.units,
            "estimate": self.estimate,
            "sample": self.sample,
        }


@dataclass
class Section:
    """One section of the report: text, figures (matplotlib or circuitsvis), tables, numbers, and
    its headline findings (:class:`Finding`)."""

    key: str
    title: str
    intro: str
    figures: list[PlotView | HTMLView] = field(default_factory=list)
    # (caption, table) or (caption, table, note): the note opens the table's one-line legend
    tables: list[tuple] = field(default_factory=list)
    numbers: dict[str, Any] = field(default_factory=dict)
    claims: list[Claim] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0  # wall time of the section's own work (after the shared corpus pass)
    cpu_seconds: float = 0.0  # this process's CPU time over the same span, all threads
    findings: list[Finding] = field(default_factory=list)
    appendix: bool = False  # superseded material of the full report, shown after every current section


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


HEADLINE_ORDER = ("contributions", "faithfulness", "flow", "selection", "pruning", "sinks", "taxonomy")
"""Whose finding leads the first screen: the claim the report is named after first (attention vs
contribution), then the current protocols' tests; a section not listed comes after, in page order."""
MAX_FINDINGS = 5
SHORT_VERSIONS = ("geolens", "torch", "transformers", "transformer_lens")


def headline(report: Report) -> list[tuple[Section, Finding]]:
    """The first screen's findings: the first :class:`Finding` of each current (not appendix)
    section, in :data:`HEADLINE_ORDER`, at most :data:`MAX_FINDINGS`."""
    rank = {key: i for i, key in enumerate(HEADLINE_ORDER)}
    current = sorted(
        (s for s in report.sections if s.findings and not s.appendix), key=lambda s: rank.get(s.key, len(rank))
    )
    return [(s, s.findings[0]) for s in current][:MAX_FINDINGS]


def lead_figure(picked: list[tuple[Section, Finding]]) -> tuple[Section, int] | None:
    """The figure the first screen shows: the first headline finding's own matplotlib figure,
    else the first matplotlib figure of a headline section (a circuitsvis view is too tall)."""
    for section, finding in picked:
        if finding.figure is not None and isinstance(section.figures[finding.figure], PlotView):
            return section, finding.figure
    for section, _ in picked:
        for i, fig in enumerate(section.figures):
            if isinstance(fig, PlotView):
                return section, i
    return None


def timing_lines(report: Report, model_load_seconds: float, threads: int) -> list[str]:
    """What ``geolens report`` prints after a run: quick mode's one line of what it samples down, then
    the wall and CPU seconds of each part (as ``report.json`` keeps them)."""
    p = report.params
    lines = [f"\nquick mode samples down: {p['quick_sample']}"] if p.get("quick_sample") else []
    lines += [
        f"\nwall time per part ({'quick' if p.get('quick') else 'full'} run, {threads} torch threads):",
        f"{'':<40} {'wall':>7}   {'CPU':>7}",
        f"{'model load':<40} {model_load_seconds:7.1f} s",
        f"{'corpus pass (shared by the sections)':<40} {p['corpus_pass_seconds']:7.1f} s {p['corpus_pass_cpu_seconds']:7.1f} s",
    ]
    return lines + [f"{s.title:<40} {s.seconds:7.1f} s {s.cpu_seconds:7.1f} s" for s in report.sections]


def run_summary(report: Report) -> dict[str, Any]:
    """The run in one line: model, corpus, windows, tokens, time, versions in short."""
    p, v = report.params, report.versions
    n, seq_len, held = p.get("n_sequences"), p.get("seq_len"), p.get("n_heldout")
    return {
        "model": str(p.get("model")),
        "model_mode": v.get("model_mode", "?"),
        "corpus": str(p.get("corpus")),
        "n_windows": n,
        "seq_len": seq_len,
        "n_heldout": held,
        "n_tokens": (n + (held or 0)) * seq_len if isinstance(n, int) and isinstance(seq_len, int) else None,
        "seconds": p.get("report_seconds"),
        "quick": bool(p.get("quick")),
        "quick_sample": p.get("quick_sample"),
        "created": report.created,
        "versions": {k: str(v[k]) for k in SHORT_VERSIONS if k in v},
    }


def _first_screen_json(report: Report) -> dict[str, Any]:
    picked = headline(report)
    lead = lead_figure(picked)
    figure = None
    if lead is not None:
        section, index = lead
        figure = {"section": section.key, "index": index, "title": cite_text(section.figures[index].title)}
    return {
        "run": run_summary(report),
        "findings": [f.as_json(s.key) for s, f in picked],
        "figure": figure,
    }


_CI_PAIRS = (("ci_low", "ci_high"), ("top5_ci_low", "top5_ci_high"), ("plain_ci_low", "plain_ci_high"))


def _interval_columns(columns) -> list[tuple[str, str]]:
    """The (low, high) column pairs of a table: ``ci_low``/``ci_high`` and every ``x_lo``/``x_hi``."""
    names = [str(c) for c in columns]
    pairs = [(lo, hi) for lo, hi in _CI_PAIRS if lo in names and hi in names]
    pairs += [(c, c[:-3] + "_hi") for c in names if c.endswith("_lo") and c[:-3] + "_hi" in names]
    return pairs


def shown_table(df: pd.DataFrame) -> pd.DataFrame:
    """A table as the page and report.json show it: an interval whose two ends print the same
    (one window, or every resample equal) is left out (both ends NaN: "–" on the page, null in
    the JSON), so that no zero-width interval is printed."""
    pairs = _interval_columns(df.columns)
    if not pairs or not len(df):
        return df
    out = df.copy()
    by_name = {str(c): c for c in df.columns}
    for lo, hi in pairs:
        a, b = by_name[lo], by_name[hi]

        def same(x, y) -> bool:
            try:
                return bool(np.isfinite(x) and np.isfinite(y) and f"{x:.4g}" == f"{y:.4g}")
            except TypeError:
                return False

        empty = [same(x, y) for x, y in zip(out[a], out[b])]
        if any(empty):
            out[a] = out[a].astype(float).mask(empty)
            out[b] = out[b].astype(float).mask(empty)
    return out


def shown_measured(c: Claim) -> str:
    """A claim's measured text as printed: citations by author and year, and no interval from
    fewer than two units or of zero width (:func:`geolens.claims.without_empty_intervals`)."""
    n = c.sample["n_windows"] if c.sample else 2
    return without_empty_intervals(cite_text(c.measured), n)


def report_json(report: Report) -> dict[str, Any]:
    """Every figure's numbers, tables, claims, parameters and versions, JSON-ready; ``first_screen``
    is what opens the page (the run, the headline findings, the figure)."""
    sections = {}
    for s in report.sections:
        sections[s.key] = {
            "title": s.title,
            "appendix": s.appendix,
            "seconds": round(s.seconds, 2),
            "cpu_seconds": round(s.cpu_seconds, 2),
            "params": s.params,
            "numbers": s.numbers,
            "figures": [{"title": cite_text(f.title), "kind": type(f).__name__, "data": f.data} for f in s.figures],
            "tables": {caption: shown_table(df) for caption, df, *_ in s.tables},
            "table_legends": {caption: table_legend(df, *note) for caption, df, *note in s.tables},
            "claims": [_claim_json(c) for c in s.claims],
            "findings": [f.as_json(s.key) for f in s.findings],
        }
    out = {
        "geolens_report": 1,
        "created": report.created,
        "first_screen": _first_screen_json(report),
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
    (:mod:`geolens.claims`), else null; ``decision``, ``verdict`` and ``why`` are what the page shows;
    ``measured`` is the page's text (:func:`shown_measured`), the numbers behind it in ``numbers``."""
    return {
        "claim": cite_text(c.claim),
        "source": c.source,
        "citation": cite_text(c.source),
        "references": [r.full for r in references_of(c.source)],
        "measured": shown_measured(c),
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
    shown = humanise_values(shown_table(df))
    shown.columns = [header(c) for c in df.columns]
    shown.columns.name = None
    return shown.to_html(index=False, border=0, classes="geolens-table", float_format=lambda v: f"{v:.4g}", na_rep="–")


def _param_value(v: Any) -> str:
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, dict):
        return ", ".join(f"{k} = {_param_value(x)}" for k, x in v.items()) or "none"
    if isinstance(v, list):
        return ", ".join(_param_value(x) for x in v) or "none"
    return str(v)


def param_rows(params: dict[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    """``params`` as (name, value) rows of a small table: nested settings by dotted name
    (``per_term.n_boot``), lists joined by commas, no JSON."""
    rows = []
    for key, value in to_jsonable(params).items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            rows += param_rows(value, name + ".")
        else:
            rows.append((name, _param_value(value)))
    return rows


CLAIMS_LEGEND = (
    "paper claim: what the cited paper states (for contribution flow: the hypothesis of geolens' pre-registered erasure "
    "test); source: the paper (author and year, linked to the references at the end) and its section; "
    "measured: the numbers behind the verdict in this run, with 95% intervals where one was computed on at least two "
    "windows; verdict: holds / does not hold when the criterion was "
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
    """One self-contained page: bundle inlined, PNGs embedded, no external resource.

    It opens with the first screen (the run in one line, the headline findings with their
    intervals and samples, one figure), then the claim table, the sections, the appendix of
    superseded material (full report only), the run's parameters and the references."""
    claims = [
        dict(
            claim=cite_text(c.claim),
            source=source_html(c.source),
            measured=shown_measured(c),
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
    figures = {s.key: [_figure(f) for f in s.figures] for s in report.sections}
    sections = [
        dict(
            key=s.key,
            title=s.title,
            appendix=s.appendix,
            intro=cite_text(s.intro),  # intros are written by geolens (trusted markup)
            params=param_rows(s.params),
            seconds=f"{s.seconds:.1f}",
            figures=figures[s.key],
            tables=[
                dict(caption=cite_text(caption), html=_table_html(df), legend=table_legend(df, *note))
                for caption, df, *note in s.tables
            ],
        )
        for s in report.sections
    ]
    picked = headline(report)
    lead = lead_figure(picked)
    findings = [
        dict(
            section_key=s.key,
            section_title=s.title,
            title=cite_text(f.title),
            what=cite_text(f.what),
            estimate=f.estimate,
            sample=f.sample,
        )
        for s, f in picked
    ]
    return render_page(
        "report.html.j2",
        page_class="",
        bundle=bundle_script(),
        references=references_html(),
        run=run_summary(report),
        findings=findings,
        lead=None if lead is None else dict(figures[lead[0].key][lead[1]], section_key=lead[0].key),
        run_params=param_rows(report.params),
        all_versions=[(k, str(val)) for k, val in report.versions.items()],
        cite_a=_ref_link("cunningham2026"),
        cite_b=_ref_link("mudarisov2026"),
        claims=claims,
        n_indicative=sum(c["decision"] == "indicative" for c in claims),
        claims_legend=CLAIMS_LEGEND,
        sections=sections,
    )
