"""Benchmark: corpus runs in bounded memory, and data-parallel throughput (issue 7).

Part 1 — peak memory vs corpus size. For each size (default 50, 200 and 800 windows of 128
tokens of the offline enwiki sample, SmolLM2-135M, CPU) a *fresh subprocess* loads the model,
then streams the corpus through ``run_corpus`` with a streaming analysis (default: the sink
geometry of :mod:`geolens.sinks` on the first 6 layers, so that the forward passes stop after
layer 5 and the 800-sequence run fits a shared 2-core CPU; ``--memory-layers 0`` analyses all
30) while a thread samples its RSS every 5 ms. Printed per size:
RSS before the run, peak RSS during the run, the process's lifetime peak (``ru_maxrss``), and
the ratios largest / smallest size. Flat memory means ratios ≈ 1. With ``--backend hf`` the model
is a ``transformers`` model (``load_model(..., backend="hf")``), on which ``run_corpus`` runs the
analysis inside the forward, layer by layer (one layer's pattern held at a time).

Part 2 — long context: the extra peak RSS of contribution weights and attention metrics on one
4096-token layer, unchunked vs with ``memory_budget_bytes`` (16 MiB), in a fresh subprocess.

Part 3 — throughput, sequences per second, for the sink-geometry and taxonomy analyses on the
same windows: one process (all cores), one process with one thread, and two processes with one
thread each (``torchrun --standalone --nproc-per-node 2``, gloo), each timed inside the launcher
after an untimed warm-up pass and excluding model loading. Prints the 2-process / 1-process ratio.

    python benchmarks/corpus_scale.py                     # both parts, defaults above
    python benchmarks/corpus_scale.py --sizes 50 200 800 --throughput-sequences 48 --json out.json
    python benchmarks/corpus_scale.py --backend hf --skip-throughput   # part 1 on the HF-native backend
    python benchmarks/corpus_scale.py --smoke   # checks the script: tiny-gqa, every part, --json into a temporary folder

The machine's load average is printed with the figures: on a shared machine the throughput
numbers depend on what else runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import torch
from _common import require, smoke_folder  # benchmarks/_common.py

REPO = Path(__file__).resolve().parents[1]

MEMORY_CHILD = """
import json, os, resource, sys, threading, time
import torch
from geolens import load_model
from geolens.data import corpus_windows
from geolens.distributed import analysis_factory
from geolens.runner import run_corpus

n, seq_len, corpus, spec, batch_size = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
n_layers = int(sys.argv[6])
model_name = sys.argv[7] if len(sys.argv) > 7 else "smollm2-135m"
backend = sys.argv[8] if len(sys.argv) > 8 else "transformer_lens"

def rss():
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

model = load_model(model_name, backend=backend)
tokens = corpus_windows(model, corpus, seq_len, n)
layers = list(range(n_layers)) if n_layers > 0 else None
analysis = analysis_factory(spec, layers=layers)(model)
before = rss()
peak, stop = [before], threading.Event()
def poll():
    while not stop.is_set():
        peak[0] = max(peak[0], rss())
        time.sleep(0.005)
