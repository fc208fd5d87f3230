"""Benchmark: geolens contribution weights vs a forward pass and vs a naive materialising reference.

On SmolLM2-135M (CPU), for sequence lengths 128 and 512 (batch 1), measures in one run:

(a) a plain ``run_with_cache`` (all hooks cached);
(b) geolens all-layer contribution weights, intra and inter together in one pass
    (``contribution_weight_pair``: shared z, Gram products and pattern read; the cache's ``hook_z`` is used
    once Freivalds' check against α and v passes, during the same read of α) from that cache;
(b2) the same two results as two single-mode passes (the previous way), side by side;
(b1) intra only, one pass;
(b0) (b) with ``out=``: the results written into memory reused from call to call (as a loop over
    texts of one shape would), so that the kernel maps no new page for them;
(c) a naive reference that materialises α_ij ṽ_j as ``[query, key, d_model]`` per head and
    projects it on o_i, timed on ``--naive-layers`` layers and scaled to all layers.

(a), (b), (b2), (b1) and (b0) are timed in interleaved rounds whose order rotates (best of ``--repeats``
each), so that a slow spell of this shared machine hits a whole round rather than one column and
every column is measured in every position. b/a is the ratio of the best times; the verdict on
issue 15's goal (b/a <= 0.25) is read from a confidence interval instead: the geometric mean of
the per-round ratios b_r / a_r with a 95% t-interval on their logs (met when the whole interval is
at or below the goal, not met when it is above, else undecided). The page faults of (a), (b) and
(b0) are printed too (median over rounds, and those of the fastest call): every new page the
kernel maps costs a fault, and (a)'s cache and (b)'s kept results are both new memory.

and the extra peak memory of (b) when each layer's results are reduced before the next layer
(RSS sampled every 2 ms while it runs, minus the RSS before, in a fresh subprocess whose large
allocations are mmapped so that freed memory leaves RSS), compared with one layer's
``[head, query, key]`` float32 pattern. Prints the ratios.

Scaling (``--scaling 128 512 1024 2048 4096``): a full cache of every layer's pattern does not
fit in memory at 4096 tokens (30 × 9 × 4096² floats = 16.9 GiB), so there geolens runs *inside*
the forward pass: hooks on ``hook_v`` / ``hook_pattern`` compute both modes for each layer as it
is produced, query-chunked under a memory budget, reduce them and drop them. The table gives,
per length, the plain forward time, the geolens time spent in those hooks, their ratio and the
peak RSS of the hooked forward (fresh subprocess), then the least-squares exponent of geolens
time against length (log-log).

    python benchmarks/contributions.py [--lengths 128 512] [--naive-layers 1] [--scaling 128 512 1024 2048 4096]
        [--scaling-repeats 5] [--out docs/benchmarks/contributions.json] [--plot docs/benchmarks/scaling.png]
    python benchmarks/contributions.py --smoke   # checks the script in seconds: tiny-gqa, every part, output into a temporary folder

Backends side by side (``--backend hf``): the same weights loaded twice, as a TransformerLens
``TransformerBridge`` and as the plain ``transformers`` model (``geolens.load_model(...,
backend="hf")``); per length, in interleaved rounds whose order rotates, each backend's forward
with the cache geolens reads (``geolens.run_with_cache(model, tokens,
names_filter=geolens.names_filter(model))``) and geolens' all-layer ``contribution_weight_pair`` contributions
from that cache. Prints each backend's contributions / forward ratio (best times, and the
geometric mean of the per-round ratios with a 95% t-interval) and the ratio of the two ratios, HF
over TransformerLens, round by round: the HF-native cache costs no more, relative to its own
forward, than the TransformerLens path when that interval lies at or below 1. The ratio of ratios
is (contributions HF / TL) / (forward HF / TL); both factors are printed with their intervals, so
that a ratio above 1 says whether the contributions cost more on the HF cache or the HF forward
is faster.

    python benchmarks/contributions.py --backend hf [--lengths 128 512] [--repeats 20] [--out FILE]
    python benchmarks/contributions.py --backend hf --smoke

Needs scipy (``pip install 'geolens[bench]'``) and, for SmolLM2-135M, the ``models`` extra; both
are checked before anything is timed.
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import torch
from _common import commit, ratio_interval, require, smoke_folder, verdict  # benchmarks/_common.py

import geolens
from geolens.adapter import get_attention_layer
from geolens.contributions import contribution_weight_pair_from_layer, contribution_weights_from_layer


def rss_bytes() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRSS:
    """Samples RSS in a thread; ``extra`` = peak during the block minus RSS at its start."""

    def __enter__(self):
        self.start = rss_bytes()
        self.peak = self.start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes())
            time.sleep(0.002)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())
        self.extra = self.peak - self.start


def naive_layer(view, mode: str) -> torch.Tensor:
    """c_ij with ṽ and α ṽ materialised, one head at a time ([query, key, d_model] each)."""
    b, h, q, k = view.pattern.shape
    out = torch.empty(b, h, q, k)
    vt = torch.einsum("bkhd,hdm->bhkm", view.v, view.W_O)  # [b, h, k, d_model]
    weighted_all = None
    if mode == "inter":
        layer_out = torch.einsum("bhqk,bhkm->bqm", view.pattern, vt)
    for bi in range(b):
        for hi in range(h):
            weighted = view.pattern[bi, hi, :, :, None] * vt[bi, hi, None, :, :]  # [q, k, d_model]
            o = weighted.sum(1) if mode == "intra" else layer_out[bi]
            out[bi, hi] = torch.einsum("qkm,qm->qk", weighted, o) / (o * o).sum(-1, keepdim=True)
            del weighted
    del weighted_all
    return out


GOAL_B_A = 0.25  # issue 15: intra + inter for all layers within a quarter of run_with_cache


def minor_faults() -> int:
    """Page faults of this process so far that mapped a new page (``getrusage``'s ru_minflt)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def timed_faults(fn) -> tuple[float, int]:
    """(seconds, page faults) of one call, its result dropped after the clock stops."""
    faults = minor_faults()
    t = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - t
    faults = minor_faults() - faults
    del result
    return seconds, faults


def bench(model, seq_len: int, naive_layers: int, repeats: int, model_name: str = "smollm2-135m") -> dict:
    from geolens.data import corpus_windows

    tokens = corpus_windows(model, "lee", seq_len, n_sequences=1, per_document=False)
    n_layers = model.cfg.n_layers
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)  # warm-up

        def geolens_all():
            return [
                tuple(contribution_weight_pair_from_layer(get_attention_layer(model, cache, l)))
                for l in range(n_layers)
            ]

        def geolens_two_passes():
            out = []
            for l in range(n_layers):
                view = get_attention_layer(model, cache, l)
                out.append(
                    (contribution_weights_from_layer(view, "intra"), contribution_weights_from_layer(view, "inter"))
                )
            return out

        def geolens_intra():
            return [
                contribution_weights_from_layer(get_attention_layer(model, cache, l), "intra") for l in range(n_layers)
            ]

        # (b0): (b) with out=, the results written into memory reused from call to call (mapped
        # once, before the rounds), so that the kernel maps no new page for them
        mapped = [torch.zeros(2, *get_attention_layer(model, cache, l).pattern.shape) for l in range(n_layers)]

        def geolens_mapped():
            return [
                tuple(contribution_weight_pair_from_layer(get_attention_layer(model, cache, l), out=mapped[l]))
                for l in range(n_layers)
            ]

        result = geolens_all()  # warm-up
        result_bytes = sum(a.numel() * a.element_size() + b.numel() * b.element_size() for a, b in result)
        del result
        # (a), (b), (b2), (b1) and (b0) interleaved in rounds, the order rotated
        # each round (on this VM a column run right after a forward is measurably slower than the
        # same column run again), best of `repeats` rounds each: a slow spell of the shared
        # machine then hits every column of a round, and every column sees every position
        columns = {
            "a": lambda: model.run_with_cache(tokens),
            "b": geolens_all,
            "b2": geolens_two_passes,
            "b1": geolens_intra,
            "b0": geolens_mapped,
        }
        for fn in columns.values():  # one untimed call each: no column's first call is timed
            fn()
        rounds = {name: [] for name in columns}  # seconds of each column, round by round
        round_faults = {name: [] for name in columns}  # page faults of each column, round by round
        names = list(columns)
        for r in range(repeats):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                seconds, n_faults = timed_faults(columns[name])
                rounds[name].append(seconds)
                round_faults[name].append(n_faults)
        fastest = {name: times.index(min(times)) for name, times in rounds.items()}  # each column's best round
        t_a, t_b, t_b2, t_b1, t_b0 = (rounds[k][fastest[k]] for k in ("a", "b", "b2", "b1", "b0"))
        faults = {name: round_faults[name][i] for name, i in fastest.items()}  # page faults of the fastest call
        mapped.clear()  # free the reused results before the naive reference
        _, cache = model.run_with_cache(tokens)

        views = [get_attention_layer(model, cache, l) for l in range(naive_layers)]
        t = time.perf_counter()
        for view in views:
            naive_layer(view, "intra")
            naive_layer(view, "inter")
        t_c = (time.perf_counter() - t) * n_layers / naive_layers
    pattern_bytes = model.cfg.n_heads * seq_len * seq_len * 4
    return dict(
        seq_len=seq_len,
        a=t_a,
        b=t_b,
        b2=t_b2,
        b1=t_b1,
        b0=t_b0,
        c=t_c,
        faults_b0=faults["b0"],
        faults_a=faults["a"],
        faults_b=faults["b"],
        rounds=rounds,
        round_faults=round_faults,
        ratio_b_a=ratio_interval(rounds["b"], rounds["a"]),
        ratio_b0_a=ratio_interval(rounds["b0"], rounds["a"]),
        **dict(zip(("extra", "gram_bytes"), memory_in_subprocess(seq_len, model_name))),
        result_bytes=result_bytes,
        pattern_bytes=pattern_bytes,
    )


