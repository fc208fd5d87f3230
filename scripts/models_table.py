"""The two-model table of docs/results.md: model × claim → measured [95% CI], from the runs saved in docs/.

Reads the folders written by the commands docs/results.md names (SmolLM2-135M in ``docs/<topic>/``,
Gemma 3 270M in ``docs/<topic>/gemma3-270m/``; a topic a model has not run shows "not run"),
writes ``docs/models.md`` and ``docs/models.json`` and replaces the block of ``docs/results.md`` between
``<!-- models-table:start -->`` and ``<!-- models-table:end -->``::

    python scripts/models_table.py

Nothing is re-run. Confidence intervals come from the unit each run sampled:

- head-level statistics (sink norm ratio, alignment, regime shares, convexity): percentile
  bootstrap over the model's heads (2000 resamples, seed 0), the heads measured on the run's
  windows (n windows stated per row). Heads of one model are not independent draws, so these CIs
  describe the spread over heads, not sampling over models;
- token selection: the run's own window-bootstrap CIs (``summary.json``);
- faithfulness: the run's paired document-bootstrap CIs (``summary.json`` → ``pairs``);
- perplexity effects of the sink edit and of pruning come without a CI (16 and 4 windows, one
  seed for the edit, 3 seeds for random pruning): marked "no CI", and their verdict is not
  decided by this table.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MODELS = {"smollm2-135m": "", "gemma3-270m": "gemma3-270m"}
N_BOOT, SEED = 2000, 0
START, END = "<!-- models-table:start -->", "<!-- models-table:end -->"


def folder(topic: str, model: str, sub: str = "") -> Path:
    base = DOCS / topic
    if MODELS[model]:
        base = base / MODELS[model]
    return base / sub if sub else base


def boot(values, stat=np.mean) -> tuple[float, float, float]:
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    rng = np.random.default_rng(SEED)
    idx = rng.integers(0, len(x), size=(N_BOOT, len(x)))
    dist = np.array([stat(x[i]) for i in idx])
    return float(stat(x)), float(np.quantile(dist, 0.025)), float(np.quantile(dist, 0.975))


def ci(est: tuple[float, float, float], fmt: str = "{:.3f}", pct: bool = False) -> str:
    m, lo, hi = est
    if pct:
        return f"{100 * m:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]"
    return f"{fmt.format(m)} [{fmt.format(lo)}, {fmt.format(hi)}]"


def sinks(model: str) -> dict[str, str] | None:
    f = folder("sinks", model)
    if not (f / "summary.json").exists() or not (f / "geometry_heads.csv").exists():
        return None
    s = json.loads((f / "summary.json").read_text())
    heads = pd.read_csv(f / "geometry_heads.csv")
    n = int(s["n_sequences"])
    out = {
        "sink heads (Gu et al. ε = 0.3), share of heads": ci(boot(heads.gu_sink_share), pct=True)
        + f"; n = {len(heads)} heads × {n} windows",
        "sink projected-value norm ‖ṽ_0‖/mean‖ṽ_j‖ (median over heads; Mudarisov et al. 2026: 3–10× smaller)": ci(
            boot(heads.proj_norm_ratio, np.median)
        )
        + f"; {100 * (heads.proj_norm_ratio < 1).mean():.0f}% of heads below 1",
        "mean cos(ṽ_0, ṽ_j) over heads (Mudarisov et al. 2026: negative)": ci(boot(heads.proj_cos_tail), "{:+.3f}")
        + f"; negative in {100 * (heads.proj_cos_tail < 0).mean():.0f}% of heads",
    }
    fits = f / "norm_fits.csv"
    if fits.exists():
        h = pd.read_csv(fits)
        h = h[(h.scope == "head") & h.curvature.notna()]
        ok = (h.convex.astype(bool) & h.argmin_inside.astype(bool)).astype(float)
        out[
            "‖o_i‖ vs sink rate convex with its minimum inside (0, 1), share of fitted heads (Cunningham & Muça Cirone 2026)"
        ] = ci(boot(ok), pct=True) + f"; {len(h)} heads"
    drift = f / "drift_summary.csv"
    if drift.exists():
        d = pd.read_csv(drift).set_index("lambda")
        nd = s.get("drift_n_sequences", "?")
        out["ΔPPL when v_0 is scaled by λ in every layer (λ = 0 / λ = 2)"] = (
            f"{d.loc[0.0, 'delta_ppl']:+.1f} / {d.loc[2.0, 'delta_ppl']:+.1f} (no CI; {nd} windows)"
        )
    ctl = DOCS / "sinks" / f"controls-{model}" / "controls_summary.json"
    if ctl.exists():
        c = json.loads(ctl.read_text())
        scopes = {"all_heads": "all heads", "sink_heads": "sink heads"}
        parts = [
            f"{scopes.get(p['scope'], p['scope'])}: {p['verdict']} {p['estimate']:+.3f} [{p['ci_low']:+.3f}, {p['ci_high']:+.3f}]"
            for p in c["pairs"]
            if p["outcome"] == "kl"
        ]
        seeds = max(len(v) for v in c["seeds"].values())
        out[
            "the sink's norm specifically matters: KL(norm edit λ = 0, 2) − KL(60° rotation) at matched dose ‖Δv_0‖ = ‖v_0‖ (PROTOCOL.md §6)"
        ] = (
            "; ".join(parts)
            + f" ({c['multiple_comparison'].capitalize()}; {c['n_windows']} windows × {c['settings']['seq_len']} tokens from "
            f"{c['n_documents']} documents, {seeds} rotation seeds, layers {', '.join(map(str, c['layers']))})"
        )
    return out


def taxonomy(model: str) -> dict[str, str] | None:
    f = folder("taxonomy", model)
    if not (f / "summary.json").exists():
        return None
    s = json.loads((f / "summary.json").read_text())
    n = s.get("n_windows") or s["settings"]["n_sequences"]
    out = {}
    for corpus in ("lee", "enwiki"):
        p = f / f"heads_{corpus}.csv"
        if not p.exists():
            continue
        h = pd.read_csv(p)
        shares = " / ".join(ci(boot((h.regime == r).astype(float)), pct=True) for r in ("Mixer", "Retriever", "Reset"))
        out[f"regime shares Mixer / Retriever / Reset ({corpus}; Mudarisov et al. 2026: Retrievers 5.8–17.2%)"] = (
            shares + f"; {len(h)} heads × {n if isinstance(n, int) else n.get(corpus, n)} windows"
        )
    off = s.get("offset_dominated_heads", {}).get("lee")
    if off is not None:
        out["Reset heads dominated by one offset (lee, > 50% of queries)"] = (
            f"{len(off)}: " + ", ".join(f"L{l}H{hh}" for l, hh, _ in off[:6]) + (" …" if len(off) > 6 else "")
        )
    st = s.get("stability")
    if st:
        out["same regime on lee and enwiki"] = f"{100 * st['agreement']:.1f}% of heads"
    return out


def selection(model: str) -> dict[str, str] | None:
    f = folder("selection", model, "lee")
    if not (f / "summary.json").exists():
        return None
    s = json.loads((f / "summary.json").read_text())
    c = s["corpora"]["lee"]
    n = c["n_documents"]
    out = {}
    for N in ("2", "8"):
        keep = c["value/cosine/attention/sink-keep"][N]
        out[f"F_{N} top-N by attention − random N-subset (value space, cosine, lee)"] = (
            f"{keep['diff']:+.3f} [{keep['diff_lo']:+.3f}, {keep['diff_hi']:+.3f}]; n = {n} windows"
        )
    k, e = c["value/cosine/attention/sink-keep"]["4"], c["value/cosine/attention/sink-exclude"]["4"]
    out["F_4 of top-N with the sink kept / excluded (lee)"] = (
        f"{k['top']:.3f} [{k['top_lo']:.3f}, {k['top_hi']:.3f}] / {e['top']:.3f} [{e['top_lo']:.3f}, {e['top_hi']:.3f}]"
    )
    return out


def pruning(model: str) -> dict[str, str] | None:
    f = folder("pruning", model)
    if not (f / "pruning.csv").exists():
        return None
    p = pd.read_csv(f / "pruning.csv")
    run = json.loads((f / "run.json").read_text()) if (f / "run.json").exists() else {}
    r = p[np.isclose(p.retention, 0.7)]
    regime = float(r[r.order == "regime"].delta_ppl.iloc[0])
    rand = r[r.order.str.startswith("random")].delta_ppl
    out = {
        "ΔPPL at 70% of heads kept: regime order / random orders": f"{regime:+.1f} / {', '.join(f'{v:+.1f}' for v in rand)} (no CI; {run.get('n_sequences', '?')} windows × {run.get('seq_len', '?')} tokens)",
    }
    crit = f / "critical_heads.csv"
    if crit.exists():
        c = pd.read_csv(crit)
        c = c[c.critical.astype(bool)].sort_values("delta_ppl", ascending=False)
        if len(c):
            top = c.iloc[0].to_dict()
            layer, head, regime, dppl = int(top["layer"]), int(top["head"]), top["regime"], top["delta_ppl"]
            out["single-head scan: critical heads (robust z > 3.5), the largest"] = (
                f"{len(c)} of {run.get('n_heads_total', '?')}; L{layer}H{head} ({regime}, ΔPPL {dppl:+.2f})"
            )
    return out


def faithfulness(model: str) -> dict[str, str] | None:
    f = DOCS / "faithfulness" / model / "summary.json"
    if not f.exists():
        return None
    s = json.loads(f.read_text())
    out = {}
    steps = (
        ("raw_attention", "value_weighted", "raw attention → value-weighted"),
        ("raw_attention", "contribution", "raw attention → contribution"),
    )
    for a, b, what in steps:
        for q in s["pairs"]:
            if q["endpoint"] == "per_term" and q["scope"] == "term" and q["a"] == a and q["b"] == b:
                out[
                    f"faithfulness (primary, PROTOCOL.md): {what}, gain in Spearman ρ with each term's measured KL (+ = b more faithful)"
                ] = (
                    f"{q['estimate']:+.3f} [{q['ci_low']:+.3f}, {q['ci_high']:+.3f}] {q['verdict']} (Holm); "
                    f"n = {q['n_positions']} positions from {q['n_documents']} documents"
                )
    return out


TOPICS = (
    ("sinks", sinks),
    ("taxonomy", taxonomy),
    ("selection", selection),
    ("pruning", pruning),
    ("faithfulness", faithfulness),
)


def build() -> dict:
    table: dict[str, dict[str, str]] = {}
    order: list[str] = []
    for _, fn in TOPICS:
        per_model = {m: fn(m) or {} for m in MODELS}
        for m, rows in per_model.items():
            for claim, value in rows.items():
                if claim not in table:
                    table[claim] = {}
                    order.append(claim)
                table[claim][m] = value
    return {
        "models": list(MODELS),
        "claims": [{"claim": c, **{m: table[c].get(m, "not run") for m in MODELS}} for c in order],
    }


def markdown(data: dict) -> str:
    ms = data["models"]
    lines = ["| claim | " + " | ".join(ms) + " |", "|---|" + "---|" * len(ms)]
    for row in data["claims"]:
        lines.append(f"| {row['claim']} | " + " | ".join(row[m].replace("|", "\\|") for m in ms) + " |")
    return "\n".join(lines)


def main() -> int:
    data = build()
    md = markdown(data)
    (DOCS / "models.json").write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    (DOCS / "models.md").write_text(
        "# Two models, one table\n\nWritten by `python scripts/models_table.py` from the runs in docs/ "
        "(see that script's docstring for the CIs).\n\n" + md + "\n"
    )
    results = DOCS / "results.md"
    text = results.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"{results} has no {START} … {END} block to replace")
    text = re.sub(re.escape(START) + r".*?" + re.escape(END), lambda _: f"{START}\n{md}\n{END}", text, flags=re.S)
    results.write_text(text)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