thread = threading.Thread(target=poll, daemon=True)
thread.start()
t0 = time.perf_counter()
run_corpus(model, tokens, [analysis], batch_size=batch_size, progress=False)
seconds = time.perf_counter() - t0
stop.set(); thread.join()
peak[0] = max(peak[0], rss())
print(json.dumps({"n_sequences": n, "rss_before": before, "run_peak": peak[0],
                  "process_peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "seconds": seconds}))
"""


def long_context_part(args) -> dict:
    """Extra peak RSS of contribution weights / metrics on one synthetic 4096-token layer."""
    from long_context_probe import measure_in_subprocess  # benchmarks/, this script's folder

    r = measure_in_subprocess(args.long_length, args.memory_budget_mib * 2**20)
    print(
        f"long context: batch 1, 4 heads, {args.long_length} tokens; one [b, h, q, k] float32 tensor = {mib(r['pattern_bytes'])}; "
        f"memory_budget_bytes = {args.memory_budget_mib} MiB",
        flush=True,
    )
    for key, label, outputs in [
        ("cw_full", "contribution weights, unchunked", 1),
        ("cw_budget", "contribution weights, budgeted", 1),
        ("metrics_full", "attention_metrics, unchunked", 3),
        ("metrics_budget", "attention_metrics, budgeted", 3),
        ("streamed", "iter_query_chunks, reduced per chunk", 0),
    ]:
        print(
            f"  {label:40s} extra peak RSS {mib(r[key])}, beyond its {outputs} output(s) {mib(r[key] - outputs * r['pattern_bytes'])}",
            flush=True,
        )
    return r


def mib(x: float) -> str:
    return f"{x / 2**20:7.0f} MiB"


def memory_part(args) -> list[dict]:
    script = Path(tempfile.mkdtemp()) / "memory_child.py"
    script.write_text(textwrap.dedent(MEMORY_CHILD))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    rows = []
    for n in args.sizes:
        cmd = [
            sys.executable,
            str(script),
            str(n),
            str(args.seq_len),
            args.corpus,
            args.memory_analysis,
            str(args.batch_size),
            str(args.memory_layers),
            args.model,
            {"tl": "transformer_lens", "hf": "hf"}[args.backend],
        ]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
        row = json.loads(out.strip().splitlines()[-1])
        rows.append(row)
        print(
            f"{n:5d} sequences: RSS before run {mib(row['rss_before'])}, peak during run {mib(row['run_peak'])}, "
            f"process peak {mib(row['process_peak'])}, {row['seconds']:.0f} s",
            flush=True,
        )
    lo, hi = rows[0], rows[-1]
    print(
        f"ratio {hi['n_sequences']}/{lo['n_sequences']} sequences: peak during run {hi['run_peak'] / lo['run_peak']:.3f}, "
        f"process peak {hi['process_peak'] / lo['process_peak']:.3f}, "
        f"growth during run {mib(hi['run_peak'] - hi['rss_before'])} vs {mib(lo['run_peak'] - lo['rss_before'])}",
        flush=True,
    )
    return rows


def launch(args, spec: str, nproc: int, threads: int, tokens_path: str, out: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": str(threads)}
    common = [
        "-m",
        "geolens.distributed",
        "--model",
        args.model,
        "--tokens",
        tokens_path,
        "--analysis",
        spec,
        "--batch-size",
        str(args.batch_size),
        "--no-progress",
        "--out",
        out,
    ]
    if nproc == 1:
        cmd = [sys.executable, *common]
    else:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(nproc),
            *common,
            "--backend",
            "gloo",
        ]
    subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, timeout=3600)
    return torch.load(out, weights_only=True)["timing"]


def throughput_part(args) -> list[dict]:
    from geolens import load_model
    from geolens.data import corpus_windows

    folder = Path(tempfile.mkdtemp())
    tokens = corpus_windows(load_model(args.model), args.corpus, args.seq_len, args.throughput_sequences)
    torch.save(tokens, folder / "tokens.pt")
    rows = []
    all_cores = str(os.cpu_count())
    for spec in args.throughput_analyses:
        per = {}
        for label, nproc, threads in [
            (f"1 process x {all_cores} threads", 1, os.cpu_count()),
            ("1 process x 1 thread", 1, 1),
            ("2 processes x 1 thread", 2, 1),
        ]:
            timing = launch(
                args, spec, nproc, threads, str(folder / "tokens.pt"), str(folder / f"{spec}-{nproc}-{threads}.pt")
            )
            rate = timing["n_sequences"] / timing["seconds"]
            per[label] = rate
            rows.append(
                {
                    "analysis": spec,
                    "config": label,
                    "sequences_per_s": rate,
                    "seconds": timing["seconds"],
                    "load_average": os.getloadavg()[0],
                }
            )
            print(
                f"{spec:14s} {label:24s} {rate:6.2f} sequences/s ({timing['seconds']:.0f} s, load average {os.getloadavg()[0]:.1f})",
                flush=True,
            )
        two, one = per["2 processes x 1 thread"], per[f"1 process x {all_cores} threads"]
        print(
            f"{spec:14s} ratio 2 processes / 1 process: {two / one:.2f} (vs 1 thread: {two / per['1 process x 1 thread']:.2f})",
            flush=True,
        )
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[50, 200, 800])
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--corpus", default="enwiki", help="offline corpus with enough 128-token windows (enwiki: 4314)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument(
        "--memory-analysis", default="sink-geometry", help="geolens.distributed.ANALYSES name or module:factory"
    )
    p.add_argument(
        "--memory-layers",
        type=int,
        default=6,
        help="analyse the first N layers (the forward pass stops after them); 0 = all 30",
    )
    p.add_argument(
        "--backend",
        choices=("tl", "hf"),
        default="tl",
        help="part 1's model: TransformerLens, or hf (a transformers model: the analysis runs inside the forward, layer by layer)",
    )
    p.add_argument("--throughput-sequences", type=int, default=48)
    p.add_argument("--throughput-analyses", nargs="+", default=["sink-geometry", "taxonomy"])
    p.add_argument("--skip-memory", action="store_true")
    p.add_argument("--skip-long-context", action="store_true")
    p.add_argument("--long-length", type=int, default=4096)
    p.add_argument("--memory-budget-mib", type=int, default=16)
    p.add_argument("--skip-throughput", action="store_true")
    p.add_argument("--json", default=None, help="also write the figures here")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="check the script: tiny-gqa, sizes 4 8 of 16 tokens, 256-token long context, sink-geometry throughput on 4 sequences, --json into a temporary folder",
    )
    p.add_argument("--model", default="smollm2-135m", help=argparse.SUPPRESS)  # tiny-gqa for --smoke
    args = p.parse_args(argv)
    if args.smoke:
        args.model, args.sizes, args.seq_len, args.corpus, args.batch_size, args.memory_layers = (
            "tiny-gqa",
            [4, 8],
            16,
            "lee",
            2,
            0,
        )
        args.long_length, args.memory_budget_mib = 256, 1
        args.throughput_sequences, args.throughput_analyses = 4, ["sink-geometry"]
        args.json = args.json or str(Path(smoke_folder()) / "corpus_scale.json")
    if not args.model.startswith("tiny-"):
        require(("gguf", "models"))
    print(f"CPU cores: {os.cpu_count()}, load average at start: {os.getloadavg()[0]:.1f}", flush=True)
    results = {"args": vars(args), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    if not args.skip_memory:
        results["memory"] = memory_part(args)
    if not args.skip_long_context:
        results["long_context"] = long_context_part(args)
    if not args.skip_throughput:
        results["throughput"] = throughput_part(args)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=2))
        print(f"figures: {args.json}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