def backends_side_by_side(model_name: str, lengths, repeats: int) -> dict:
    """The ``--backend hf`` comparison of the module docstring: per length, each backend's forward
    with geolens' cache (a) and all-layer ``contribution_weight_pair`` contributions from it (b), in rounds."""
    from geolens.data import corpus_windows

    models = {"tl": geolens.load_model(model_name), "hf": geolens.load_model(model_name, backend="hf")}
    n_layers = models["tl"].cfg.n_layers
    rows = []
    for seq_len in lengths:
        tokens = corpus_windows(models["tl"], "lee", seq_len, n_sequences=1, per_document=False)
        columns, caches = {}, {}
        with torch.no_grad():
            for name, model in models.items():
                _, caches[name] = geolens.run_with_cache(model, tokens, names_filter=geolens.names_filter(model))

                def forward(model=model):
                    return geolens.run_with_cache(model, tokens, names_filter=geolens.names_filter(model))

                def contributions(model=model, cache=caches[name]):
                    return [
                        tuple(contribution_weight_pair_from_layer(get_attention_layer(model, cache, l)))
                        for l in range(n_layers)
                    ]

                columns[f"a_{name}"], columns[f"b_{name}"] = forward, contributions
            for fn in columns.values():  # one untimed call each
                fn()
            rounds = {name: [] for name in columns}
            names = list(columns)
            for r in range(repeats):
                for name in names[r % len(names) :] + names[: r % len(names)]:
                    seconds, _ = timed_faults(columns[name])
                    rounds[name].append(seconds)
        ratios = {b: [x / y for x, y in zip(rounds[f"b_{b}"], rounds[f"a_{b}"])] for b in models}
        rows.append(
            dict(
                seq_len=seq_len,
                rounds=rounds,
                best={name: min(times) for name, times in rounds.items()},
                ratio_tl=ratio_interval(rounds["b_tl"], rounds["a_tl"]),
                ratio_hf=ratio_interval(rounds["b_hf"], rounds["a_hf"]),
                hf_over_tl=ratio_interval(ratios["hf"], ratios["tl"]),
                # the ratio of ratios = (b_hf / b_tl) / (a_hf / a_tl): which side moves it
                contributions_hf_over_tl=ratio_interval(rounds["b_hf"], rounds["b_tl"]),
                forward_hf_over_tl=ratio_interval(rounds["a_hf"], rounds["a_tl"]),
            )
        )
    return dict(model=model_name, n_layers=n_layers, repeats=repeats, lengths=rows)


