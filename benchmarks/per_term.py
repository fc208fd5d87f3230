"""Speed of per-term causal ground truth: batched single-position forwards vs a full forward per term,
and the float64 pass of protocol 3 against its FLOP floor.

**Part 1 (float32, the model as loaded).** For one text, one layer l and one query i,
:func:`geolens.per_term.per_term_effects` computes the exact KL and Δp of removing each of the
n_heads · (i + 1) attention terms α_ij^h ṽ_j^h, as batched single-position forwards from layer l
over a KV cache of the clean prefix; :func:`geolens.per_term.per_term_effects` with
``method="naive"`` runs one full forward of the whole text per term (α_ij^h zeroed in
``hook_pattern``). The fast path is timed on **all** terms of (l, i); the naive path on a fixed
subset of ``--naive-terms`` terms (evenly spaced over heads and sources), its time per term
extrapolated to all terms (each naive term costs the same full forward). The naive path also runs
two forwards of its own whatever the terms (the clean state over positions ≤ i, the clean
reference over the text); they are timed in the same round as a naive call on no terms and taken
off, so that a naive term costs its full forward only. Rounds are interleaved (fast, naive,
naive on no terms, fast, …) after one warm-up of each, so that the load of a shared machine falls
on all alike; the speed ratio of round r is (naive time per term) / (fast time per term), and the
printed interval is a 95% t-interval over rounds on the log ratios (a geometric mean). Agreement
of the two paths on the subset is printed as well (max |ΔKL|, max |ΔΔp|).

**Part 2 (float64, protocol 3's per-term pass).** The model is cast to float64 and run inside
:func:`geolens.per_term.float64_exact`; the windows are protocol 3's (docs/faithfulness/v3/protocol.json:
BOS + the first 127 tokens of each Lee document) and the positions those the protocol draws for the
first ``--float64-documents`` documents (:func:`geolens.faithfulness.ground_truth.draw_positions`,
seed 3, the protocol's positions per document). Each position is timed as the protocol runs it
(:func:`geolens.faithfulness.norm_controlled.norm_controlled_document`): one
:func:`geolens.per_term.position_effects` call, term scope, outcome KL plus Δ log p(next token),
both gradients, the protocol's batch size, with the clean run and the KV cache of the window computed
once before (a per-document cost, timed and printed apart, in neither the time nor the floor).

*Counted partial forwards.* A position (l, i) with n terms (α ≠ 0) runs ⌈n / batch⌉ batches of
single-position forwards, each row = one removed term, plus one clean row per batch, then two
single-row forwards with a backward for the gradients (log p of the top token and of the next
token): rows = n + ⌈n / batch⌉ + 2, each through the L − l layers l … L−1 (position i only) and the
unembedding. The script counts what actually runs with forward hooks on every ``nn.Linear`` during
the (untimed) warm-up call (rows through each block and through the unembedding, and the
multiply-adds of every dense layer), and refuses a count that differs from this formula. The hooks
only read shapes: the timed calls run without them.

*FLOP floor.* The multiply-adds that the pass's outcomes need at least: n removal rows (the clean
rows are not needed: the clean logits are known) and the two gradients, each a forward plus a
backward of activation gradients only, counted as two rows each; per row, for each layer
k = l … L−1: the q, k, v projections d_model · (n_heads + 2 · n_kv_heads) · d_head, the output
projection n_heads · d_head · d_model, the MLP (3 or 2 matrices) · d_model · d_mlp, and the
attention of position i to its keys 2 · n_heads · d_head · keys (keys = i + 1, or the layer's
sliding window where smaller); then the unembedding d_model · d_vocab. Norms, rotary,
softmaxes, the outcomes' log-softmax over the vocabulary and Python overhead count as zero.
FLOPs = 2 × multiply-adds. The floor in seconds divides them by the machine's float64 matmul
throughput measured just before each position's timed pass: the best of two timings of
``F.linear`` on the shapes of a full batch, [batch + 1, d_model] · [d_model, d_mlp] and
[batch + 1, d_model] · [d_model, d_vocab], the faster of the two rates (the floor is then one the
machine reaches on its best shape only; the unembedding's 8-byte weights stream from memory at
a lower rate). The ratio of round r is (the pass's time over all positions) / (the floors' seconds
summed); goal ≤ 3×. Both are measured on the wall clock and on this process's CPU time (one torch
thread: what the process computed, blind to the time other processes hold its core, which on a
shared machine moves wall-clock rates by 2× and more). The naive speed-up is measured in float64
as in part 1 (``--float64-naive-terms`` terms per position and round; goal ≥ 100×).

Default: SmolLM2-135M (``--model``; ``geolens.load_model``), part 1 on one 128-token Lee window
(``geolens.data.corpus_windows(model, "lee", 128, 1)``), the middle layer, the last query;
``--threads 1`` (torch threads; a shared 2-core machine makes two-thread timings erratic).
Needs scipy (``pip install 'geolens[bench]'``), checked before anything is timed.

    python benchmarks/per_term.py                 # SmolLM2-135M, about 3 minutes (the first load may convert it, ~30 s)
    python benchmarks/per_term.py --model gemma3-270m --float64-rounds 2
    python benchmarks/per_term.py --smoke         # tiny-gqa, seconds; JSON into a temporary folder
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import re
import time

from _common import require, smoke_folder  # benchmarks/_common.py

GOAL = 100.0  # issue #22 item 3: at least 100× faster than a full forward per term
FLOOR_GOAL = 3.0  # issue #38 item 7: the float64 pass within 3× of its FLOP floor
PROTOCOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "faithfulness", "v3", "protocol.json")


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


def verdict(interval: dict, goal: float, at_least: bool = True) -> str:
    """'met', 'not met' or 'undecided': where the interval lies against the goal."""
    low, high = (interval["low"], interval["high"]) if at_least else (-interval["high"], -interval["low"])
    goal = goal if at_least else -goal
    return "met" if low >= goal else ("not met" if high < goal else "undecided")


def subset(effects, n: int) -> list[tuple[int, int]]:
    """``n`` run terms evenly spaced over the (head, source) order."""
    terms = [(int(h), int(j)) for h, j in effects.ran.nonzero()]
    step = max(1, len(terms) // n)
    return terms[::step][:n]


def timed(call, cpu: bool = False):
    """(result, wall-clock seconds) of ``call()``; with ``cpu``, (result, wall seconds, CPU seconds
    of this process), the latter blind to the time other processes take the core from it."""
    t, c = time.perf_counter(), time.process_time()
    out = call()
    wall, used = time.perf_counter() - t, time.process_time() - c
    return (out, wall, used) if cpu else (out, wall)


def naive_per_term(model, tokens, layer: int, query: int, chosen, **kwargs) -> tuple[object, float]:
    """(the naive effects of ``chosen``, seconds per term): the naive call's time less that of the
    same call on no terms (its clean state and clean reference), divided by the terms."""
    from geolens.per_term import per_term_effects

    naive, seconds = timed(
        lambda: per_term_effects(model, tokens, layer, query, terms=chosen, method="naive", **kwargs)
    )
    _, fixed = timed(lambda: per_term_effects(model, tokens, layer, query, terms=[], method="naive", **kwargs))
    return naive, max(seconds - fixed, 1e-9) / len(chosen)


# ---------------------------------------------------------------------------------------------
# Part 1: float32, one (layer, query), all its terms


def float32_part(args, model, tokens) -> dict:
    from geolens.per_term import per_term_effects

    layer = model.cfg.n_layers // 2 if args.layer is None else args.layer
    query = tokens.shape[1] - 1
    warm = per_term_effects(model, tokens, layer, query, batch_size=args.batch_size)  # warm-up
    chosen = subset(warm, args.naive_terms)
    naive_per_term(model, tokens, layer, query, chosen[:1])
    n_terms = int(warm.ran.sum())
    rounds = []
    for r in range(args.rounds):
        fast, fast_s = timed(lambda: per_term_effects(model, tokens, layer, query, batch_size=args.batch_size))
        naive, naive_per = naive_per_term(model, tokens, layer, query, chosen)
        fast_per = fast_s / n_terms
        mask = naive.ran
        rounds.append(
            {
                "fast_s": fast_s,
                "fast_ms_per_term": 1e3 * fast_per,
                "naive_ms_per_term": 1e3 * naive_per,
                "naive_extrapolated_s": naive_per * n_terms,
                "ratio": naive_per / fast_per,
                "max_abs_diff_kl": float((fast.kl[mask] - naive.kl[mask]).abs().max()),
                "max_abs_diff_delta_p": float((fast.delta_p[mask] - naive.delta_p[mask]).abs().max()),
                "max_kl_subset": float(naive.kl[mask].max()),
            }
        )
        print(
            f"float32 round {r}: fast {fast_s:.2f} s for {n_terms} terms ({1e3 * fast_per:.2f} ms/term), naive "
            f"{1e3 * naive_per:.1f} ms/term ({len(chosen)} terms) → {naive_per / fast_per:.0f}×",
            flush=True,
        )
    interval = ratio_interval([r["ratio"] for r in rounds])
    print(
        f"float32: {tokens.shape[1]} tokens, layer {layer}, query {query}, {n_terms} terms "
        f"({model.cfg.n_heads} heads × {query + 1} sources), batch {args.batch_size}; naive: {len(chosen)} terms "
        f"per round timed, extrapolated (≈ {sum(r['naive_extrapolated_s'] for r in rounds) / len(rounds):.0f} s "
        f"for all terms)"
    )
    print(
        f"float32 agreement on the subset: max |ΔKL| {max(r['max_abs_diff_kl'] for r in rounds):.2e} "
        f"(KL up to {max(r['max_kl_subset'] for r in rounds):.2e}), "
        f"max |ΔΔp| {max(r['max_abs_diff_delta_p'] for r in rounds):.2e}"
    )
    print(
        f"float32 speed-up over full reruns: {interval['ratio']:.0f}× (95% interval {interval['low']:.0f}–"
        f"{interval['high']:.0f}×, {len(rounds)} interleaved rounds); goal ≥ {GOAL:.0f}×: {verdict(interval, GOAL)}"
    )
    return {
        "n_tokens": int(tokens.shape[1]),
        "layer": layer,
        "query": query,
        "n_terms": n_terms,
        "naive_terms": chosen,
        "batch_size": args.batch_size,
        "rounds": rounds,
        "interval": interval,
        "goal": GOAL,
        "verdict": verdict(interval, GOAL),
        "model_mode": warm.model_mode,
    }


# ---------------------------------------------------------------------------------------------
# Part 2: float64, protocol 3's pass; counts, FLOP floor, matmul throughput


def row_macs(model, layer: int, query: int) -> dict[str, int]:
    """Multiply-adds of one single-position row from ``layer`` on at ``query`` (module docstring):
    the dense layers ("linear": projections, MLPs, unembedding) and the attention to the keys."""
    from geolens.adapter import adapter_for

    cfg = model.cfg
    n_kv = getattr(cfg, "n_key_value_heads", None) or cfg.n_heads
    mlp = (3 if getattr(cfg, "gated_mlp", False) else 2) * cfg.d_model * cfg.d_mlp
    block = cfg.d_model * (cfg.n_heads + 2 * n_kv) * cfg.d_head + cfg.n_heads * cfg.d_head * cfg.d_model + mlp
    adapter = adapter_for(model)
    attention = 0
    for k in range(layer, cfg.n_layers):
        window = adapter.sliding_window(k)
        attention += 2 * cfg.n_heads * cfg.d_head * (query + 1 if window is None else min(query + 1, window))
    return {"linear": block * (cfg.n_layers - layer) + cfg.d_model * cfg.d_vocab, "attention": attention}


class LinearCounter:
    """Forward hooks on every ``nn.Linear`` of the model, recording each call's rows and multiply-adds,
    grouped by block (``blocks.<k>.`` in the module's name; the others, e.g. the unembedding, under
    None). The hooks return nothing, so the forward's results are unchanged."""

    def __init__(self, model):
        import torch

        self.calls: list[tuple[int | None, str, int, int, int]] = []  # (block, name, out_features, rows, macs)
        self.handles = []
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear):
                match = re.search(r"blocks\.(\d+)\.", name)
                self.handles.append(module.register_forward_hook(self._hook(int(match[1]) if match else None, name)))

    def _hook(self, block, name):
        def hook(module, inputs, output):
            rows = inputs[0].numel() // module.in_features
            self.calls.append((block, name, module.out_features, rows, rows * module.in_features * module.out_features))

        return hook

    def remove(self):
        for handle in self.handles:
            handle.remove()

    def summary(self, d_vocab: int) -> dict[str, int]:
        """Single-position layer passes (rows through each block, summed over blocks; every dense
        layer of a block sees the block's rows), rows through the unembedding (the dense layer
        outside the blocks with d_vocab outputs), and the multiply-adds of all dense layers."""
        rows: dict[int, int] = {}
        names: dict[int, set] = {}
        unembed = 0
        for block, name, out, n, _ in self.calls:
            if block is None:
                unembed += n if out == d_vocab else 0
            else:
                rows[block] = rows.get(block, 0) + n
                names.setdefault(block, set()).add(name)
        return {
            "layer_passes": sum(rows[b] // len(names[b]) for b in rows),
            "unembed_rows": unembed,
            "linear_macs": sum(c[4] for c in self.calls),
        }


def matmul_probe(model, rows: int):
    """A function ``repeats -> rates`` timing float64 ``F.linear`` on [rows, d_model] · [d_model, d_mlp]
    and · [d_model, d_vocab] (random operands built once): FLOP/s of the best of ``repeats`` timings
    after one untimed call each, on the wall clock and on this process's CPU time,
    ``{"wall": {"mlp": …, "unembed": …}, "cpu": {…}}``."""
    import torch
    import torch.nn.functional as F

    cfg = model.cfg
    x = torch.randn(rows, cfg.d_model, dtype=torch.float64)
    weights = {
        label: torch.randn(out, cfg.d_model, dtype=torch.float64)
        for label, out in (("mlp", cfg.d_mlp), ("unembed", cfg.d_vocab))
    }

    def rates(repeats: int) -> dict[str, dict[str, float]]:
        out = {"wall": {}, "cpu": {}}
        for label, w in weights.items():
            F.linear(x, w)
            times = [timed(lambda: F.linear(x, w), cpu=True)[1:] for _ in range(repeats)]
            for clock, best in (("wall", min(t[0] for t in times)), ("cpu", min(t[1] for t in times))):
                out[clock][label] = 2.0 * rows * cfg.d_model * w.shape[0] / max(best, 1e-9)
        return out

    return rates


def protocol_positions(args, model, name: str):
    """(windows [documents, pos], per document its distinct drawn (layer, query) positions), as
    protocol 3 draws them; ``--smoke``: one tiny window, queries 8 … pos − 2."""
    from geolens.faithfulness.ground_truth import draw_positions
    from geolens.faithfulness.norm_controlled import SEED, positions_per_document

    if args.smoke:
        from geolens.testing import tiny_tokens

        windows, queries, per_document = tiny_tokens(model, length=24)[:1], (8, 22), 2
    else:
        from geolens.data import load_corpus
        from geolens.faithfulness.preregistered import protocol_windows
        from geolens.preregistration import load_protocol

        protocol = load_protocol(PROTOCOL)
        corpus = load_corpus(protocol["data"]["corpus"])
        windows, _ = protocol_windows(model, protocol, corpus, n_documents=args.float64_documents)
        queries = tuple(protocol["data"]["scored_positions"])
        per_document = positions_per_document(protocol.settings, name)
    drawn = [draw_positions(d, model.cfg.n_layers, per_document, queries, seed=SEED) for d in range(len(windows))]
    return windows, [list(dict.fromkeys(positions)) for positions in drawn]


def float64_part(args, model, name: str) -> dict:
    import torch

    from geolens.adapter import adapter_for, names_filter
    from geolens.faithfulness.norm_controlled import norm_controlled_document
    from geolens.per_term import float64_exact, position_effects

    batch = inspect.signature(norm_controlled_document).parameters["batch_size"].default  # the protocol's
    model = model.to(torch.float64)
    adapter = adapter_for(model)
    cfg = model.cfg
    windows, drawn = protocol_positions(args, model, name)
    positions, calls = [], []
    with float64_exact(model), torch.no_grad():
        for d, pairs in enumerate(drawn):
            tokens = windows[d : d + 1]
            layers = sorted({l for l, _ in pairs})
            wanted, resid = names_filter(model, layers), {adapter.resid_pre_hook(l) for l in layers}
            (clean_run, kv), clean_s = timed(
                lambda: (
                    model.run_with_cache(tokens, names_filter=lambda n: wanted(n) or n in resid),
                    adapter.prefix_kv_cache(tokens),
                )
            )
            for l, q in pairs:

                def call(tokens=tokens, l=l, q=q, clean_run=clean_run, kv=kv):
                    return position_effects(
                        model, tokens, l, q, clean_run=clean_run, kv_cache=kv, outcome=("kl",),
                        batch_size=batch, target=int(tokens[0, q + 1]), scopes=("term",),
                    )  # fmt: skip

                counter = LinearCounter(model)  # the warm-up call, counted
                try:
                    warm = call()
                finally:
                    counter.remove()
                counted = counter.summary(cfg.d_vocab)
                n_terms = int(warm.term.ran.sum())
                rows = n_terms + math.ceil(n_terms / batch) + 2  # terms, a clean row per batch, 2 gradients
                expected = {"layer_passes": rows * (cfg.n_layers - l), "unembed_rows": rows}
                if any(counted[k] != v for k, v in expected.items()):
                    raise SystemExit(f"position ({l}, {q}): counted {counted}, expected {expected} (module docstring)")
                macs = row_macs(model, l, q)
                floor_rows = n_terms + 2 * 2  # the removals, and each gradient as a forward plus a backward
                position = {
                    "document": d,
                    "layer": l,
                    "query": q,
                    "n_terms": n_terms,
                    "batches": math.ceil(n_terms / batch),
                    "rows": rows,
                    "layers_per_row": cfg.n_layers - l,
                    **counted,
                    "row_macs": macs,
                    "floor_macs": floor_rows * (macs["linear"] + macs["attention"]),
                    "floor_linear_macs_of_rows_run": rows * macs["linear"],
                    "naive_terms": subset(warm.term, args.float64_naive_terms),
                    "clean_run_s": clean_s,
                }
                positions.append(position)
                calls.append((tokens, l, q, call))
                print(
                    f"float64 position (document {d}, layer {l}, query {q}): {n_terms} terms → {rows} single-position "
                    f"partial forwards ({n_terms} removals + {position['batches']} clean rows + 2 gradient rows), "
                    f"{cfg.n_layers - l} layers each + the unembedding: {counted['layer_passes']} layer passes, "
                    f"dense multiply-adds run {counted['linear_macs']:.4g} (the floor's dense part for these rows "
                    f"{rows * macs['linear']:.4g}); FLOP floor {2 * position['floor_macs']:.4g}",
                    flush=True,
                )
        tokens, l, q, _ = calls[0]  # warm the naive path once
        naive_per_term(model, tokens, l, q, positions[0]["naive_terms"][:1], outcome=("kl",))
        probe = matmul_probe(model, batch + 1)
        rounds = []
        for r in range(args.float64_rounds):
            fast_s, fast_cpu, floor_s, floor_cpu, naive_s, rates, diff, kl_max = [], [], [], [], [], [], 0.0, 0.0
            for position, (tokens, l, q, call) in zip(positions, calls):
                rates.append(probe(2))  # the throughput just before the position's pass, on both clocks
                effects, seconds, cpu = timed(call, cpu=True)
                naive, per_term = naive_per_term(model, tokens, l, q, position["naive_terms"], outcome=("kl",))
                mask = naive.ran
                diff = max(diff, float((effects.term.kl[mask] - naive.kl[mask]).abs().max()))
                kl_max = max(kl_max, float(naive.kl[mask].max()))
                fast_s.append(seconds)
                fast_cpu.append(cpu)
                floor_s.append(2.0 * position["floor_macs"] / max(rates[-1]["wall"].values()))
                floor_cpu.append(2.0 * position["floor_macs"] / max(rates[-1]["cpu"].values()))
                naive_s.append(per_term * position["n_terms"])
            rounds.append(
                {
                    "fast_s": fast_s,
                    "fast_cpu_s": fast_cpu,
                    "naive_extrapolated_s": naive_s,
                    "matmul_flops_per_s": rates,
                    "floor_s": floor_s,
                    "floor_cpu_s": floor_cpu,
                    "floor_ratio": sum(fast_s) / sum(floor_s),
                    "floor_ratio_cpu": sum(fast_cpu) / sum(floor_cpu),
                    "speed_up": sum(naive_s) / sum(fast_s),
                    "max_abs_diff_kl": diff,
                    "max_kl_subset": kl_max,
                }
            )
            best = {k: max(rate["wall"][k] for rate in rates) for k in rates[0]["wall"]}
            print(
                f"float64 round {r}: pass {sum(fast_s):.2f} s ({sum(fast_cpu):.2f} s CPU) over {len(positions)} "
                "positions; float64 matmul up to "
                + ", ".join(f"{k} {v / 1e9:.1f}" for k, v in best.items())
                + f" GFLOP/s → floor {sum(floor_s):.2f} s, ratio {rounds[-1]['floor_ratio']:.2f}× (CPU time: "
                f"{rounds[-1]['floor_ratio_cpu']:.2f}×); full reruns {sum(naive_s):.0f} s (extrapolated) → "
                f"{rounds[-1]['speed_up']:.0f}×",
                flush=True,
            )
    floor = ratio_interval([r["floor_ratio"] for r in rounds])
    floor_cpu = ratio_interval([r["floor_ratio_cpu"] for r in rounds])
    speed = ratio_interval([r["speed_up"] for r in rounds])
    n_rows = sum(p["rows"] for p in positions)
    print(
        f"float64 pass (protocol 3, {len(windows)} document(s), {len(positions)} positions, batch {batch}): "
        f"{sum(p['n_terms'] for p in positions)} terms, {n_rows} single-position partial forwards, "
        f"{sum(p['layer_passes'] for p in positions)} layer passes; FLOP floor "
        f"{2 * sum(p['floor_macs'] for p in positions) / 1e9:.1f} GFLOP; per-document clean run and KV cache "
        f"{sum({p['document']: p['clean_run_s'] for p in positions}.values()):.2f} s (not in the ratio)"
    )
    print(
        f"float64 agreement with full reruns on {sum(len(p['naive_terms']) for p in positions)} terms: max |ΔKL| "
        f"{max(r['max_abs_diff_kl'] for r in rounds):.2e} (KL up to {max(r['max_kl_subset'] for r in rounds):.2e})"
    )
    print(
        f"float64 ratio = measured / floor_seconds: {floor['ratio']:.2f}× (95% interval {floor['low']:.2f}–"
        f"{floor['high']:.2f}×, {len(rounds)} rounds); goal ≤ {FLOOR_GOAL:.0f}×: {verdict(floor, FLOOR_GOAL, False)}"
    )
    print(
        f"float64 ratio on this process's CPU time (pass and matmul alike): {floor_cpu['ratio']:.2f}× "
        f"(95% interval {floor_cpu['low']:.2f}–{floor_cpu['high']:.2f}×); "
        f"goal ≤ {FLOOR_GOAL:.0f}×: {verdict(floor_cpu, FLOOR_GOAL, False)}"
    )
    print(
        f"float64 speed-up over full reruns: {speed['ratio']:.0f}× (95% interval {speed['low']:.0f}–"
        f"{speed['high']:.0f}×); goal ≥ {GOAL:.0f}×: {verdict(speed, GOAL)}"
    )
    return {
        "protocol": None if args.smoke else "docs/faithfulness/v3/protocol.json",
        "batch_size": batch,
        "positions": positions,
        "rounds": rounds,
        "floor_ratio": floor,
        "floor_goal": FLOOR_GOAL,
        "floor_verdict": verdict(floor, FLOOR_GOAL, False),
        "floor_ratio_cpu": floor_cpu,
        "floor_verdict_cpu": verdict(floor_cpu, FLOOR_GOAL, False),
        "speed_up": speed,
        "goal": GOAL,
        "verdict": verdict(speed, GOAL),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny-gqa, 2 + 1 rounds, JSON into a temporary folder")
    parser.add_argument("--model", default="smollm2-135m", choices=("smollm2-135m", "gemma3-270m"))
    parser.add_argument("--rounds", type=int, default=5, help="float32 rounds")
    parser.add_argument("--naive-terms", type=int, default=6, help="float32 terms timed on the naive path per round")
    parser.add_argument("--layer", type=int, default=None, help="float32 layer, default: the middle layer")
    parser.add_argument("--seq-len", type=int, default=128, help="float32 window length")
    parser.add_argument("--batch-size", type=int, default=256, help="float32 terms per fast forward")
    parser.add_argument("--float64-rounds", type=int, default=3, help="0: no float64 part")
    parser.add_argument("--float64-documents", type=int, default=1, help="protocol 3 windows whose positions run")
    parser.add_argument("--float64-naive-terms", type=int, default=3, help="naive terms per position and round")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()
    require(("scipy", "bench"), ("numpy", "bench"))
    import torch

    import geolens  # noqa: F401  (the import check: everything below needs it)
    from geolens.threads import apply

    apply(args.threads)  # kept when a model loads (geolens.threads)
    if args.smoke:
        from geolens.testing import tiny_bridge, tiny_tokens

        args.rounds, args.naive_terms, args.float64_rounds, args.float64_naive_terms = 2, 3, 1, 1
        args.json = os.path.join(smoke_folder(), "per_term.json")
        model = tiny_bridge("gqa")
        tokens = tiny_tokens(model, length=24)[:1]
        name = "tiny-gqa"
    else:
        from geolens.data import corpus_windows

        name = args.model
        model = geolens.load_model(name)
        tokens = corpus_windows(model, "lee", args.seq_len, 1)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    result = {"model": name, "threads": args.threads, "load_before": load, "torch": torch.__version__}
    result["float32"] = float32_part(args, model, tokens)
    if args.float64_rounds > 0:
        result["float64"] = float64_part(args, model, name)
    result["load_after"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"model {name}, {args.threads} thread(s), load {load:.1f} before, {result['load_after']:.1f} after")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        print(f"figures: {os.path.dirname(os.path.abspath(args.json))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
