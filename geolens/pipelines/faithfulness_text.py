"""The text and files of ``geolens faithfulness`` runs: the markdown renderers (README, pairs,
AUC tables, the protocol-2 stages; protocol 3's per-term endpoint in
:mod:`geolens.pipelines.norm_controlled_text`) and the writers of protocol 1's folder (tables, summary,
figures; multiple choice), moved out of :mod:`geolens.commands.faithfulness` unchanged.

Every renderer reads only what a run's summary or result holds, so the same folder gives the
same bytes whether it was written by the run or rewritten by ``--replot``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from geolens.pipelines.norm_controlled_text import norm_controlled_markdown, norm_controlled_text


def auc_markdown(auc: pd.DataFrame) -> str:
    lines = ["| metric | direction | quantity | AUC | 95% CI |", "|---|---|---|---:|---|"]
    for r in auc.itertuples():
        lines.append(f"| {r.metric} | {r.direction} | {r.quantity} | {r.auc:.4f} | [{r.ci_low:.4f}, {r.ci_high:.4f}] |")
    return "\n".join(lines) + "\n"


def pairs_markdown(pairs: pd.DataFrame) -> str:
    """One row per (a, b, direction, quantity): paired ΔAUC (positive: b more faithful), CI, verdict."""
    lines = [
        "| a → b | direction | quantity | ΔAUC (b − a, faithful +) | 95% paired CI | verdict |",
        "|---|---|---|---:|---|---|",
    ]
    for r in pairs.itertuples():
        step = f"{r.a} → {r.b}" + (" (claimed)" if r.claimed else "")
        lines.append(
            f"| {step} | {r.direction} | {r.quantity} | {r.auc_diff + 0.0:+.4g} | [{r.ci_low + 0.0:+.4g}, {r.ci_high + 0.0:+.4g}] | {r.verdict} |"
        )
    return "\n".join(lines) + "\n"


def range_text(rc: dict) -> str:
    parts = []
    if rc.get("random_delta_ppl_at_max_fraction") is not None:
        parts.append(
            f"random ranking at k = {rc['max_fraction']}: ΔPPL {rc['random_delta_ppl_at_max_fraction']:+.4g} "
            f"({100 * rc['random_delta_ppl_rel_at_max_fraction']:+.2f} % of the clean PPL {rc['clean_ppl']:.4g})"
        )
    if "sink_only_delta_ppl" in rc:
        parts.append(
            f"sink alone removed: ΔPPL {rc['sink_only_delta_ppl']:+.4g} ({100 * rc['sink_only_delta_ppl_rel']:+.2f} %)"
        )
    parts.append(
        "range OK"
        if rc.get("has_range")
        else f"NO RANGE (random < {100 * rc['threshold_rel']:.0f} %): no claim decided"
    )
    return "range check: " + "; ".join(parts)


def results_markdown(result) -> str:
    """The per-protocol README of an output folder: protocol, range check, the claimed-order
    verdicts (Δ log-prob and ΔPPL, both directions) and the other pairs, all from ``summary()``."""
    from geolens.faithfulness import CLAIMED_ORDER, claimed_order_holds

    s = result.summary()
    p, rc = s["protocol"], s["range_check"]
    meta = s.get("meta", {})
    pairs = result.pairs()
    done = (
        ""
        if meta.get("complete", True)
        else f" (**interim**: {p['n_sequences']} of {meta.get('n_sequences_requested')} documents done)"
    )
    lines = [
        f"# Faithfulness by causal masking: {p['model']}{done}",
        "",
        f"Command: `{meta.get('command', 'geolens faithfulness')}` ({meta.get('seconds', '?')} s).",
        "",
        "| protocol | value |",
        "|---|---|",
        f"| layers masked together | {p.get('masking_scope')} ({_layers_text(p['layers'])}) |",
        f"| ranking scope | {p['ranking_scope']} |",
        f"| sink / current token removable | {p['allow_sink']} / {p['allow_current']} |",
        f"| metric mode (‖o‖ of c and of the output-normalised metric) | {p['mode']} |",
        f"| fractions k | {', '.join(map(str, p['fractions']))} |",
        f"| documents × tokens | {p['n_sequences']} × {p['seq_len']} ({p['corpus']}); {p['n_scored_tokens']} scored predictions (after the first {p['skip_prefix']} positions) |",
        f"| bootstrap | {p['n_boot']} paired resamples of documents |",
        "",
        f"Clean corpus PPL {s['clean_ppl']:.3f}. " + range_text(rc) + ".",
        "",
        "Claimed order raw < value-weighted < output-normalised < contribution, step by step "
        "(ΔAUC = AUC difference b − a signed so that + means b more faithful; 95% paired CI; verdict from the CI):",
        "",
        "| direction | quantity | " + " | ".join(f"{a} → {b}" for a, b in zip(CLAIMED_ORDER, CLAIMED_ORDER[1:])) + " |",
        "|---|---|" + "---|" * 3,
    ]
    for d in ("comprehensiveness", "sufficiency"):
        for q in ("delta_logprob", "delta_ppl"):
            c = claimed_order_holds(pairs, d, q)
            cells = [
                f"{v['auc_diff'] + 0.0:+.3g} [{v['ci'][0] + 0.0:+.3g}, {v['ci'][1] + 0.0:+.3g}] **{v['verdict']}**"
                for v in c["steps"].values()
            ]
            lines.append(f"| {d} | {q} | " + " | ".join(cells) + " |")
    other = pairs[~pairs.claimed]
    if len(other):
        lines += ["", "Other pairs:", "", pairs_markdown(other)]
    lines += [
        "",
        "Figures: `curves_delta_logprob.png`, `curves_delta_ppl.png`; tables: `pairs.csv`, `auc.csv`, `curves.csv`; "
        "everything above is recomputed from `per_sequence.csv.gz` and `clean.csv` by `geolens faithfulness --replot --out <this folder>`.",
    ]
    return "\n".join(lines) + "\n"


def _layers_text(layers) -> str:
    layers = list(layers)
    if len(layers) > 2 and layers == list(range(layers[0], layers[-1] + 1)):
        return f"{layers[0]}–{layers[-1]}"
    return ",".join(map(str, layers))


def save_protocol1(result, out: Path) -> list[dict]:
    """Tables, summary, the claimed-order verdicts and both curve figures."""
    from geolens.checkpoint import atomic_write_bytes
    from geolens.faithfulness import claimed_order_holds
    from geolens.pipelines import save_figures
    from geolens.pipelines.faithfulness import FaithfulnessRun

    result.save(out)
    pairs = result.pairs()
    text = result.protocol_text() + "\n\n" + range_text(result.range_check()) + "\n\n"
    atomic_write_bytes(
        out / "pairs.md", (text + pairs_markdown(pairs) + "\n" + auc_markdown(result.auc())).encode("utf-8")
    )
    atomic_write_bytes(out / "README.md", results_markdown(result).encode("utf-8"))
    checks = [
        claimed_order_holds(pairs, d, q)
        for d in ("comprehensiveness", "sufficiency")
        for q in ("delta_ppl", "delta_logprob")
    ]
    if (out / "mc.csv").exists():
        import pandas as pd

        from geolens.viz.faithfulness import mc_accuracy_plot

        mc = pd.read_csv(out / "mc.csv")
        info = json.loads((out / "mc_protocol.json").read_text()) if (out / "mc_protocol.json").exists() else {}
        p = info.get("protocol", {})
        view = mc_accuracy_plot(
            mc,
            subtitle=f"{info.get('task', '')}, {info.get('n_questions', '?')} questions; layers masked {p.get('layers')}, "
            f"ranking {p.get('ranking')}, sink removable {p.get('allow_sink')}, current removable {p.get('allow_current')}",
        )
        view.save(out / "mc.png", dpi=80)
        view.close()
    save_figures(out, FaithfulnessRun.of(result).figures, dpi=80)
    return checks


def mc_outputs(per_q, out: Path, *, n_boot: int, seed: int, seconds: float | None = None) -> None:
    """``mc.csv`` (accuracy and log p(correct) per condition), ``mc_pairs.csv`` (paired verdicts),
    ``mc_protocol.json`` and ``mc.png`` from the per-question rows (``mc_questions.csv``) and the
    run's ``mc_progress.json``; printed too. A partial run counts the questions answered so far."""
    from geolens.faithfulness.mc_curves import mc_conditions, mc_pairs
    from geolens.faithfulness.protocol import layer_span
    from geolens.viz.faithfulness import mc_accuracy_plot

    info = json.loads((out / "mc_progress.json").read_text())
    n_done = int((per_q.metric == "clean").sum())
    mc = mc_conditions(per_q, n_boot=n_boot, seed=seed)
    mc.to_csv(out / "mc.csv", index=False)
    pairs = mc_pairs(per_q, n_boot=n_boot, seed=seed, protocol=info["protocol"])
    pairs.to_csv(out / "mc_pairs.csv", index=False)
    tasks = per_q[per_q.metric == "clean"].task.value_counts(sort=False).to_dict()
    summary = dict(
        task=info["task"],
        n_questions=n_done,
        n_questions_planned=info["n_questions"],
        complete=n_done == info["n_questions"],
        questions_per_task=tasks,
        protocol=info["protocol"],
        metrics=info["metrics"],
        n_boot=n_boot,
    )
    if seconds is None and (out / "mc_protocol.json").is_file():  # a replot keeps the run's own time
        seconds = json.loads((out / "mc_protocol.json").read_text()).get("seconds")
    if seconds is not None:
        summary["seconds"] = seconds
    (out / "mc_protocol.json").write_text(json.dumps(summary, indent=2))
    print(f"multiple choice: {n_done} of {info['n_questions']} questions ({tasks})")
    if len(pairs):
        r = pairs.iloc[0]
        print(
            f"multiple choice range check: random ranking at the largest k changes log p(correct) by "
            f"{r.random_delta_logprob:+.3f} [{r.random_delta_logprob_lo:+.3f}, {r.random_delta_logprob_hi:+.3f}]"
        )
        print(
            pairs[["a", "b", "direction", "fraction", "diff", "ci_low", "ci_high", "verdict"]].to_string(
                index=False, float_format=lambda v: f"{v:+.3f}"
            )
        )
    print(
        mc.pivot_table(index="metric", columns=["direction", "fraction"], values="accuracy", sort=False).to_string(
            float_format=lambda v: f"{v:.3f}"
        )
    )
    p = info["protocol"]
    view = mc_accuracy_plot(
        mc,
        subtitle=f"{info['task']}, {n_done} questions; layers masked {layer_span(p['layers']) if p.get('layers') else 'all'}, "
        f"ranking {p.get('ranking')}, sink removable {p.get('allow_sink')}, current removable {p.get('allow_current')}",
    )
    view.save(out / "mc.png", dpi=80)
    view.close()