def print_side_by_side(record: dict) -> None:
    print(
        f"{'seq':>5} {'tl fwd+cache s':>15} {'tl geolens s':>13} {'tl ratio [95% CI]':>26} "
        f"{'hf fwd+cache s':>15} {'hf geolens s':>13} {'hf ratio [95% CI]':>26} {'hf ratio / tl ratio [95% CI]':>30}"
    )
    for r in record["lengths"]:
        best, cells = r["best"], []
        for b in ("tl", "hf"):
            ci = r[f"ratio_{b}"]
            cells.append(
                f"{best[f'a_{b}']:>15.3f} {best[f'b_{b}']:>13.3f} "
                f"{ci['geometric_mean']:>8.3f} [{ci['low']:.3f}, {ci['high']:.3f}]"
            )
        q = r["hf_over_tl"]
        print(
            f"{r['seq_len']:>5} " + " ".join(cells) + f" {q['geometric_mean']:>12.3f} [{q['low']:.3f}, {q['high']:.3f}]"
        )
    for r in record["lengths"]:
        q = r["hf_over_tl"]
        print(
            f"{r['seq_len']:>5} tokens: HF-native ratio / TransformerLens ratio, per round, geometric mean {q['geometric_mean']:.3f} "
            f"[{q['low']:.3f}, {q['high']:.3f}] ({q['level']:.0%} t-interval over {q['rounds']} rounds); "
            f"goal <= 1 (no costlier than the TransformerLens path, relative to its own forward): {verdict(q, 1.0)}"
        )
        c, f = r["contributions_hf_over_tl"], r["forward_hf_over_tl"]
        print(
            f"{'':>5}         which side: contributions HF / TL {c['geometric_mean']:.3f} [{c['low']:.3f}, {c['high']:.3f}], "
            f"forward with the cache HF / TL {f['geometric_mean']:.3f} [{f['low']:.3f}, {f['high']:.3f}]"
        )


