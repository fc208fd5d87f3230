"""The cross-model report: two or more saved ``report.json`` side by side.

``geolens report --compare runA/report.json runB/report.json --out cmp`` (or
``geolens report --model smollm2-135m --model gemma3-270m``, which writes each model's report
under ``--out/<model>/`` first) writes ``compare.html`` (self-contained) and ``compare.json``:

- **one claim table** with a column per model: the verdict with the sample behind it and the
  measured value, by the rule of :mod:`geolens.claims` (holds / does not hold only when decided by
  confidence intervals on enough data, else "indicative (n = …)"; a ``report.json`` written before
  that rule reads indicative); a claim a run did not test shows "not run";
- **figures on shared axes**, redrawn from the numbers in the JSON files (nothing is re-run):
  the mean sink rate and the mean cos(ṽ_0, ṽ_j) per layer against *relative depth*
  l / (n_layers − 1) (models of different depths on one axis), the regime shares of the head
  taxonomy with the share of offset-dominated heads, and F_N of top-N vs random sets against N.

Nothing is averaged across models; every number is the one its own report measured, with the
run's parameters and versions kept in ``compare.json["runs"]``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from geolens.claims import Claim
from geolens.files import read_json
from geolens.report.citations import cite_text, references_html, references_of, source_html
from geolens.report.columns import header
from geolens.report.pages import render_page
from geolens.viz.common import PlotView, new_figure, to_jsonable

REGIMES = ("Mixer", "Retriever", "Reset")
SELECTION_MAIN = "value/cosine/attention/sink-keep"  # the report's main selection condition


def load_report(path: str | Path) -> dict:
    """A ``report.json`` written by ``geolens report`` (a folder holding one is accepted)."""
    path = Path(path)
    if path.is_dir():
        path = path / "report.json"
    if not path.is_file():
        raise FileNotFoundError(f"no report.json at {path}: run `geolens report --out <folder>` first")
    data = read_json(path, str(path))
    if not isinstance(data, dict) or "geolens_report" not in data or "sections" not in data:
        raise ValueError(f"{path} is not a geolens report.json (no 'geolens_report' / 'sections' keys)")
    data["_path"] = str(path)
    return data


def _labels(reports: Sequence[dict]) -> list[str]:
    names = [str(r.get("params", {}).get("model", f"run{i + 1}")) for i, r in enumerate(reports)]
    out = []
    for i, n in enumerate(names):
        out.append(n if names.count(n) == 1 else f"{n} ({i + 1})")
    return out


def _rows(table) -> list[dict]:
    if isinstance(table, dict) and "rows" in table:
        return table["rows"] or []
    return []


def _per_layer(report: dict, column: str) -> tuple[list[float], list[float]] | None:
    """(relative depth, mean over heads of ``column``) from the sink section's head table."""
    rows = _rows(report.get("sections", {}).get("sinks", {}).get("numbers", {}).get("geometry_heads"))
    if not rows or column not in rows[0]:
        return None
    layers = sorted({int(r["layer"]) for r in rows})
    n_layers = int(report.get("params", {}).get("model_config", {}).get("n_layers") or (max(layers) + 1))
    xs, ys = [], []
    for l in layers:
        vals = [r[column] for r in rows if int(r["layer"]) == l and r.get(column) is not None]
        if vals:
            xs.append(l / max(n_layers - 1, 1))
            ys.append(float(np.mean(vals)))
    return xs, ys


def _taxonomy(report: dict) -> dict | None:
    num = report.get("sections", {}).get("taxonomy", {}).get("numbers", {})
    if "distribution" not in num:
        return None
    out = {r: float(num["distribution"].get(r, 0.0)) for r in REGIMES}
    dom = num.get("offset_dominated")
    out["offset-dominated"] = float(dom["share_of_heads"]) if dom else float("nan")
    return out


def _selection(report: dict) -> dict | None:
    rows = _rows(report.get("sections", {}).get("selection", {}).get("numbers", {}).get("comparison"))
    rows = [r for r in rows if r.get("condition") == SELECTION_MAIN]
    if not rows:
        return None
    rows.sort(key=lambda r: r["N"])
    top_key = "top_mean" if "top_mean" in rows[0] else "top"
    rnd_key = "random_mean" if "random_mean" in rows[0] else "random"
    if top_key not in rows[0] or rnd_key not in rows[0]:
        return None
    return {"N": [int(r["N"]) for r in rows], "top": [r[top_key] for r in rows], "random": [r[rnd_key] for r in rows]}