def per_term_text(summary: dict) -> str:
    """The per-term endpoint as text: mean Spearman per metric and scope (KL), then the family."""
    part = summary.get("per_term_effects")
    if not part:
        return ""
    if "norm_controlled" in part:  # protocol 3
        return norm_controlled_text(part)
    lines = [
        f"per-term endpoint ({part['n_positions']} positions, {part['n_documents']} documents; outcome KL): mean Spearman [95% CI]"
    ]
    for m in part["metrics"]:
        if m["outcome"] == "kl":
            lines.append(
                f"  {m['scope']:<6} {m['metric']:<24} {m['spearman']:+.3f} [{m['ci_low']:+.3f}, {m['ci_high']:+.3f}]  top-5 {m['top5']:.2f}"
            )
    lines.append("pairs (a → b: Δ = ρ(b) − ρ(a); Holm family):")
    for p in part["pairs"]:
        ci = "" if p["ci_low"] is None else f"[{p['ci_low']:+.3f}, {p['ci_high']:+.3f}] at {100 * p['level']:.2f}%"
        p_adj = "" if p["p_adj"] is None else f"p_adj {p['p_adj']:.3g}"
        lines.append(f"  {p['scope']:<6} {p['a']} → {p['b']}: {p['estimate']:+.3f} {ci} {p_adj} → {p['verdict']}")
    return "\n".join(lines)


