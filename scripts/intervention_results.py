"""The interventions protocol (docs/interventions/PROTOCOL.md) on one model: sink value scaling by
layer set and regime ablation against size-matched random heads, with ``geolens.intervene``.

    python scripts/intervention_results.py --model smollm2-135m --out docs/interventions/smollm2-135m

Writes ``summary.json`` and ``README.md`` into ``--out`` (a folder outside docs/ unless told; it
must not exist yet, or pass ``--overwrite``). About 10 minutes for SmolLM2-135M on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

PROTOCOL = Path(__file__).resolve().parents[1] / "docs" / "interventions" / "PROTOCOL.md"
LAMBDAS = (0.0, 0.5, 2.0)
REGIMES = ("reset", "mixer", "retriever")
N_TAXONOMY = N_MEASURE = 40
SEQ_LEN = 128
N_RANDOM = 20
N_BOOT = 2000


def windows(model, n: int, skip: int):
    """The first ``SEQ_LEN``-token window (BOS + 127) of each Lee document long enough, documents
    ``skip`` … in corpus order, ``n`` of them: ``[n, SEQ_LEN]`` and the documents' indices."""
    import torch

    from geolens.data import bos_token_id, load_corpus

    docs = load_corpus("lee")
    tok = model.tokenizer
    bos = bos_token_id(model)
    rows, index = [], []
    for d, doc in enumerate(docs):
        ids = tok(doc, add_special_tokens=False)["input_ids"]
        if len(ids) >= SEQ_LEN - 1:
            index.append(d)
            rows.append([bos] + ids[: SEQ_LEN - 1])
    if len(rows) < skip + n:
        raise ValueError(f"the Lee corpus gives {len(rows)} windows of {SEQ_LEN} tokens, fewer than {skip + n}")
    return torch.tensor(rows[skip : skip + n]), index[skip : skip + n]


def sink_layer_sets(n_layers: int) -> dict[str, list[int]]:
    sixth = list(range(4, n_layers, 6))[:4]  # 4, 10, 16, 22: the layers the user edited
    sets = {"all layers": list(range(n_layers)), "every sixth from 4": sixth}
    sets.update({f"layer {l}": [l] for l in sixth})
    return sets


def run(model_name: str) -> dict:
    import torch

    import geolens
    from geolens.stats import bootstrap_indices, holm_family, resample_means

    torch.set_grad_enabled(False)
    t0 = time.time()
    model = geolens.load_model(model_name)
    cfg = model.cfg
    taxonomy_tokens, taxonomy_docs = windows(model, N_TAXONOMY, 0)
    tokens, docs = windows(model, N_MEASURE, N_TAXONOMY)
    out = {
        "model": model_name,
        "protocol": "docs/interventions/PROTOCOL.md",
        "n_windows": N_MEASURE,
        "n_taxonomy_windows": N_TAXONOMY,
        "seq_len": SEQ_LEN,
        "documents": docs,
        "taxonomy_documents": taxonomy_docs,
        "n_layers": int(cfg.n_layers),
        "n_heads": int(cfg.n_heads),
    }

    # ---- sink value scaling, one family of (layer set, λ)
    rows, samples = [], []
    idx = bootstrap_indices(N_MEASURE, N_BOOT, 0)
    for name, layers in sink_layer_sets(cfg.n_layers).items():
        # every λ of a layer set in one call: the clean pass (λ = 1) runs once
        s = geolens.intervene.scale_sink_values(
            model, tokens, lam=LAMBDAS[0], lambdas=LAMBDAS[1:], layers=layers, keep_logits=False, batch_size=8
        )
        for lam in LAMBDAS:
            d = s.drift.row_nll[lam] - s.drift.row_nll[1.0]  # one group of windows: rows in order
            heads = s.drift.heads
            low = heads[heads.low_norm]
            at = low[low["lambda"] == lam].set_index(["layer", "head"]).cos_cone
            ref = low[low["lambda"] == 1.0].set_index(["layer", "head"]).cos_cone
            row = s.summary.set_index("lambda")
            rows.append(
                {
                    "layer_set": name,
                    "layers": layers,
                    "lambda": lam,
                    "delta_loss": float(d.mean()),
                    "clean_ppl": float(row.loc[1.0, "ppl"]),
                    "edited_ppl": float(row.loc[lam, "ppl"]),
                    "n_low_norm_heads": int(len(at)),
                    "low_norm_cos_cone_clean": float(ref.mean()),
                    "low_norm_cos_cone_edited": float(at.mean()),
                    "low_norm_share_cos_rises": float((at > ref.reindex(at.index)).mean()),
                }
            )
            samples.append(resample_means(d, idx))
            print(f"sink {name} λ={lam:g}: Δloss {d.mean():+.4f} ({time.time() - t0:.0f} s)", flush=True)
    for row, test in zip(rows, holm_family([r["delta_loss"] for r in rows], samples)):
        row.update(
            ci_low=test.ci_low, ci_high=test.ci_high, ci_level=test.level, p_adj=test.p_adj, verdict=test.verdict
        )
    out["sink_scaling"] = rows

    # ---- regime ablation against random heads, one family of the regimes present
    taxonomy = geolens.head_taxonomy(model, taxonomy_tokens, batch_size=8)
    counts = taxonomy.table.regime.value_counts().to_dict()
    out["regime_counts"] = {k: int(v) for k, v in counts.items()}
    regime_rows, regime_samples, testable = [], [], []
    for regime in REGIMES:
        heads = geolens.intervene.regime_heads(taxonomy, regime)
        if not heads:
            regime_rows.append({"regime": regime, "n_heads": 0, "verdict": "absent"})
            continue
        r = geolens.intervene.ablate_regime(
            model, tokens, regime, taxonomy=taxonomy, n_random=N_RANDOM, seed=0, n_boot=N_BOOT, batch_size=8
        )
        est = r.difference[0]
        regime_rows.append(
            {
                "regime": r.regime,
                "n_heads": len(r.heads),
                "delta_loss": r.delta_loss,
                "random_delta_loss_mean": float(r.random_delta_loss.mean()),
                "random_delta_loss_min": float(r.random_delta_loss.min()),
                "random_delta_loss_max": float(r.random_delta_loss.max()),
                "difference": est,
            }
        )
        regime_samples.append(r.difference_samples)
        testable.append(r.testable)
        print(f"regime {r.regime}: {r.description} ({time.time() - t0:.0f} s)", flush=True)
    present = [row for row in regime_rows if row["n_heads"]]
    tests = holm_family([r["difference"] for r in present], regime_samples, testable=testable)
    for row, test in zip(present, tests):
        row.update(
            ci_low=test.ci_low, ci_high=test.ci_high, ci_level=test.level, p_adj=test.p_adj, verdict=test.verdict
        )
    out["regime_ablation"] = regime_rows
    out["n_random"] = N_RANDOM
    out["n_boot"] = N_BOOT
    out["seconds"] = round(time.time() - t0, 1)
    out["versions"] = {p: metadata.version(p) for p in ("geolens", "torch", "transformer-lens", "transformers")}
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=PROTOCOL.parent)
    dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, cwd=PROTOCOL.parent)
    out["commit"] = commit.stdout.strip() or None
    out["working_tree"] = "clean" if not dirty.stdout.strip() else "dirty"
    return out


