"""Summaries of protocol 4 (docs/faithfulness/v4/PROTOCOL.md): the masking excess over a
size-matched random control (§2), the masking addendum's family without its duplicated comparison
(§3), and the README of each part.

- :func:`matched_masking_summary`: per document, AOPC(m) (the addendum's stored rows) minus the
  AOPC of m's size-matched control (the mean of its draws, :mod:`geolens.faithfulness.matched_masking`
  rows); the 5 excess tests and the 5 pairs on excesses as one Holm family.
- :func:`corrected_addendum_family`: :func:`~geolens.faithfulness.masking_summary.masking_summary_no_exclusion`
  of the stored rows with the duplicated test left out, and every verdict that differs from the
  published one.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from geolens.faithfulness.matched_masking import MATCHED
from geolens.stats import bootstrap_indices, holm_family, nan_to_none, percentile_ci, resample_means


def _aopc_by_document(frame: pd.DataFrame, column: str, fractions: list[float]) -> pd.DataFrame:
    """documents × ``column`` values: the mean over the k grid (every k required)."""
    grid = frame.pivot_table(index=["document", column], columns="k", values="kl", aggfunc="mean")
    missing = [k for k in fractions if not any(np.isclose(k, c) for c in grid.columns)]
    if missing or grid.isna().any().any():
        raise ValueError(f"rows lack fractions {missing or 'of some documents'} of the grid {fractions}")
    return grid.mean(axis=1).unstack(column)


def _queries_per_window(protocol) -> int:
    """The queries of a window (each has at least one term removed at every k): the addendum's ``seq_len``."""
    from pathlib import Path

    twin = Path(__file__).resolve().parents[2] / protocol["matched_masking"]["addendum"]
    import json

    return int(json.loads(twin.read_text(encoding="utf-8"))["data"]["seq_len"])


