"""``geolens faithfulness``: comprehensiveness / sufficiency curves and MC accuracy under masks.

The primary protocol (the defaults; docs/method.md §3): every layer masked at once, ``query``
ranking (all (head, source) terms of a query on the inter-head scale), sink and current token
removable, k ∈ {0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9}, every prediction after the first
8 positions scored. Example (the README run)::

    geolens faithfulness --n-sequences 100 --seq-len 128 --out docs/faithfulness/protocol1/smollm2-135m --overwrite

Writes under ``--out``: ``summary.json`` (protocol, clean PPL, range check, AUCs, the paired
differences with their verdicts), ``per_sequence.csv.gz`` (each document's mean NLL under each mask),
``clean.csv``, ``curves.csv``, ``auc.csv``, ``pairs.csv``, ``pairs.md``,
``curves_delta_ppl.png``, ``curves_delta_logprob.png`` and, with ``--mc-task``, ``mc.csv`` and
``mc.png``. The protocol and the range check are printed first. Documents are processed in
blocks; after each block every table and figure is rewritten for the documents done so far, and
``--resume`` continues an interrupted run from its ``per_sequence.csv.gz`` (same protocol only).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd


def parse_layers(text: str, n_layers: int) -> tuple[int, ...] | None:
    """``"all"``, ``"early"``/``"middle"``/``"late"`` (thirds), ``"28,29"``, ``"20-29"`` or negative
    indices (``"-2,-1"``), checked, never wrapped (a layer outside [−n, n) is a UsageError)."""
    from geolens.commands._options import resolve_layers
    from geolens.faithfulness import LAYER_GROUPS, layer_group

    text = text.strip()
    if text != "all" and text in LAYER_GROUPS:
        return layer_group(text, n_layers)
    return resolve_layers(text, n_layers, "--layers")


def parse_fractions(text: str, option: str = "--fractions") -> tuple[float, ...]:
    """Comma-separated fractions, each in the open interval (0, 1), sorted; else UsageError."""
    from geolens.errors import UsageError

    try:
        fr = tuple(float(k) for k in text.split(","))
    except ValueError:
        raise UsageError(f"{option} must be comma-separated numbers, got {text!r}") from None
    bad = [k for k in fr if not 0.0 < k < 1.0]
    if bad:
        raise UsageError(f"{option} must lie in (0, 1), got {bad}")
    return tuple(sorted(set(fr)))


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


def _save_all(result, out: Path) -> list[dict]:
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


def _language_modelling(model, args, protocol, metrics, out: Path):
    from geolens.commands._options import corpus_windows
    from geolens.errors import UsageError
    from geolens.faithfulness.result import FaithfulnessResult, ResumeError, resume_state
    from geolens.pipelines.faithfulness import FaithfulnessParams, run_faithfulness

    tokens = corpus_windows(model, args.corpus, args.seq_len, args.n_sequences)  # UsageError if too few
    t0 = time.time()
    done, spent = None, 0.0
    if args.resume:
        try:
            per, clean = resume_state(out, protocol.to_dict(model))
        except ResumeError as err:
            raise UsageError(str(err)) from None
        if per is not None:
            done = (per, clean)
            spent = float(json.loads((out / "summary.json").read_text()).get("meta", {}).get("seconds", 0.0))
            print(f"resuming after {len(clean)} documents already in {out}", flush=True)
    checks = None

    def meta(n_done: int) -> dict:
        return dict(
            n_sequences=n_done,
            n_sequences_requested=int(tokens.shape[0]),
            seq_len=int(tokens.shape[1]),
            metrics=list(metrics),
            seed=args.seed,
            model=args.model,
            corpus=args.corpus,
            seconds=round(spent + time.time() - t0, 1),
            complete=n_done == tokens.shape[0],
            command="geolens faithfulness " + " ".join(sys.argv[2:]) if len(sys.argv) > 1 else "geolens faithfulness",
        )

    def save(result) -> None:  # every block: an interrupted run keeps a consistent set
        nonlocal checks
        checks = _save_all(result, out)
        print(f"  {len(result.clean)} / {tokens.shape[0]} documents, {time.time() - t0:.0f} s (saved)", flush=True)

    params = FaithfulnessParams(
        protocol=protocol,
        metrics=metrics,
        chunk_size=args.chunk_size,
        seed=args.seed,
        n_boot=args.n_boot,
        block=args.block,
    )
    run = run_faithfulness(model, tokens, params, done=done, meta=meta, on_block=save)
    if run is None:  # everything was already done: rewrite the tables from the saved results
        result = FaithfulnessResult.load(out, n_boot=args.n_boot)
        checks = _save_all(result, out)
    else:
        result = run.result
    print(result)
    print(range_text(result.range_check()))
    for c in checks:
        print(
            f"order of Cunningham & Muça Cirone 2026, raw < value-weighted < output-normalised < contribution, {c['direction']} {c['quantity']}: "
            f"{'holds' if c['holds'] else 'does NOT hold'} {c['pairs']}"
        )
    return result


# The options of protocol 1; under --protocol they must keep their defaults (the protocol fixes them).
V1_OPTIONS = (
    "layers",
    "ranking",
    "fractions",
    "metrics",
    "mode",
    "protect_sink",
    "protect_current",
    "skip_prefix",
    "mc_task",
    "mc_questions",
    "mc_fractions",
    "n_sequences",
    "seq_len",
    "chunk_size",
    "mc_chunk_size",
    "block",
    "n_boot",
    "seed",
    "replot",
)


def run_preregistered(args) -> int:
    """``geolens faithfulness --protocol PATH``: the pre-registered protocol's endpoints, resumable
    per document, into ``--out`` (docs/faithfulness/PROTOCOL.md). Stage ``per_term``: §2."""
    from geolens.commands._options import check_corpus, check_model_name, out_folder
    from geolens.errors import UsageError
    from geolens.preregistration import load_protocol, preregistration, status_line

    try:
        protocol = load_protocol(args.protocol)
    except ValueError as err:
        raise UsageError(f"--protocol: {err}") from None
    changed = [name for name in V1_OPTIONS if getattr(args, name) != args.v1_defaults[name]]
    if changed:
        flags = ", ".join("--" + name.replace("_", "-") for name in changed)
        raise UsageError(f"--protocol fixes the design; drop {flags} (protocol 1's options)")
    model_name = check_model_name(args.model, tiny=True)
    check_corpus(args.corpus)
    data = protocol["data"]
    n_documents = int(data["n_documents"]) if args.max_documents is None else int(args.max_documents)
    differences = []
    if model_name not in data["models"]:
        differences.append(f"model {model_name} is not one of the protocol's {data['models']}")
    if args.corpus != data["corpus"]:
        differences.append(f"corpus {args.corpus}, not {data['corpus']}")
    if n_documents != int(data["n_documents"]):
        differences.append(f"{n_documents} documents, not {data['n_documents']}")
    out = out_folder(args, "faithfulness", resumable=True)
    start = time.time()
    import torch

    from geolens.adapter import model_mode
    from geolens.checkpoint import atomic_write_bytes
    from geolens.data import load_corpus
    from geolens.faithfulness.preregistered import protocol_windows, run_stages, write_json
    from geolens.models import load_model

    torch.set_grad_enabled(False)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model(model_name)
    if data.get("model_mode") and model_mode(model) != data["model_mode"]:
        differences.append(f"model mode {model_mode(model)}, not {data['model_mode']}")
    registration = preregistration(protocol, differences)
    label = registration["status"]
    try:
        windows, sources = protocol_windows(model, protocol, load_corpus(args.corpus), n_documents=n_documents)
    except ValueError as err:
        raise UsageError(f"--corpus {args.corpus}: {err}") from None
    print(
        f"protocol {protocol.path} (version {protocol.version}, sha256 {protocol.sha256[:16]}…): {label}"
        + "".join(f"\n  differs: {d}" for d in registration["reasons"]),
        flush=True,
    )
    print(
        f"model {model_name} ({model_mode(model)}), corpus {args.corpus}: {n_documents} documents × {windows.shape[1]} tokens; "
        f"torch threads {torch.get_num_threads()}",
        flush=True,
    )
    summary = dict(
        command=f"geolens faithfulness --protocol {args.protocol} --model {model_name} --corpus {args.corpus} --stage {args.stage}"
        + (f" --max-documents {args.max_documents}" if args.max_documents is not None else "")
        + f" --out {out}",
        protocol_version=protocol.version,
        protocol_sha256=protocol.sha256,
        label=label,
        differences=registration["reasons"],
        preregistration=registration,
        model=model_name,
        model_mode=model_mode(model),
        corpus=args.corpus,
        n_documents=n_documents,
        corpus_indices=sources,
        stages={},
        protocol=dict(
            masking_scope=protocol["secondary"]["masking_scope"],
            outcome=protocol["primary"]["outcome"],
            fractions=protocol["secondary"]["fractions"],
            primary_endpoint=protocol["primary"]["endpoint"],
            positions_per_document=protocol["primary"]["positions_per_document"],
        ),
        multiple_comparison=protocol["statistics"]["multiple_comparison"],
    )
    stages = ("per_term", "masking") if args.stage == "all" else (args.stage,)
    summary.update(
        run_stages(
            model,
            windows,
            protocol,
            out,
            stages,
            corpus=args.corpus,
            model_name=model_name,
            resume=args.resume,
            progress=lambda text: print(text, flush=True),
        )
    )
    summary["seconds"] = round(time.time() - start, 1)
    if label != "pre-registered":  # an exploratory run gets no verdicts (PROTOCOL.md, preamble)
        from geolens.preregistration import withhold_verdicts

        for key in ("per_term_effects", "masking"):
            if key in summary:
                summary[key] = dict(summary[key], pairs=withhold_verdicts(summary[key]["pairs"]))
        summary["pairs"] = [
            p for key in ("per_term_effects", "masking") if key in summary for p in summary[key]["pairs"]
        ]
        summary["note"] = "exploratory: " + "; ".join(registration["reasons"]) + ", so no verdict is given"
    write_json(summary, out / "summary.json")
    atomic_write_bytes(out / "README.md", protocol_markdown(summary).encode("utf-8"))
    if "per_term_effects" in summary:
        print(per_term_text(summary))
    if "masking" in summary:
        print(masking_markdown(summary["masking"]))
    print(
        f"{status_line(registration)}: wrote {out}/summary.json ({summary['seconds']:.0f} s; stages {summary['stage_seconds']})"
    )
    return 0


def per_term_text(summary: dict) -> str:
    """The per-term endpoint as text: mean Spearman per metric and scope (KL), then the family."""
    part = summary.get("per_term_effects")
    if not part:
        return ""
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


def masking_markdown(part: dict) -> str:
    """The per-layer masking endpoint: nAOPC per metric and direction, the checks, the family."""
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


def run(args) -> int:
    from geolens.commands._options import check_corpus, check_model_name, check_multiple_choice, out_folder
    from geolens.errors import UsageError
    from geolens.faithfulness import MaskingConfig
    from geolens.metrics import metric_names

    if args.protocol:
        return run_preregistered(args)
    if args.stage != "all" or args.max_documents is not None:
        raise UsageError(f"{'--stage' if args.stage != 'all' else '--max-documents'} needs --protocol")

    fractions = parse_fractions(args.fractions)
    mc_fractions = parse_fractions(args.mc_fractions, "--mc-fractions")
    metrics = (
        tuple(m.strip() for m in args.metrics.split(",") if m.strip())
        if args.metrics
        else metric_names(default_only=True)
    )
    unknown = [m for m in metrics if m not in metric_names()]
    if unknown:
        raise UsageError(f"--metrics: unknown metric {unknown[0]!r} (choose from {', '.join(metric_names())})")
    if args.skip_prefix >= args.seq_len - 1:
        raise UsageError(f"--skip-prefix {args.skip_prefix} leaves no prediction in {args.seq_len} tokens")
    if (args.replot or args.resume) and not args.out:
        raise UsageError(f"{'--replot' if args.replot else '--resume'} needs --out, the folder of the run")
    out = Path(args.out) if args.out else None
    if args.replot:  # tables and figures again from the saved per-document results, no model
        from geolens.faithfulness import FaithfulnessResult, per_sequence_path

        missing = [n for n in ("summary.json", "per_sequence.csv.gz", "clean.csv") if not (out / n).is_file()]
        if "per_sequence.csv.gz" in missing and per_sequence_path(out).is_file():
            missing.remove("per_sequence.csv.gz")
        has_mc = (out / "mc_questions.csv").is_file() and (out / "mc_progress.json").is_file()
        if missing and not has_mc:
            raise UsageError(f"--replot: {out} holds no saved results (missing {', '.join(missing)})")
        out = out_folder(args, "faithfulness", resumable=True)
        if not missing:
            result = FaithfulnessResult.load(out, n_boot=args.n_boot)
            for c in _save_all(result, out):
                print(c)
            print(result)
        if has_mc:  # multiple choice, also from a run still under way (the questions answered so far)
            import pandas as pd

            _mc_outputs(pd.read_csv(out / "mc_questions.csv"), out, n_boot=args.n_boot, seed=args.seed)
        return 0
    model_name = check_model_name(args.model)
    out = out_folder(args, "faithfulness", resumable=True)  # a later usage error removes it again
    if args.n_sequences > 0:
        check_corpus(args.corpus)
    questions = None
    if args.mc_task and args.mc_questions > 0:
        questions = check_multiple_choice(args.mc_task)[: args.mc_questions]
        if not questions:
            raise UsageError(f"--mc-task {args.mc_task}: no question")
    import torch

    from geolens.models import load_model

    torch.set_grad_enabled(False)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model(model_name)
    protocol = MaskingConfig(
        layers=parse_layers(args.layers, model.cfg.n_layers),
        ranking=args.ranking,
        allow_sink=not args.protect_sink,
        allow_current=not args.protect_current,
        mode=args.mode,
        fractions=fractions,
        skip_prefix=args.skip_prefix,
    )
    print(protocol.describe(model))
    print(
        f"model {args.model}, corpus {args.corpus}: {args.n_sequences} documents × {args.seq_len} tokens; metrics {list(metrics)}; "
        f"{args.chunk_size} masks per forward; torch threads {torch.get_num_threads()}",
        flush=True,
    )
    if args.n_sequences > 0:
        _language_modelling(model, args, protocol, metrics, out)
    if questions:
        from geolens.faithfulness.result import ResumeError, questions_in_blocks
        from geolens.multiple_choice import mc_under_masks_per_question

        mc_protocol = MaskingConfig(
            layers=protocol.layers,
            ranking=protocol.ranking,
            allow_sink=protocol.allow_sink,
            allow_current=protocol.allow_current,
            mode=protocol.mode,
            fractions=mc_fractions,
        )
        print(f"multiple choice: {args.mc_task}, {len(questions)} questions; " + mc_protocol.describe(model))
        t1 = time.time()
        try:
            per_q = questions_in_blocks(
                mc_under_masks_per_question,
                model,
                questions,
                mc_protocol,
                metrics,
                out,
                task=args.mc_task,
                seed=args.seed,
                chunk_size=args.mc_chunk_size,
                block=args.block,
                resume=args.resume,
                progress=lambda text: print(text, flush=True),
            )
        except ResumeError as err:
            raise UsageError(str(err)) from None
        _mc_outputs(per_q, out, n_boot=args.n_boot, seed=args.seed, seconds=round(time.time() - t1, 1))
    print(f"results in {out}/")
    return 0


def _mc_outputs(per_q, out: Path, *, n_boot: int, seed: int, seconds: float | None = None) -> None:
    """``mc.csv`` (accuracy and log p(correct) per condition), ``mc_pairs.csv`` (paired verdicts),
    ``mc_protocol.json`` and ``mc.png`` from the per-question rows (``mc_questions.csv``) and the
    run's ``mc_progress.json``; printed too. A partial run counts the questions answered so far."""
    from geolens.faithfulness.protocol import layer_span
    from geolens.multiple_choice import mc_conditions, mc_pairs
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


