"""Speed of per-layer masking (protocol 2, PROTOCOL.md §3): masked forwards started at the masked
layer from the clean residual stream vs the same forwards recomputed from layer 0, in one run.

For one window and each layer (``--layers``: all by default, so that the mean over layers is the
protocol's, which masks every layer equally often), the layer's masked conditions are those of
:func:`geolens.faithfulness.layer_masking.layer_masking_document` (every protocol metric ×
direction × k, and all removed; scores from one clean forward, Value Zeroing included, distinct
masks only), ``--conditions`` of them evenly spaced (all with 0). Both ways run them as rows of
batches of ``--batch-size`` through :func:`geolens.faithfulness.layer_masking.masked_outcomes`
and unembed the scored positions only:

- ``start-at-layer``: each batch starts at the masked layer from the clean residual stream
  (``ModelAdapter.forward_from_layer``: the earlier blocks do not run);
- ``from-layer-0``: each batch runs the whole model from the tokens.

Rounds alternate the two ways (which one goes first alternates too) after one warm-up of each,
so that the load of a shared machine falls on both alike. Speed-ups, with 95% percentile
intervals from a bootstrap over rounds (:mod:`geolens.stats`: the same resamples of rounds for
every figure):

- per layer: mean time from layer 0 / mean time from the layer;
- **mean over layers** of the per-layer speed-ups (the goal, ≥ 3×, issue #22 item 10);
- the ratio of the summed times over the layers (over every layer: the saving of a protocol run).

Expect less than the block counts L/(L − l) suggest: both ways pay the unembedding of the scored
positions (for SmolLM2, 30 × 576 × 49 152 multiply-adds, about two blocks over 128 positions)
and the float64 outcomes.

Both ways must give the same outcomes: the largest |difference| of KL, Δp and NLL is printed (float32
rounding only: the earlier blocks run on a batch of 1 for the cached residual, of n rows from
layer 0). The cost of a protocol run is projected from the measured start-at-layer time per
condition. Times are wall-clock on this machine in this run (no timed assertion anywhere); the
load average is printed with them.

    python benchmarks/masking.py                  # SmolLM2-135M, one 128-token Lee window, every layer, 8 conditions, 3 rounds
    python benchmarks/masking.py --tiny           # a tiny random model (seconds)
    python benchmarks/masking.py --smoke          # checks the script: --tiny, 2 layers, 4 conditions, JSON into a temporary folder
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from _common import smoke_folder  # benchmarks/_common.py

GOAL = 3.0  # issue #22 item 10: per-layer masking at least 3× faster than recomputing from layer 0
PROTOCOL = Path(__file__).resolve().parents[1] / "docs" / "faithfulness" / "protocol.json"


def layer_masks(model, tokens, cache, layers, protocol, document_index=0):
    """{layer: (distinct masks [n, head, q, k], conditions)} of the protocol's conditions."""
    from geolens.adapter import get_attention_layer
    from geolens.faithfulness import value_zeroing
    from geolens.faithfulness.layer_masking import (
        distinct_masks,
        layer_conditions,
        masking_random_seed,
        masking_scores,
        protocol_metrics,
    )

    metrics = protocol_metrics(protocol)
    second = protocol["secondary"]
    vz = value_zeroing(model, tokens, layers)
    out = {}
    for n, layer in enumerate(sorted(layers)):
        view = get_attention_layer(model, cache, layer)
        scores = masking_scores(
            view, metrics, value_zeroing=vz[n, 0], random_seed=masking_random_seed(document_index, layer)
        )
        conditions = layer_conditions(scores, view.pattern[0] != 0, second["fractions"], second["directions"])
        _, masks, _ = distinct_masks(conditions)
        out[layer] = (masks, len(conditions))
    return out