def matched_masking_summary(rows: pd.DataFrame, stored: pd.DataFrame, protocol) -> dict:
    """Protocol 4 §2 from the control rows (``rows``) and the addendum's stored rows (module
    docstring). ``protocol``: the twin (its ``matched_masking`` and ``statistics`` sections).

    Returns ``metrics`` (each metric's AOPC, its control's and the excess, with 95 % intervals),
    ``tests`` (the Holm family: ``kind`` ``excess`` or ``pair``), ``matching`` (per metric and k: the
    share of unmatched query controls, the median norm ratio, the terms removed by the control and
    by the metric) and ``above_all_removed`` (per metric, the documents whose AOPC exceeds the
    all-removed KL of their layer).
    """
    section, stats = protocol["matched_masking"], protocol["statistics"]
    metrics = list(section["metrics"])
    fractions = [float(k) for k in section["fractions"]]
    same = dict(section.get("same_masks", {}))
    n_boot, seed, alpha = int(stats["n_boot"]), int(stats["seed"]), float(stats["alpha"])
    controls = rows[rows.metric == MATCHED]
    if controls.empty:
        raise ValueError("no control rows")
    documents = sorted(set(controls.document))
    comp = stored[(stored.direction == "comprehensiveness") & stored.metric.isin(metrics)]
    comp = comp[comp.document.isin(documents)]
    own = _aopc_by_document(comp, "metric", fractions).reindex(index=documents, columns=metrics)
    draws = controls.groupby(["document", "target", "k"]).kl.mean().reset_index()  # mean over draws
    ctrl = _aopc_by_document(draws, "target", fractions).reindex(index=documents, columns=metrics)
    if own.isna().any().any() or ctrl.isna().any().any():
        raise ValueError("a document lacks a metric's stored rows or its controls")
    excess = own - ctrl
    idx = bootstrap_indices(len(documents), n_boot, seed)

    def interval(values: np.ndarray) -> dict:
        lo, hi = percentile_ci(resample_means(values, idx), 0.95)
        return dict(mean=float(values.mean()), ci_low=float(lo), ci_high=float(hi))

    metric_rows = [
        dict(
            metric=m,
            aopc=interval(own[m].to_numpy()),
            control_aopc=interval(ctrl[m].to_numpy()),
            excess=interval(excess[m].to_numpy()),
            n_documents=len(documents),
        )
        for m in metrics
    ]
    tests, values = [], []
    for kind, a, b in [("excess", None, m) for m in metrics] + [("pair", a, b) for a, b in section["pairs"]]:
        b_col = same.get(b, b)
        if kind == "excess":
            diff = excess[b_col].to_numpy()
        else:
            diff = excess[b_col].to_numpy() - excess[same.get(a, a)].to_numpy()
        tests.append(dict(kind=kind, a=a, b=b, n_documents=len(documents)))
        values.append(diff)
    decided = holm_family([v.mean() for v in values], [resample_means(v, idx) for v in values], alpha=alpha)
    tests = [nan_to_none(dict(t, **r._asdict())) for t, r in zip(tests, decided)]
    per_key = controls.groupby(["document", "target", "k"]).size()
    if (per_key != int(section["draws"])).any():
        raise ValueError(f"every (document, metric, k) needs {section['draws']} control draws")
    every = stored[(stored.direction == "comprehensiveness") & stored.document.isin(documents)]
    for m, same_as in same.items():  # metrics whose masks the protocol declares identical
        a = every[every.metric == m].set_index(["document", "k"]).mask_hash.sort_index()
        b = every[every.metric == same_as].set_index(["document", "k"]).mask_hash.sort_index()
        if not a.equals(b):
            raise ValueError(f"{m}'s masks are not {same_as}'s in every condition")
    n_queries = _queries_per_window(protocol)
    matching = []
    for (m, k), g in controls.groupby(["target", "k"]):
        n_conditions = int(len(g))  # one row per (document, draw)
        matching.append(
            dict(
                metric=m,
                k=float(k),
                unmatched_share=float(g.n_unmatched.sum()) / (n_conditions * n_queries),
                median_norm_ratio=float(g.norm_ratio_median.median()),  # over conditions, of their medians
                terms_removed_control=float(g.n_removed.mean()),
                terms_removed_metric=float(g.n_removed_target.mean()),
                n_conditions=n_conditions,
                n_queries=n_queries,
            )
        )
    all_removed = stored[(stored.metric == "all_removed") & stored.document.isin(documents)].set_index("document").kl
    above = {m: int((own[m] > all_removed.reindex(own.index)).sum()) for m in metrics}
    checks = rows[rows.metric != MATCHED]
    return dict(
        endpoint="aopc_kl",
        units="nats",
        direction="comprehensiveness",
        n_documents=len(documents),
        draws=int(section["draws"]),
        tolerance=float(section["tolerance"]),
        n_boot=n_boot,
        seed=seed,
        alpha=alpha,
        metrics=metric_rows,
        tests=tests,
        matching=matching,
        above_all_removed=dict(n_documents=len(documents), **above),
        reuse_checks=dict(
            n=int(len(checks)),
            max_relative_difference=float(((checks.kl - checks.stored_kl).abs() / checks.stored_kl.abs()).max())
            if len(checks)
            else None,
        ),
    )


def corrected_addendum_family(rows: pd.DataFrame, published: dict, protocol) -> dict:
    """The masking addendum's summary of ``rows`` without the duplicated test (protocol 4 §3;
    ``protocol``: protocol 4's twin), and each test whose verdict differs from ``published``
    (the addendum's ``summary.json``)."""
    from pathlib import Path

    from geolens.faithfulness.masking_summary import masking_summary_no_exclusion
    from geolens.faithfulness.preregistered import load_protocol

    addendum = load_protocol(Path(__file__).resolve().parents[2] / protocol["matched_masking"]["addendum"])
    drop = [tuple(t) for t in protocol["addendum_correction"]["drop"]]
    summary = masking_summary_no_exclusion(rows, addendum.settings, drop=drop, family_only=True)
    before = {(p["a"], p["b"], p["direction"]): p for p in published["masking"]["pairs"]}
    changed = []
    for p in summary["pairs"]:
        old = before.get((p["a"], p["b"], p["direction"]))
        if old is not None and old["verdict"] != p["verdict"]:
            changed.append(
                dict(a=p["a"], b=p["b"], direction=p["direction"], published=old["verdict"], corrected=p["verdict"])
            )
    n_tests = sum(p["verdict"] != "not testable" for p in summary["pairs"])
    return dict(
        dropped=[dict(a=a, b=b, direction=d) for a, b, d in drop],
        why=protocol["addendum_correction"]["why"],
        n_tests=n_tests,
        n_tests_published=sum(p["verdict"] != "not testable" for p in published["masking"]["pairs"]),
        corrected_tests=summary["pairs"],
        changed_verdicts=changed,
    )