def register(subparsers) -> None:
    from geolens.commands._names import COSTLY_METRICS, DEFAULT_METRICS, FRACTIONS, METRICS, RANKING_SCOPES
    from geolens.commands._options import add_out, add_run_options, layer_spec, non_negative_int, positive_int

    p = subparsers.add_parser(
        "faithfulness",
        help="comprehensiveness/sufficiency curves of attribution metrics by causal masking (docs/method.md §3)",
    )
    add_run_options(
        p,
        model="smollm2-135m",
        corpus="lee",
        n_sequences=100,
        seq_len=128,
        own={
            "n_sequences": {
                "type": non_negative_int,
                "help": "documents (windows); 0 skips the language-modelling curves",
            },
            "seq_len": {"help": None},
        },
    )
    p.add_argument(
        "--layers",
        type=layer_spec,
        default="all",
        help="layers masked together: 'all' (primary), 'early'/'middle'/'late' (thirds), '29', '20-29', '-2,-1'",
    )
    p.add_argument(
        "--ranking",
        default="query",
        choices=list(RANKING_SCOPES),
        help="terms ranked together: per (layer, head, query) row, per query across heads (primary), per source summed over heads",
    )
    p.add_argument("--fractions", default=",".join(map(str, FRACTIONS)), help="removal fractions k, each in (0, 1)")
    p.add_argument(
        "--metrics",
        default="",
        help=f"comma-separated metrics, from {', '.join(METRICS)} (geolens.metrics; default: "
        f"{','.join(DEFAULT_METRICS)}"
        + "".join(
            f"; not by default: {m} ({text})" for m, text in COSTLY_METRICS.items()
        )  # the primary run leaves them out
        + ")",
    )
    p.add_argument(
        "--mode",
        default="inter",
        choices=["intra", "inter"],
        help="output norm of c and the output-normalised metric: the layer's (inter, primary) or the head's",
    )
    p.add_argument("--protect-sink", action="store_true", help="never remove position 0 (secondary protocol)")
    p.add_argument(
        "--protect-current", action="store_true", help="never remove the query's own token (secondary protocol)"
    )
    p.add_argument(
        "--skip-prefix", type=non_negative_int, default=8, help="score every prediction after the first N positions"
    )
    p.add_argument(
        "--mc-task",
        default="",
        help="bigbench:<task>, hf:boolq|winogrande|mmlu, a .jsonl, several of them comma-separated, or '' to skip (default)",
    )
    p.add_argument("--mc-questions", type=non_negative_int, default=25)
    p.add_argument(
        "--mc-fractions", default="0.1,0.5,0.9", help="removal fractions of the multiple-choice part, each in (0, 1)"
    )
    p.add_argument("--chunk-size", type=positive_int, default=12, help="masks per batched forward")
    p.add_argument("--mc-chunk-size", type=positive_int, default=60)
    p.add_argument(
        "--block", type=positive_int, default=5, help="documents (multiple choice: questions) per saved block"
    )
    p.add_argument("--resume", action="store_true", help="continue the run already in --out (same protocol)")
    p.add_argument("--n-boot", type=positive_int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    add_run_options(p, threads=0)
    p.add_argument("--replot", action="store_true", help="rewrite tables and figures from the results already in --out")
    p.add_argument(
        "--protocol",
        default="",
        help="run the pre-registered protocol of this twin (docs/faithfulness/protocol.json, "
        "docs/faithfulness/PROTOCOL.md); protocol 1's options above must keep their defaults",
    )
    p.add_argument(
        "--stage", default="all", choices=["all", "per_term", "masking"], help="with --protocol: the endpoint(s) to run"
    )
    p.add_argument(
        "--max-documents",
        type=positive_int,
        default=None,
        help="with --protocol: fewer documents (an exploratory run, no verdicts)",
    )
    add_out(p, resumable=True)
    p.set_defaults(func=run, v1_defaults={a.dest: a.default for a in p._actions if a.dest in V1_OPTIONS})