def protocol_markdown(summary: dict) -> str:
    """README.md of a protocol-2 run: what ran, then each stage's tables."""
    lines = [
        f"# Faithfulness, protocol {summary['protocol_version']}: {summary['model']}",
        "",
        f"Command: `{summary['command']}` (add `--resume` to continue an interrupted run).",
        f"Protocol text SHA-256 `{summary['protocol_sha256']}` ({summary['label']}); "
        f"model mode {summary['model_mode']}; corpus {summary['corpus']}, {summary['n_documents']} documents. "
        f"Stages: "
        + ", ".join(
            f"{k} {v}" + (f" ({summary['stage_seconds'][k]:.0f} s)" if summary.get("stage_seconds", {}).get(k) else "")
            for k, v in summary["stages"].items()
        )
        + ".",
        "",
    ]
    if summary["label"] != "pre-registered":
        lines += [f"**Exploratory run, no verdicts**: {'; '.join(summary.get('differences', []))}.", ""]
    if "per_term_effects" in summary:
        lines.append(per_term_markdown(summary))
    if "masking" in summary:
        lines.append(masking_markdown(summary["masking"]))
    if summary.get("not_testable"):
        lines += [
            "## Not testable by construction",
            "",
            "These pairs cannot differ under the protocol, so they get no interval and stay out of every Holm family:",
            "",
        ]
        lines += [
            f"- {p['a']} → {p['b']} (ranking scope {p['ranking_scope']}): {p['why']}" for p in summary["not_testable"]
        ]
    return "\n".join(lines).rstrip("\n") + "\n"