def fmt_ci(row) -> str:
    return f"{row['ci_low']:+.4f}, {row['ci_high']:+.4f}"


def readme(s: dict) -> str:
    lines = [
        f"# Interventions on {s['model']} (protocol version 1)",
        "",
        f"[Protocol](../PROTOCOL.md). {s['n_windows']} windows of {s['seq_len']} tokens (one per Lee document, "
        f"documents {s['documents'][0]}–{s['documents'][-1]}); regimes from {s['n_taxonomy_windows']} other windows. "
        f"Commit {(s['commit'] or '?')[:10]} ({s['working_tree']} tree), {s['seconds']:.0f} s. Written by "
        f"`python scripts/intervention_results.py --model {s['model']} --out docs/interventions/{s['model']}`.",
        "",
        "## Sink value scaling: v_0 ← λ v_0",
        "",
        "Δloss: mean over windows of the next-token NLL change (nats per token), edited − clean, with its Holm-adjusted "
        "bootstrap interval over windows (family: every row). Low-norm heads: cosine of their outputs with the "
        "semantic cone, clean → edited, and the share of them whose cosine rises.",
        "",
        "| layers edited | λ | Δloss [interval] | verdict | PPL clean → edited | low-norm cos(o, cone) | share rising |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in s["sink_scaling"]:
        lines.append(
            f"| {r['layer_set']} | {r['lambda']:g} | {r['delta_loss']:+.4f} [{fmt_ci(r)}] | {r['verdict']} | "
            f"{r['clean_ppl']:.2f} → {r['edited_ppl']:.2f} | {r['low_norm_cos_cone_clean']:.3f} → "
            f"{r['low_norm_cos_cone_edited']:.3f} | {r['low_norm_share_cos_rises']:.0%} of {r['n_low_norm_heads']} |"
        )
    lines += [
        "",
        "## Regime ablation against random heads",
        "",
        f"Zero ablation of every head of a regime, against {s['n_random']} draws of as many random heads. "
        f"Regimes: {', '.join(f'{k} {v}' for k, v in sorted(s['regime_counts'].items()))} of "
        f"{s['n_layers'] * s['n_heads']} heads. Difference: regime Δloss − random Δloss (nats per token), Holm "
        'over the regimes; "holds": the regime hurts more than random heads of the same number.',
        "",
        "| regime | heads | Δloss | random Δloss, mean (min–max) | difference [interval] | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for r in s["regime_ablation"]:
        if not r["n_heads"]:
            lines.append(f"| {r['regime']} | 0 | – | – | – | absent |")
            continue
        lines.append(
            f"| {r['regime']} | {r['n_heads']} | {r['delta_loss']:+.3f} | {r['random_delta_loss_mean']:+.3f} "
            f"({r['random_delta_loss_min']:+.3f} – {r['random_delta_loss_max']:+.3f}) | {r['difference']:+.3f} "
            f"[{fmt_ci(r)}] | {r['verdict']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m", choices=["smollm2-135m", "gemma3-270m"])
    parser.add_argument("--out", type=Path, required=True, help="the results folder (must not exist)")
    parser.add_argument("--overwrite", action="store_true", help="replace summary.json and README.md in --out")
    args = parser.parse_args(argv)
    if args.out.exists() and not args.overwrite:
        print(f"intervention_results: {args.out} exists: pass --overwrite or another --out", file=sys.stderr)
        return 2
    summary = run(args.model)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    (args.out / "README.md").write_text(readme(summary), encoding="utf-8")
    print(f"wrote {args.out}/summary.json and README.md", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
