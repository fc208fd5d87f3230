"""The geolens report: one command, one self-contained HTML page and one JSON file of numbers.

``geolens report`` (:mod:`geolens.commands.report`) runs every section whose geolens modules are
installed on one model and corpus (:func:`build_report`) and writes ``report.html`` (circuitsvis
bundle inlined, figures as base64 PNG, no network) and ``report.json`` (every figure's numbers,
tables, the paper-claim table with the numbers behind it, parameters and versions). The page opens
with its first screen: the run in one line, the headline findings (:class:`Finding`, each section's
own, with interval and n) and one figure; then the claim table, the sections, an appendix of
superseded material (full report only), the run's parameters and the references. The claims
themselves (:class:`geolens.claims.Claim`) and the rule for their verdicts live in :mod:`geolens.claims`.
"""

from geolens.report.build import (
    SECTIONS,
    ReportConfig,
    ReportContext,
    available_sections,
    build_report,
    write_report,
)
from geolens.report.contrast import ContributionContrast, contrast_samples
from geolens.report.document import Finding, Report, Section, render_html, report_json

__all__ = [
    "SECTIONS",
    "ContributionContrast",
    "Finding",
    "Report",
    "ReportConfig",
    "ReportContext",
    "Section",
    "available_sections",
    "build_report",
    "contrast_samples",
    "render_html",
    "report_json",
    "write_report",
]