def memory_child(seq_len: int, model_name: str = "smollm2-135m") -> None:
    """Run in a fresh process: print the extra peak RSS of streaming all-layer contributions."""
    from geolens.data import corpus_windows

    model = geolens.load_model(model_name)
    tokens = corpus_windows(model, "lee", seq_len, n_sequences=1, per_document=False)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=geolens.names_filter(model))
        # The Gram matrices are cached per model (like the weights, independent of the text); fill
        # that cache on a short prefix first, so the peak below is what one text costs.
        from geolens.geometry import _CROSS_GRAMS, _GRAMS

        _, short = model.run_with_cache(tokens[:, :8], names_filter=geolens.names_filter(model))
        for l in range(model.cfg.n_layers):
            contribution_weight_pair_from_layer(get_attention_layer(model, short, l))
        gram_bytes = sum(e[2].numel() * e[2].element_size() for t in (_GRAMS, _CROSS_GRAMS) for e in t.values())
        del short
        with PeakRSS() as mem:
            total = 0.0
            for l in range(model.cfg.n_layers):
                view = get_attention_layer(model, cache, l)
                total += sum(float(c.sum()) for c in contribution_weight_pair_from_layer(view))
                del view
    print(mem.extra, gram_bytes)


# --- scaling with length: geolens inside the forward pass ------------------------------------

BUDGET = 256 * 2**20  # bytes of query-chunk temporaries per layer