def _fmt(x) -> str:
    return "–" if x is None else f"{x:+.3f}"


def render_readme(summary: dict) -> str:
    """The README of one part's results (``summary["part"]``), rendered from its summary."""
    part, model = summary["part"], summary["model"]
    head = [
        f"# Protocol 4, {part}: {model}",
        "",
        f"Protocol: [docs/faithfulness/v4/PROTOCOL.md](../PROTOCOL.md); label **{summary['label']}**. "
        f"Command: `{summary['command']}`.",
        "",
    ]
    if part == "beyond-norm":
        from geolens.faithfulness.beyond_norm import render_lines

        return "\n".join(head + render_lines(summary)) + "\n"
    if part == "addendum-correction":
        lines = head + [
            f"The addendum's family had {summary['n_tests_published']} tests; without the duplicated one "
            f"({summary['why']}) it has {summary['n_tests']}.",
            "",
            "| direction | a → b | Δ AOPC (nats) | interval | verdict |",
            "|---|---|---|---|---|",
        ]
        for p in summary["corrected_tests"]:
            lines.append(
                f"| {p['direction']} | {p['a']} → {p['b']} | {_fmt(p['estimate'])} | "
                f"[{_fmt(p['ci_low'])}, {_fmt(p['ci_high'])}] | {p['verdict']} |"
            )
        changed = summary["changed_verdicts"]
        lines += ["", "Verdicts that changed: " + ("none." if not changed else "")]
        lines += [f"- {c['direction']} {c['a']} → {c['b']}: {c['published']} → {c['corrected']}" for c in changed]
        return "\n".join(lines) + "\n"
    lines = head + [
        f"{summary['n_documents']} documents, one masked layer each; AOPC of the KL in nats over k ∈ "
        f"{{1, 2, 5, 10, 20}} %, comprehensiveness; each metric against a random set of terms removing a "
        f"vector of the same norm (within {summary['tolerance']:.0%}, {summary['draws']} draws). "
        "95 % intervals; the tests' intervals are at their Holm step level.",
        "",
        "| metric | AOPC | size-matched control | excess | 95 % interval |",
        "|---|---|---|---|---|",
    ]
    for m in summary["metrics"]:
        lines.append(
            f"| {m['metric']} | {m['aopc']['mean']:.3f} | {m['control_aopc']['mean']:.3f} | "
            f"{_fmt(m['excess']['mean'])} | [{_fmt(m['excess']['ci_low'])}, {_fmt(m['excess']['ci_high'])}] |"
        )
    lines += ["", "| test | Δ (nats) | interval (level) | p_adj | verdict |", "|---|---|---|---|---|"]
    for t in summary["tests"]:
        name = f"excess of {t['b']}" if t["kind"] == "excess" else f"{t['a']} → {t['b']} (excess)"
        level = "" if t.get("level") is None else f" ({t['level']:.4f})"
        p_adj = "–" if t.get("p_adj") is None else f"{t['p_adj']:.3g}"
        lines.append(
            f"| {name} | {_fmt(t['estimate'])} | [{_fmt(t['ci_low'])}, {_fmt(t['ci_high'])}]{level} | {p_adj} | {t['verdict']} |"
        )
    lines += [
        "",
        "Matching: the share of (query, draw) controls left unmatched (no order within 5 %), the median over "
        "conditions of each condition's median norm ratio (control / metric), and the terms each removes "
        "(mean per condition, all queries).",
        "",
    ]
    lines += ["| metric | k | unmatched | norm ratio | terms removed (control / metric) |", "|---|---|---|---|---|"]
    for r in summary["matching"]:
        lines.append(
            f"| {r['metric']} | {r['k']:g} | {r['unmatched_share']:.1%} | {r['median_norm_ratio']:.3f} | "
            f"{r['terms_removed_control']:.0f} / {r['terms_removed_metric']:.0f} |"
        )
    return "\n".join(lines) + "\n"


__all__ = ["corrected_addendum_family", "matched_masking_summary", "render_readme"]