def spaced(n_total: int, n: int) -> list[int]:
    """``n`` indices evenly spaced over 0 … n_total − 1 (all when n is 0 or ≥ n_total)."""
    if n <= 0 or n >= n_total:
        return list(range(n_total))
    return sorted({round(i * (n_total - 1) / (n - 1)) for i in range(n)}) if n > 1 else [n_total // 2]


def speedups(t_layer, t_zero, n_boot: int, seed: int) -> dict:
    """Per-layer speed-ups, their mean over layers and the summed-time ratio, with 95% intervals
    from one set of bootstrap resamples of the rounds (``t_*``: ``[round, layer]`` seconds)."""
    import numpy as np

    from geolens.stats import bootstrap_indices, percentile_ci, resample_means

    t_layer, t_zero = np.asarray(t_layer), np.asarray(t_zero)
    idx = bootstrap_indices(t_layer.shape[0], n_boot, seed)
    boot_layer, boot_zero = resample_means(t_layer, idx), resample_means(t_zero, idx)  # [n_boot, layer]
    per_layer = t_zero.mean(0) / t_layer.mean(0)
    boot_ratio = boot_zero / boot_layer
    lo, hi = percentile_ci(boot_ratio, 0.95)
    mean_lo, mean_hi = percentile_ci(boot_ratio.mean(1), 0.95)
    total_lo, total_hi = percentile_ci(boot_zero.sum(1) / boot_layer.sum(1), 0.95)
    return dict(
        per_layer=[dict(ratio=float(r), low=float(a), high=float(b)) for r, a, b in zip(per_layer, lo, hi)],
        mean_over_layers=dict(ratio=float(per_layer.mean()), low=float(mean_lo), high=float(mean_hi)),
        summed_time=dict(
            ratio=float(t_zero.mean(0).sum() / t_layer.mean(0).sum()), low=float(total_lo), high=float(total_hi)
        ),
        n_rounds=int(t_layer.shape[0]),
        n_boot=int(n_boot),
        seed=int(seed),
    )


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--tiny", action="store_true", help="tiny random GQA model (6 layers) instead of SmolLM2")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument(
        "--layers", default="all", help="'all', a count of evenly spaced layers, or comma-separated layer indices"
    )
    p.add_argument(
        "--conditions",
        type=int,
        default=8,
        help="masked conditions per layer, evenly spaced over the layer's distinct masks (0: all)",
    )
    p.add_argument("--batch-size", type=int, default=16, help="conditions per forward")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds of both ways, interleaved")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (a shared 2-core machine makes two-thread timings erratic)",
    )
    p.add_argument("--n-boot", type=int, default=2000)
    p.add_argument("--json", default="", help="also write the numbers to this file")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="check the script in seconds: --tiny, 24 tokens, 2 layers, 4 conditions, 2 rounds, JSON into a temporary folder",
    )
    args = p.parse_args()
    if args.smoke:
        args.tiny, args.seq_len, args.layers, args.conditions, args.rounds, args.batch_size = True, 24, "2", 4, 2, 3
        args.json = args.json or os.path.join(smoke_folder(), "masking.json")

    import torch

    from geolens.adapter import adapter_for, names_filter
    from geolens.faithfulness.layer_masking import masked_outcomes, scored_positions

    torch.set_grad_enabled(False)
    from geolens.threads import apply

    apply(args.threads)  # kept when a model loads (geolens.threads)
    protocol = json.loads(PROTOCOL.read_text(encoding="utf-8"))
    if args.tiny:
        from geolens.testing import tiny_bridge, tiny_tokens

        model = tiny_bridge("gqa", n_layers=6)
        tokens = tiny_tokens(model, length=min(args.seq_len, 128))[:1]
        name = "tiny-gqa (6 layers)"
    else:
        from geolens.data import corpus_windows
        from geolens.models import load_model

        model = load_model("smollm2-135m")
        tokens = corpus_windows(model, "lee", args.seq_len, 1)
        name = "smollm2-135m"
    n_pos = tokens.shape[1]
    first, last, step = protocol["secondary"]["scored_positions"]
    if last > n_pos - 2:  # a short window (--tiny, --smoke): the same spacing, inside it
        first, step = min(first, (n_pos - 2) // 4), max(1, min(step, (n_pos - 2) // 5))
        protocol["secondary"]["scored_positions"] = [first, n_pos - 2 - (n_pos - 2 - first) % step, step]
    positions = scored_positions(protocol)
    L = model.cfg.n_layers
    if args.layers == "all":
        layers = list(range(L))
    elif args.layers.isdigit():
        layers = spaced(L, int(args.layers))
    else:
        layers = sorted({int(x) % L for x in args.layers.split(",")})
    adapter = adapter_for(model)
    wanted = names_filter(model, layers)
    resid_names = {adapter.resid_pre_hook(l) for l in layers}
    logits, cache = model.run_with_cache(tokens, names_filter=lambda n: wanted(n) or n in resid_names)
    clean = logits[0, positions]
    all_masks = layer_masks(model, tokens, cache, layers, protocol)
    masks = {l: m[spaced(m.shape[0], args.conditions)] for l, (m, _) in all_masks.items()}
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"{name}: one window of {n_pos} tokens, {len(positions)} scored predictions, layers {layers}, "
        f"{args.conditions or 'all'} conditions per layer (of {[int(all_masks[l][0].shape[0]) for l in layers]} distinct), "
        f"batch {args.batch_size}, {args.rounds} rounds, torch threads {torch.get_num_threads()}, load {load:.1f} on {os.cpu_count()} CPUs"
    )

    def run(layer, start_at_layer):
        resid = cache[adapter.resid_pre_hook(layer)] if start_at_layer else None
        return masked_outcomes(
            model, tokens, layer, masks[layer], positions, clean, resid_pre=resid, batch_size=args.batch_size
        )

    for layer in layers:  # warm-up of both ways
        run(layer, True), run(layer, False)
    t_layer = [[0.0] * len(layers) for _ in range(args.rounds)]
    t_zero = [[0.0] * len(layers) for _ in range(args.rounds)]
    max_diff = {k: 0.0 for k in ("kl", "delta_p", "nll")}
    for r in range(args.rounds):
        for n, layer in enumerate(layers):
            results = {}
            for way in (True, False) if (r + n) % 2 == 0 else (False, True):
                t = time.perf_counter()
                results[way] = run(layer, way)
                (t_layer if way else t_zero)[r][n] = time.perf_counter() - t
            for k in max_diff:
                max_diff[k] = max(max_diff[k], float((results[True][k] - results[False][k]).abs().max()))
        print(
            f"round {r}: "
            + ", ".join(f"layer {l} {t_zero[r][n]:.2f}/{t_layer[r][n]:.2f} s" for n, l in enumerate(layers))
            + " (from 0 / from the layer)",
            flush=True,
        )
    result = speedups(t_layer, t_zero, args.n_boot, 0)
    verdict = (
        "met"
        if result["mean_over_layers"]["low"] >= GOAL
        else ("not met" if result["mean_over_layers"]["high"] < GOAL else "undecided")
    )
    print(
        f"\n  {'layer':>5} {'from 0 (s)':>10} {'from layer (s)':>14} {'speed-up':>9} {'95% interval':>15} {'blocks L/(L−l)':>15}"
    )
    for n, layer in enumerate(layers):
        s = result["per_layer"][n]
        mz = sum(t[n] for t in t_zero) / args.rounds
        ml = sum(t[n] for t in t_layer) / args.rounds
        interval = f"{s['low']:.2f}–{s['high']:.2f}×"
        print(f"  {layer:>5} {mz:>10.3f} {ml:>14.3f} {s['ratio']:>8.2f}× {interval:>15} {L / (L - layer):>14.2f}×")
    m, tot = result["mean_over_layers"], result["summed_time"]
    print(
        f"\nagreement: max |ΔKL| {max_diff['kl']:.2e}, max |ΔΔp| {max_diff['delta_p']:.2e}, max |ΔNLL| {max_diff['nll']:.2e}"
    )
    print(
        f"speed-up, mean over layers: {m['ratio']:.2f}× (95% interval {m['low']:.2f}–{m['high']:.2f}×, {args.rounds} rounds); goal ≥ {GOAL:.0f}×: {verdict}"
    )
    print(
        f"speed-up of the summed time over these layers (the saving of a run masking every layer alike): "
        f"{tot['ratio']:.2f}× ({tot['low']:.2f}–{tot['high']:.2f}×)"
    )
    n_conditions = sum(c for _, c in all_masks.values()) / len(layers)
    per_condition = sum(sum(t) for t in t_layer) / args.rounds / sum(masks[l].shape[0] for l in layers)
    n_doc_layers = 3 * int(protocol["data"]["n_documents"])
    projection = dict(
        conditions_per_document_layer=n_conditions,
        seconds_per_condition_start_at_layer=per_condition,
        document_layers=n_doc_layers,
        hours_masked_forwards=n_doc_layers * n_conditions * per_condition / 3600,
    )
    print(
        f"projection: {n_doc_layers} (document, layer) × {n_conditions:.0f} conditions × {per_condition:.3f} s ≈ "
        f"{projection['hours_masked_forwards']:.2f} h of masked forwards (at this load and thread count; "
        "identical masks run once, so fewer in a run)"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                dict(
                    model=name,
                    n_tokens=int(n_pos),
                    scored_positions=positions,
                    layers=layers,
                    n_layers=L,
                    conditions_per_layer=[int(masks[l].shape[0]) for l in layers],
                    batch_size=args.batch_size,
                    threads=torch.get_num_threads(),
                    load_average=load,
                    cpus=os.cpu_count(),
                    seconds_start_at_layer=t_layer,
                    seconds_from_layer_0=t_zero,
                    speedups=result,
                    goal=GOAL,
                    verdict=verdict,
                    max_abs_diff=max_diff,
                    projection=projection,
                    model_mode=adapter.model_mode,
                    torch=torch.__version__,
                ),
                f,
                indent=1,
            )
        print(f"figures: {os.path.dirname(os.path.abspath(args.json))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