def streamed_forward(model, tokens, *, with_geolens: bool, budget: int = BUDGET, reuse: bool = False) -> float:
    """Seconds spent in geolens hooks (both modes, all layers, reduced per chunk) during one forward
    (on a GPU the device is synchronised around each hook, so the time is the hook's own).
    ``reuse``: every chunk's results go into one buffer per chunk shape (``out=``), allocated once
    per forward, instead of fresh memory per chunk."""
    from geolens.adapter import PATTERN, VALUE, Z, hook_name
    from geolens.geometry import iter_query_chunks
    from geolens.interventions.base import applied

    spent = [0.0]
    seen: dict[int, dict] = {}
    buffers: dict[tuple[int, ...], torch.Tensor] = {}

    def grab(layer: int, name: str):
        def hook(x, hook):
            if x.is_cuda:
                torch.cuda.synchronize(x.device)
            t = time.perf_counter()
            got = seen.setdefault(layer, {})
            got[hook_name(layer, name)] = x.detach()
            if len(got) == 3:  # hook_v, hook_pattern, then hook_z (used once checked)
                view = get_attention_layer(model, seen.pop(layer), layer)
                acc = 0.0
                for _, sub in iter_query_chunks(view, memory_budget_bytes=budget, n_temporaries=6):
                    out = None
                    if reuse:
                        shape = (2, *sub.pattern.shape)
                        out = buffers.get(shape)
                        if out is None:
                            out = buffers[shape] = sub.pattern.new_empty(shape)
                    intra, inter = contribution_weight_pair_from_layer(sub, out=out)
                    acc += float(intra.sum()) + float(inter.sum())
                del view
            if x.is_cuda:
                torch.cuda.synchronize(x.device)
            spent[0] += time.perf_counter() - t
            return x

        return hook

    hooks = (
        []
        if not with_geolens
        else [(hook_name(l, n), grab(l, n)) for l in range(model.cfg.n_layers) for n in (VALUE, PATTERN, Z)]
    )
    with torch.no_grad(), applied(model, hooks):
        model(tokens, return_type=None)
    return spent[0]


def scaling_child(seq_len: int, repeats: int, model_name: str = "smollm2-135m") -> None:
    """Fresh process: print forward seconds, geolens seconds and the hooked forward's peak extra RSS."""
    from geolens.data import corpus_windows

    model = geolens.load_model(model_name)
    tokens = corpus_windows(model, "lee", seq_len, n_sequences=1, per_document=False)
    streamed_forward(model, tokens[:, :64], with_geolens=True)  # warm-up
    # plain forward time, measured around the call (streamed_forward returns hook time only)
    best_fwd = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        streamed_forward(model, tokens, with_geolens=False)
        best_fwd = min(best_fwd, time.perf_counter() - t)
    best_geo = float("inf")
    with PeakRSS() as mem:
        for _ in range(repeats):
            best_geo = min(best_geo, streamed_forward(model, tokens, with_geolens=True))
    best_reuse = float("inf")
    with PeakRSS() as mem_reuse:
        for _ in range(repeats):
            best_reuse = min(best_reuse, streamed_forward(model, tokens, with_geolens=True, reuse=True))
    print(best_fwd, best_geo, mem.extra, best_reuse, mem_reuse.extra)