def masking_no_exclusion_markdown(part: dict) -> str:
    """Protocol 3's masking addendum: AOPC (nats) per metric and direction, the Holm family, the
    pooled nAOPC, and what protocol 2's rules would have excluded (nothing is)."""
    rules = part["protocol_2_rules"]
    lines = [
        f"## Per-layer masking, no exclusion ({part['n_documents']} documents, {part['n_document_layers']} "
        f"(document, layer) pairs, {part['layers_per_document']} layer per document)",
        "",
        f"Excluded: {part['conditions_excluded']} conditions, {part['document_layers_excluded']} (document, layer) "
        f"pairs, whole layers {part['whole_layers_excluded']}. Protocol 2's rules, reported only, would have flagged "
        f"{len(rules['range_rule']['flagged'])} (document, layer) pairs by the range rule and "
        f"{len(rules['ceiling_rule']['flagged'])} by the ceiling rule, and dropped the whole layers "
        f"{rules['layers_a_rule_would_drop'] or 'none'}.",
        "",
        "| metric | direction | AOPC of the KL (nats) | 95% CI | pooled nAOPC | 95% CI |",
        "|---|---|---:|---|---:|---|",
    ]
    pooled = {(m["metric"], m["direction"]): m for m in part["secondary"]["pooled_naopc"]["metrics"]}
    for m in part["metrics"]:
        q = pooled[(m["metric"], m["direction"])]
        lines.append(
            f"| {m['metric']} | {m['direction']} | {m['aopc_kl']:.4g} | [{m['ci_low']:.4g}, {m['ci_high']:.4g}] "
            f"| {q['naopc']:.4g} | [{q['ci_low']:.4g}, {q['ci_high']:.4g}] |"
        )
    lines += [
        "",
        "### Pre-registered pairs (AOPC of the KL; one Holm family; Δ > 0: b more faithful)",
        "",
        "| direction | a → b | Δ (nats) | CI | p_adj | verdict |",
        "|---|---|---:|---|---:|---|",
    ]
    for p in part["pairs"]:
        ci = "" if p.get("ci_low") is None else f"[{p['ci_low']:+.4g}, {p['ci_high']:+.4g}]"
        p_adj = "" if p.get("p_adj") is None else f"{p['p_adj']:.3g}"
        lines.append(
            f"| {p['direction']} | {p['a']} → {p['b']} | {p['estimate']:+.4g} | {ci} | {p_adj} | {p['verdict']} |"
        )
    return "\n".join(lines) + "\n"


