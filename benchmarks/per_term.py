"""Speed of per-term causal ground truth: batched single-position forwards vs a full forward per term.

For one text, one layer l and one query i, :func:`geolens.per_term.per_term_effects` computes
the exact KL and Δp of removing each of the n_heads · (i + 1) attention terms α_ij^h ṽ_j^h, as
batched single-position forwards from layer l over a KV cache of the clean prefix;
:func:`geolens.per_term.per_term_effects` with ``method="naive"`` runs one full forward of the whole text per term
(α_ij^h zeroed in ``hook_pattern``). The fast path is timed on **all** terms of (l, i); the naive
path on a fixed subset of ``--naive-terms`` terms (evenly spaced over heads and sources), its time
per term extrapolated to all terms (each naive term costs the same full forward). Rounds are
interleaved (fast, naive, fast, naive, …) after one warm-up of each, so that the load of a shared
machine falls on both alike; the speed ratio of round r is (naive time per term) / (fast time per
term), and the printed interval is a 95% t-interval over rounds on the log ratios (a geometric
mean). Agreement of the two paths on the subset is printed as well (max |ΔKL|, max |ΔΔp|).

Default: SmolLM2-135M (``geolens.load_model("smollm2-135m")``), one 128-token Lee window
(``geolens.data.corpus_windows(model, "lee", 128, 1)``), the middle layer, the last query,
``--threads 1`` (torch threads; a shared 2-core machine makes two-thread timings erratic).
Needs scipy (``pip install 'geolens[bench]'``), checked before anything is timed.

    python benchmarks/per_term.py                 # SmolLM2-135M (the first load may convert it, ~30 s)
    python benchmarks/per_term.py --smoke         # tiny-gqa, seconds; JSON into a temporary folder
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

from _common import require, smoke_folder  # benchmarks/_common.py

GOAL = 100.0  # issue #22 item 3: at least 100× faster than a full forward per term


def ratio_interval(ratios: list[float], level: float = 0.95) -> dict:
    """Geometric mean of per-round ratios with a t-interval on their logs."""
    import numpy as np
    from scipy import stats

    logs = np.log(ratios)
    mean = float(logs.mean())
    half = (
        float(stats.t.ppf((1 + level) / 2, len(logs) - 1) * logs.std(ddof=1) / math.sqrt(len(logs)))
        if len(logs) > 1
        else float("nan")
    )
    return {"ratio": math.exp(mean), "low": math.exp(mean - half), "high": math.exp(mean + half), "level": level}


def subset(effects, n: int) -> list[tuple[int, int]]:
    """``n`` run terms evenly spaced over the (head, source) order."""
    terms = [(int(h), int(j)) for h, j in effects.ran.nonzero()]
    step = max(1, len(terms) // n)
    return terms[::step][:n]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny-gqa, 2 rounds, JSON into a temporary folder")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--naive-terms", type=int, default=6, help="terms timed on the naive path per round")
    parser.add_argument("--layer", type=int, default=None, help="default: the middle layer")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=256, help="terms per fast forward")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()
    require(("scipy", "bench"), ("numpy", "bench"))
    import torch

    import geolens  # noqa: F401  (the import check: everything below needs it)
    from geolens.per_term import per_term_effects

    torch.set_num_threads(args.threads)
    if args.smoke:
        from geolens.testing import tiny_bridge, tiny_tokens

        args.rounds, args.naive_terms = 2, 3
        args.json = os.path.join(smoke_folder(), "per_term.json")
        model = tiny_bridge("gqa")
        tokens = tiny_tokens(model, length=24)[:1]
        name = "tiny-gqa"
    else:
        from geolens.data import corpus_windows

        model = geolens.load_model("smollm2-135m")
        tokens = corpus_windows(model, "lee", args.seq_len, 1)
        name = "smollm2-135m"
    layer = model.cfg.n_layers // 2 if args.layer is None else args.layer
    query = tokens.shape[1] - 1

    warm = per_term_effects(model, tokens, layer, query, batch_size=args.batch_size)  # warm-up
    chosen = subset(warm, args.naive_terms)
    per_term_effects(model, tokens, layer, query, terms=chosen[:1], method="naive")
    n_terms = int(warm.ran.sum())
    rounds = []
    for r in range(args.rounds):
        t = time.perf_counter()
        fast = per_term_effects(model, tokens, layer, query, batch_size=args.batch_size)
        fast_s = time.perf_counter() - t
        t = time.perf_counter()
        naive = per_term_effects(model, tokens, layer, query, terms=chosen, method="naive")
        naive_s = time.perf_counter() - t
        fast_per, naive_per = fast_s / n_terms, naive_s / len(chosen)
        mask = naive.ran
        rounds.append(
            {
                "fast_s": fast_s,
                "fast_ms_per_term": 1e3 * fast_per,
                "naive_s": naive_s,
                "naive_ms_per_term": 1e3 * naive_per,
                "naive_extrapolated_s": naive_per * n_terms,
                "ratio": naive_per / fast_per,
                "max_abs_diff_kl": float((fast.kl[mask] - naive.kl[mask]).abs().max()),
                "max_abs_diff_delta_p": float((fast.delta_p[mask] - naive.delta_p[mask]).abs().max()),
                "max_kl_subset": float(naive.kl[mask].max()),
            }
        )
        print(
            f"round {r}: fast {fast_s:.2f} s for {n_terms} terms ({1e3 * fast_per:.2f} ms/term), naive "
            f"{naive_s:.2f} s for {len(chosen)} terms ({1e3 * naive_per:.1f} ms/term) → {naive_per / fast_per:.0f}×",
            flush=True,
        )
    interval = ratio_interval([r["ratio"] for r in rounds])
    verdict = "met" if interval["low"] >= GOAL else ("not met" if interval["high"] < GOAL else "undecided")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"model {name}, {tokens.shape[1]} tokens, layer {layer}, query {query}, {n_terms} terms "
        f"({model.cfg.n_heads} heads × {query + 1} sources), batch {args.batch_size}, {args.threads} thread(s), load {load:.1f}"
    )
    print(
        f"naive: {len(chosen)} terms per round timed, extrapolated to {n_terms} "
        f"(≈ {sum(r['naive_extrapolated_s'] for r in rounds) / len(rounds):.0f} s for all terms)"
    )
    print(
        f"agreement on the subset: max |ΔKL| {max(r['max_abs_diff_kl'] for r in rounds):.2e} "
        f"(KL up to {max(r['max_kl_subset'] for r in rounds):.2e}), max |ΔΔp| {max(r['max_abs_diff_delta_p'] for r in rounds):.2e}"
    )
    print(
        f"speed ratio naive/fast: {interval['ratio']:.0f}× (95% interval {interval['low']:.0f}–{interval['high']:.0f}×, "
        f"{len(rounds)} interleaved rounds); goal ≥ {GOAL:.0f}×: {verdict}"
    )
    if args.json:
        result = {
            "model": name,
            "n_tokens": int(tokens.shape[1]),
            "layer": layer,
            "query": query,
            "n_terms": n_terms,
            "naive_terms": chosen,
            "batch_size": args.batch_size,
            "threads": args.threads,
            "load": load,
            "rounds": rounds,
            "interval": interval,
            "goal": GOAL,
            "verdict": verdict,
            "model_mode": warm.model_mode,
            "torch": torch.__version__,
        }
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        print(f"figures: {os.path.dirname(os.path.abspath(args.json))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