def compare_figures(reports: Sequence[dict], labels: Sequence[str]) -> list[PlotView]:
    """Figures on shared axes (see the module docstring); a panel is left out if no run has it."""
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]
    figs = []
    for column, title, ylim in (
        ("sink_rate", "Mean sink rate α_i0 per layer", (0, 1)),
        ("proj_cos_tail", "Mean cos(ṽ_0, ṽ_j) per layer (negative = anti-aligned sink)", (-1, 1)),
    ):
        series = {lab: _per_layer(r, column) for lab, r in zip(labels, reports)}
        series = {k: v for k, v in series.items() if v}
        if not series:
            continue
        fig = new_figure(figsize=(7.8, 3.4))
        ax = fig.add_subplot(111)
        for i, (lab, (x, y)) in enumerate(series.items()):
            ax.plot(x, y, marker="o", ms=3, color=colors[i % len(colors)], label=lab)
        if ylim[0] < 0:
            ax.axhline(0, color="#999", lw=0.8)
        ax.set(
            xlim=(0, 1),
            ylim=ylim,
            xlabel="relative depth l / (n_layers − 1)",
            ylabel=f"{header(column)} (mean over heads)",
            title=title,
        )
        _outside_legend(ax)
        figs.append(
            PlotView(
                fig,
                title=title,
                data={
                    "column": column,
                    "series": {k: {"relative_depth": v[0], "mean": v[1]} for k, v in series.items()},
                },
            )
        )
    tax = {lab: _taxonomy(r) for lab, r in zip(labels, reports)}
    tax = {k: v for k, v in tax.items() if v}
    if tax:
        cats = list(REGIMES) + ["offset-dominated"]
        fig = new_figure(figsize=(7.8, 3.4))
        ax = fig.add_subplot(111)
        width = 0.8 / len(tax)
        for i, (lab, d) in enumerate(tax.items()):
            xs = np.arange(len(cats)) + (i - (len(tax) - 1) / 2) * width
            ax.bar(
                xs, [d[c] if np.isfinite(d[c]) else 0 for c in cats], width, color=colors[i % len(colors)], label=lab
            )
        ax.set_xticks(np.arange(len(cats)), cats)
        ax.set(ylim=(0, 1), ylabel="share of heads", title="Head taxonomy: regime shares and offset-dominated heads")
        _outside_legend(ax)
        figs.append(PlotView(fig, title="Head taxonomy: regime shares", data={"categories": cats, "shares": tax}))
    sel = {lab: _selection(r) for lab, r in zip(labels, reports)}
    sel = {k: v for k, v in sel.items() if v}
    if sel:
        fig = new_figure(figsize=(7.8, 3.4))
        ax = fig.add_subplot(111)
        for i, (lab, d) in enumerate(sel.items()):
            c = colors[i % len(colors)]
            ax.plot(d["N"], d["top"], marker="o", color=c, label=f"{lab}: top-N")
            ax.plot(d["N"], d["random"], marker="x", ls="--", color=c, label=f"{lab}: random N-set")
        ax.set_xscale("log", base=2)
        ax.set(
            ylim=(0, 1),
            xlabel="N (log scale)",
            ylabel="F_N (document mean)",
            title=f"Selection separability ({SELECTION_MAIN})",
        )
        _outside_legend(ax)
        figs.append(
            PlotView(fig, title="Selection separability F_N", data={"condition": SELECTION_MAIN, "series": sel})
        )
    return figs


def _outside_legend(ax) -> None:
    """The legend right of the axes, outside the data area."""
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    ax.figure.tight_layout()


def _measured(text: str) -> str:
    """The measured text without the "[n = …]" that reports written before geolens.claims appended
    (the sample is shown with the verdict)."""
    marker = text.rfind(" [n = ")
    return text[:marker] if marker > 0 and text.endswith("]") else text