def masking_markdown(part: dict) -> str:
    """The per-layer masking endpoint: nAOPC per metric and direction, the checks, the family."""
    if part.get("exclusions") == "none":
        return masking_no_exclusion_markdown(part)
    rc, cc = part["range_check"], part["ceiling_check"]
    lines = [
        f"## Per-layer masking endpoint ({part['n_documents']} documents, {part['n_document_layers_used']} of "
        f"{part['n_document_layers']} (document, layer) pairs used)",
        "",
        f"Range check: {json.dumps(rc, ensure_ascii=False)}",
        "",
        f"Ceiling check: {json.dumps(cc, ensure_ascii=False)}",
        "",
        "| metric | direction | nAOPC (KL) | 95% CI |",
        "|---|---|---:|---|",
    ]
    for m in part["metrics"]:
        lines.append(
            f"| {m['metric']} | {m['direction']} | {m['naopc']:.4f} | [{m['ci_low']:.4f}, {m['ci_high']:.4f}] |"
        )
    lines += [
        "",
        "### Pre-registered pairs (one Holm family; Δ > 0: b more faithful)",
        "",
        "| direction | a → b | Δ | CI | p_adj | verdict |",
        "|---|---|---:|---|---:|---|",
    ]
    for p in part["pairs"]:
        ci = "" if p.get("ci_low") is None else f"[{p['ci_low']:+.4f}, {p['ci_high']:+.4f}]"
        p_adj = "" if p.get("p_adj") is None else f"{p['p_adj']:.3g}"
        lines.append(
            f"| {p['direction']} | {p['a']} → {p['b']} | {p['estimate']:+.4f} | {ci} | {p_adj} | {p['verdict']} |"
        )
    return "\n".join(lines) + "\n"


def per_term_markdown(summary: dict) -> str:
    """The per-term endpoint's tables and its family."""
    part = summary["per_term_effects"]
    if "norm_controlled" in part:  # protocol 3
        return norm_controlled_markdown(summary)
    lines = [
        f"## Per-term endpoint ({part['n_positions']} positions from {part['n_documents']} documents)",
        "",
        "Mean over positions of Spearman's ρ between each metric's scores and the measured effect of "
        "removing each term alone (KL), and the top-5 overlap; 95% document-cluster bootstrap intervals "
        f"(B = {part['n_boot']}).",
        "",
    ]
    for scope in ("term", "source"):
        lines += [
            f"### {scope} scope",
            "",
            "| metric | ρ (KL) | 95% CI | top-5 overlap | 95% CI | ρ (−Δp) |",
            "|---|---:|---|---:|---|---:|",
        ]
        dp = {m["metric"]: m for m in part["metrics"] if m["scope"] == scope and m["outcome"] == "delta_p"}
        for m in part["metrics"]:
            if m["scope"] == scope and m["outcome"] == "kl":
                lines.append(
                    f"| {m['metric']} | {m['spearman']:+.3f} | [{m['ci_low']:+.3f}, {m['ci_high']:+.3f}] | {m['top5']:.3f} "
                    f"| [{m['top5_ci_low']:.3f}, {m['top5_ci_high']:.3f}] | {dp[m['metric']]['spearman']:+.3f} |"
                )
        lines.append("")
    lines += [
        "## Pre-registered pairs (one Holm family)",
        "",
        "Δ = ρ(b) − ρ(a) (KL outcome): positive means b agrees better with the measured effects. The interval "
        "is at the pair's Holm level; the verdict is decided by it within Holm's step-down.",
        "",
        "| scope | a → b | Δ | CI | level | p | p_adj | verdict |",
        "|---|---|---:|---|---:|---:|---:|---|",
    ]
    for p in part["pairs"]:
        if p["p_adj"] is None:
            lines.append(f"| {p['scope']} | {p['a']} → {p['b']} | {p['estimate']:+.4f} | | | | | {p['verdict']} |")
        else:
            lines.append(
                f"| {p['scope']} | {p['a']} → {p['b']} | {p['estimate']:+.4f} | [{p['ci_low']:+.4f}, {p['ci_high']:+.4f}] "
                f"| {100 * p['level']:.2f}% | {p['p']:.3g} | {p['p_adj']:.3g} | {p['verdict']} |"
            )
    effects = part.get("single_term_effects")
    if effects:
        lines += [
            "",
            f"Single-term effects ({effects['n_positions']} positions): median KL of the largest term "
            f"{effects['median_kl_of_largest_term']:.3g} nats, of all terms' effects summed {effects['median_kl_of_all_terms_summed']:.3g}; "
            f"median clean top-1 probability {effects['median_clean_top_prob']:.3f}.",
        ]
    return "\n".join(lines) + "\n"


__all__ = [
    "auc_markdown",
    "masking_markdown",
    "mc_outputs",
    "pairs_markdown",
    "per_term_markdown",
    "per_term_text",
    "protocol_markdown",
    "range_text",
    "results_markdown",
    "save_protocol1",
]