def scaling(lengths, repeats: int, model_name: str = "smollm2-135m") -> None:
    import subprocess
    import sys

    import numpy as np

    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", MALLOC_TRIM_THRESHOLD_="0")
    print(f"\nScaling: geolens (both modes, all layers) inside the forward, query chunks under {BUDGET // 2**20} MiB")
    print("(with out=: each chunk's results written into one buffer per chunk shape, reused for the whole forward)")
    print(
        f"{'seq':>5} {'forward s':>10} {'geolens s':>10} {'geolens/fwd':>12} {'peak extra MiB':>15} "
        f"{'out= s':>8} {'out=/fwd':>9} {'out= peak MiB':>14}"
    )
    rows = []
    for n in lengths:
        out = subprocess.run(
            [sys.executable, __file__, "--scaling-child", str(n), "--repeats", str(repeats), "--model", model_name],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        fwd, geo, extra, reuse, extra_reuse = map(float, out.strip().splitlines()[-1].split())
        rows.append((n, fwd, geo, extra, reuse, extra_reuse))
        print(
            f"{n:>5} {fwd:>10.3f} {geo:>10.3f} {geo / fwd:>12.3f} {extra / 2**20:>15.1f} "
            f"{reuse:>8.3f} {reuse / fwd:>9.3f} {extra_reuse / 2**20:>14.1f}"
        )
    slope = slope_reuse = None
    if len(rows) >= 2:
        x = np.log([r[0] for r in rows])
        slope = float(np.polyfit(x, np.log([r[2] for r in rows]), 1)[0])
        slope_reuse = float(np.polyfit(x, np.log([r[4] for r in rows]), 1)[0])
        print(
            f"fitted exponent of geolens time vs length (log-log least squares over {len(rows)} lengths): {slope:.2f}; "
            f"with out=: {slope_reuse:.2f}"
        )
    return dict(
        budget_bytes=BUDGET,
        repeats=repeats,
        exponent=slope,
        exponent_out=slope_reuse,
        rows=[
            dict(
                seq_len=n,
                forward_s=f,
                geolens_s=g,
                ratio=g / f,
                peak_extra_bytes=e,
                geolens_out_s=r,
                ratio_out=r / f,
                peak_extra_out_bytes=er,
            )
            for n, f, g, e, r, er in rows
        ],
    )


def plot_scaling(table: dict, path: str) -> None:
    """Log-log plot of forward and geolens seconds against length, with geolens / forward."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = table["rows"]
    n = [r["seq_len"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
    left.loglog(n, [r["forward_s"] for r in rows], "o-", label="forward (no cache)")
    left.loglog(
        n, [r["geolens_s"] for r in rows], "s-", label=f"geolens, both modes (exponent {table['exponent']:.2f})"
    )
    if "geolens_out_s" in rows[0]:
        left.loglog(
            n,
            [r["geolens_out_s"] for r in rows],
            "^-",
            label=f"geolens, out= reused (exponent {table['exponent_out']:.2f})",
        )
    left.set(xlabel="tokens", ylabel="seconds, best of %d" % table["repeats"], title="SmolLM2-135M, 30 layers, CPU")
    left.set_xticks(n, [str(x) for x in n])
    left.legend(fontsize=8)
    right.semilogx(n, [r["ratio"] for r in rows], "s-", color="C1", label="fresh results")
    if "ratio_out" in rows[0]:
        right.semilogx(n, [r["ratio_out"] for r in rows], "^-", color="C2", label="out= reused")
        right.legend(fontsize=8)
    right.set(
        xlabel="tokens", ylabel="geolens / forward", title="geolens inside the forward / the forward", ylim=(0, None)
    )
    right.set_xticks(n, [str(x) for x in n])
    for ax in (left, right):
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def memory_in_subprocess(seq_len: int, model_name: str = "smollm2-135m") -> tuple[int, int]:
    import subprocess
    import sys

    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", MALLOC_TRIM_THRESHOLD_="0")
    out = subprocess.run(
        [sys.executable, __file__, "--memory-child", str(seq_len), "--model", model_name],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    extra, grams = out.strip().splitlines()[-1].split()
    return int(extra), int(grams)


def markdown(record: dict) -> str:
    """The README's tables from a ``--out`` JSON file (``--markdown FILE``), so that the published
    figures are this script's, not retyped."""
    mib = 2**20
    lines = [
        "| seq | (a) `run_with_cache` s | (b) geolens intra + inter, one pass, 30 layers s | b/a (best times) | b/a per round, geometric mean [95% CI] | (b2) two single-mode passes / a | intra only / a | (b0) (b) with `out=` reused / a, per round [95% CI] | (c) naive s | c/b | extra peak MiB (/ one layer's pattern) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in record["lengths"]:
        ci, ci0 = r["ratio_b_a"], r["ratio_b0_a"]
        lines.append(
            f"| {r['seq_len']} | {r['a']:.3f} | {r['b']:.3f} | {r['b'] / r['a']:.3f} | {ci['geometric_mean']:.3f} "
            f"[{ci['low']:.3f}, {ci['high']:.3f}] | {r['b2'] / r['a']:.3f} | {r['b1'] / r['a']:.3f} | {ci0['geometric_mean']:.3f} [{ci0['low']:.3f}, {ci0['high']:.3f}] | {r['c']:.2f} | "
            f"{r['c'] / r['b']:.0f} | {r['extra'] / mib:.1f} ({r['extra'] / r['pattern_bytes']:.1f}×) |"
        )
    if "scaling" in record:
        sc = record["scaling"]
        lines += [
            "",
            "| seq | forward s | geolens s | geolens / forward | peak extra MiB | geolens, `out=` reused s | / forward | peak extra MiB |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in sc["rows"]:
            lines.append(
                f"| {r['seq_len']} | {r['forward_s']:.3f} | {r['geolens_s']:.3f} | {r['ratio']:.3f} | {r['peak_extra_bytes'] / mib:.1f} "
                f"| {r['geolens_out_s']:.3f} | {r['ratio_out']:.3f} | {r['peak_extra_out_bytes'] / mib:.1f} |"
            )
        if sc["exponent"] is not None:
            lines += [
                "",
                f"Exponent of geolens time against length (log-log least squares, {len(sc['rows'])} lengths): "
                f"{sc['exponent']:.2f}; with `out=` reused: {sc['exponent_out']:.2f}",
            ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--naive-layers", type=int, default=1, help="layers timed for the naive reference")
    parser.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="rounds (a multiple of 5 rotates every column through every position equally)",
    )
    parser.add_argument("--scaling", type=int, nargs="*", default=[], help="lengths of the scaling table")
    parser.add_argument("--scaling-repeats", type=int, help="repeats per scaling length (default: --repeats)")
    parser.add_argument("--out", help="write every measured figure to this JSON file")
    parser.add_argument("--plot", help="save the scaling figure (PNG) here; needs --scaling")
    parser.add_argument(
        "--markdown",
        metavar="JSON",
        help="print the README's tables from a --out file (with --plot, redraw its figure) and exit",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="check the script in seconds: tiny-gqa, length 32, 2 rounds, scaling 16 32, --out/--plot into a temporary folder, then --markdown of that file "
        "(with --backend hf: tiny-gqa, length 32, 2 rounds, backends.json)",
    )
    parser.add_argument(
        "--backend",
        choices=("tl", "hf"),
        default="tl",
        help="tl: the TransformerLens tables above; hf: the HF-native backend's contributions / forward ratio "
        "side by side with TransformerLens' (module docstring), only that",
    )
    parser.add_argument("--model", default="smollm2-135m", help=argparse.SUPPRESS)  # tiny-gqa for --smoke
    parser.add_argument("--memory-child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--scaling-child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.backend == "hf" and (args.scaling or args.plot or args.markdown):
        parser.error("--backend hf times the two backends side by side only (no --scaling, --plot or --markdown)")
    if args.smoke:
        folder = smoke_folder()
        args.model, args.lengths, args.repeats, args.naive_layers = "tiny-gqa", [32], 2, 1
        if args.backend == "tl":
            args.scaling, args.scaling_repeats = [16, 32], 1
            args.plot = args.plot or os.path.join(folder, "scaling.png")
        args.out = args.out or os.path.join(folder, "contributions.json" if args.backend == "tl" else "backends.json")
    if args.markdown:
        import json

        with open(args.markdown) as f:
            record = json.load(f)
        print(markdown(record))
        if args.plot and "scaling" in record:  # the figure again, from the same figures
            plot_scaling(record["scaling"], args.plot)
        return
    if args.backend == "hf":
        require(("scipy", "bench"), *([("gguf", "models")] if not args.model.startswith("tiny-") else []))
        record = backends_side_by_side(args.model, args.lengths, args.repeats)
        label = (
            "SmolLM2-135M" if args.model == "smollm2-135m" else f"{args.model} (smoke run: the figures mean nothing)"
        )
        print(
            f"{label}, CPU, torch {torch.__version__}, {torch.get_num_threads()} threads, batch 1: forward with geolens' cache "
            f"and all-layer mode='both' contributions from it, per backend, best of {args.repeats} interleaved rounds"
        )
        print_side_by_side(record)
        if args.out:
            import json

            record.update(
                torch=torch.__version__,
                threads=torch.get_num_threads(),
                commit=commit(os.path.dirname(os.path.abspath(__file__))),
            )
            with open(args.out, "w") as f:
                json.dump(record, f, indent=1)
            print(f"figures: {args.out}")
        return
    if args.plot and len(args.scaling) < 2:
        parser.error("--plot draws the scaling table: give at least two --scaling lengths")
    if args.memory_child:
        memory_child(args.memory_child, args.model)
        return
    if args.scaling_child:
        scaling_child(args.scaling_child, args.repeats, args.model)
        return
    require(("scipy", "bench"), *([("gguf", "models")] if not args.model.startswith("tiny-") else []))
    model = geolens.load_model(args.model)
    label = "SmolLM2-135M" if args.model == "smollm2-135m" else f"{args.model} (smoke run: the figures mean nothing)"
    print(
        f"{label}, CPU, torch {torch.__version__}, {torch.get_num_threads()} threads, batch 1, "
        "(b) = intra + inter contribution weights of all 30 layers in one pass (mode='both'), "
        "(b2) = the same as two single-mode passes"
    )
    print(
        f"{'seq':>5} {'(a) fwd+cache s':>16} {'(b) geolens s':>14} {'(b2) 2 passes s':>16} {'(c) naive s':>12} {'b/a':>7} "
        f"{'b2/a':>7} {'c/b':>8} {'b_intra/a':>10} {'b0/a':>7} {'extra peak MiB':>15} {'extra/pattern':>14} {'kept outputs MiB':>17} {'Gram cache MiB':>15}"
    )
    rows = []
    for n in args.lengths:
        r = bench(model, n, args.naive_layers, args.repeats, args.model)
        mib = 2**20
        print(
            f"{n:>5} {r['a']:>16.3f} {r['b']:>14.3f} {r['b2']:>16.3f} {r['c']:>12.2f} {r['b'] / r['a']:>7.3f} "
            f"{r['b2'] / r['a']:>7.3f} {r['c'] / r['b']:>8.0f} "
            f"{r['b1'] / r['a']:>10.3f} {r['b0'] / r['a']:>7.3f} {r['extra'] / mib:>15.1f} {r['extra'] / r['pattern_bytes']:>14.1f} {r['result_bytes'] / mib:>17.1f} {r['gram_bytes'] / mib:>15.1f}"
        )
        rows.append(r)
    page = os.sysconf("SC_PAGE_SIZE")
    for r in rows:
        for name in ("b", "b0"):
            ci = r[f"ratio_{name}_a"]
            print(
                f"{r['seq_len']:>5} tokens: {name}/a round by round, geometric mean {ci['geometric_mean']:.3f} "
                f"[{ci['low']:.3f}, {ci['high']:.3f}] ({ci['level']:.0%} t-interval over {ci['rounds']} rounds); "
                f"goal {name}/a <= {GOAL_B_A}: {verdict(ci, GOAL_B_A)}"
            )
    for r in rows:
        median = {k: sorted(v)[len(v) // 2] for k, v in r["round_faults"].items()}
        print(
            f"{r['seq_len']:>5} tokens: page faults per call, median over rounds: (a) {median['a']}, (b) {median['b']}, "
            f"(b0) {median['b0']}"
        )
        print(
            f"{r['seq_len']:>5} tokens: page faults (new pages mapped) during the fastest call: "
            f"(a) {r['faults_a']} ({r['faults_a'] * page / 2**20:.0f} MiB), (b) {r['faults_b']} "
            f"({r['faults_b'] * page / 2**20:.0f} MiB; its kept results are {r['result_bytes'] / 2**20:.0f} MiB), "
            f"(b0) {r['faults_b0']}"
        )
    print(
        "extra peak: all layers streamed, each layer's intra+inter results reduced before the next; "
        "'extra/pattern' divides it by one layer's [head, query, key] float32 pattern; 'kept outputs' is what "
        "keeping every layer's two results costs on top; 'Gram cache' is the per-model cache of W_O Gram matrices "
        "(per head and cross-head, all layers; filled on a short prefix before the peak is measured, since it does "
        "not depend on the text)."
    )
    record = dict(
        model=args.model,
        torch=torch.__version__,
        threads=torch.get_num_threads(),
        repeats=args.repeats,
        naive_layers=args.naive_layers,
        lengths=rows,
    )
    if args.scaling:
        record["scaling"] = scaling(args.scaling, args.scaling_repeats or args.repeats, args.model)
        if args.plot:
            plot_scaling(record["scaling"], args.plot)
            print(f"scaling figure: {args.plot}")
    if args.out:
        import json

        record["commit"] = commit(os.path.dirname(os.path.abspath(__file__)))
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)
        print(f"figures: {args.out}")
    if args.smoke:  # the README's tables from the file just written
        import json

        with open(args.out) as f:
            print(markdown(json.load(f)))


if __name__ == "__main__":
    main()