def compare_claims(reports: Sequence[dict], labels: Sequence[str]) -> list[dict]:
    """One row per (section, claim) in the order first met, with each model's result."""
    rows: dict[tuple[str, str], dict] = {}
    for lab, rep in zip(labels, reports):
        for c in rep.get("claims", []):
            key = (c.get("section", ""), c["claim"])
            source = c.get("source", "")
            row = rows.setdefault(
                key,
                {
                    "section": key[0],
                    "claim": c["claim"],
                    "source": source,
                    "citation": c.get("citation") or cite_text(source),
                    "references": [r.full for r in references_of(source)],
                    "criterion": c.get("criterion", ""),
                    "models": {},
                },
            )
            claim = Claim.from_json(c)  # the verdict rule applied again: the same rule for every run
            decided = claim.decision in ("holds", "does not hold")
            row["models"][lab] = {
                "measured": _measured(c["measured"]),
                "verdict": claim.verdict,
                "decision": claim.decision,
                "why": claim.why,
                "holds": claim.holds if decided else None,
                "sample": claim.sample,
            }
    for row in rows.values():
        for lab in labels:
            row["models"].setdefault(lab, None)
        decisions = {m["decision"] for m in row["models"].values() if m}
        row["agree"] = len(decisions) == 1 and all(row["models"].values())
    return list(rows.values())


def compare_reports(reports: Sequence[dict]) -> dict[str, Any]:
    """The comparison as JSON-ready data (claims, figure numbers, the runs' parameters)."""
    if len(reports) < 2:
        raise ValueError(f"a comparison needs at least two reports, got {len(reports)}")
    labels = _labels(reports)
    claims = compare_claims(reports, labels)
    figs = compare_figures(reports, labels)
    out = {
        "geolens_compare": 1,
        "models": labels,
        "runs": {
            lab: {
                "path": r.get("_path"),
                "params": r.get("params", {}),
                "versions": r.get("versions", {}),
                "created": r.get("created"),
            }
            for lab, r in zip(labels, reports)
        },
        "claims": claims,
        "figures": [{"title": f.title, "data": f.data} for f in figs],
    }
    return {"data": to_jsonable(out), "figures": figs}


COMPARE_LEGEND = (
    "paper claim: what the cited paper states (with the report section); source: the paper (author and year, linked to "
    "the references at the end) and its section; criterion: the rule applied; one column per model: its verdict with the sample behind it "
    "(holds / does not hold only when decided by confidence intervals on at least the claim's minimum sample, "
    "otherwise indicative; hover for why), then the number measured."
)


def render_compare_html(cmp: dict) -> str:
    """One self-contained page (``templates/compare.html.j2``): the claim table with a column per
    model, then the figures."""
    data, figs = cmp["data"], cmp["figures"]
    labels = data["models"]
    runs = [
        dict(
            label=lab,
            corpus=str(r["params"].get("corpus")),
            n_sequences=r["params"].get("n_sequences"),
            seq_len=r["params"].get("seq_len"),
            quick=bool(r["params"].get("quick")),
            model_mode=str(r["versions"].get("model_mode", "?")),
            geolens=str(r["versions"].get("geolens", "?")),
            path=str(r.get("path")),
        )
        for lab, r in data["runs"].items()
    ]
    rows = [
        dict(
            claim=cite_text(row["claim"]),
            section=row["section"],
            source=source_html(row["source"]),
            criterion=cite_text(row["criterion"]),
            agree=row["agree"],
            cells=[
                None
                if row["models"][l] is None
                else dict(row["models"][l], measured=cite_text(row["models"][l]["measured"]))
                for l in labels
            ],
        )
        for row in data["claims"]
    ]
    n_indicative = sum(
        1 for row in data["claims"] for m in row["models"].values() if m and m["decision"] == "indicative"
    )
    return render_page(
        "compare.html.j2",
        page_class="compare",
        references=references_html(),
        labels=labels,
        runs=runs,
        rows=rows,
        n_indicative=n_indicative,
        legend=COMPARE_LEGEND,
        figures=[{"title": f.title, "png": f.to_base64_png()} for f in figs],
    )


def write_comparison(reports: Sequence[dict], out: str | Path) -> dict[str, Path]:
    """Write ``compare.html`` and ``compare.json`` into the folder ``out``."""
    cmp = compare_reports(reports)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    html_path, json_path = out / "compare.html", out / "compare.json"
    html_path.write_text(render_compare_html(cmp), encoding="utf-8")
    json_path.write_text(json.dumps(cmp["data"], indent=1, allow_nan=False), encoding="utf-8")
    for f in cmp["figures"]:
        f.close()
    return {"html": html_path, "json": json_path}
