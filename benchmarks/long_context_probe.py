"""Extra peak RSS of contribution weights and metrics on one synthetic long-context layer.

Run in a fresh process (``measure_in_subprocess``) with large allocations mmapped, so that freed
memory leaves RSS and the RSS sampled every millisecond tracks live tensors. Used by
``tests/test_long_context.py`` and ``benchmarks/corpus_scale.py``.

    python benchmarks/long_context_probe.py LENGTH BUDGET_BYTES   # from the repository root; prints one JSON line
    python benchmarks/long_context_probe.py --smoke               # checks the script: 256 tokens in a subprocess, JSON into a temporary folder
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import torch
from _common import smoke_folder  # benchmarks/_common.py

from geolens.adapter import AttentionLayer
from geolens.contributions import contribution_weights_from_layer, layer_metrics
from geolens.geometry import iter_query_chunks


def measure_in_subprocess(length: int, budget: int, *, timeout: float | None = None) -> dict:
    """Run this file in a fresh interpreter and return its measurements (bytes)."""
    script = os.path.abspath(__file__)
    repo = os.path.dirname(os.path.dirname(script))  # for `import geolens` from a checkout
    pythonpath = os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": pythonpath, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, script, str(length), str(budget)], env=env, capture_output=True, text=True, timeout=timeout
    )
    if proc.returncode != 0:
        raise RuntimeError(f"long-context probe failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    from geolens.threads import apply

    apply(1)  # kept when a model loads (geolens.threads)
    B, H, Q, D, M = 1, 4, int(sys.argv[1]), 8, 32
    g = torch.Generator().manual_seed(0)
    pattern = torch.softmax(torch.randn(B, H, Q, Q, generator=g).tril_() + torch.triu(torch.full((Q, Q), -1e9), 1), -1)
    layer = AttentionLayer(
        0, pattern, torch.randn(B, Q, H, D, generator=g), torch.randn(H, D, M, generator=g), torch.zeros(M), 2, "test"
    )
    layer.z  # part of the inputs (small: [batch, query, head, d_head])

    def rss():
        with open(f"/proc/{os.getpid()}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def extra(fn):
        start, peak, stop = rss(), [rss()], threading.Event()

        def poll():
            while not stop.is_set():
                peak[0] = max(peak[0], rss())
                time.sleep(0.001)

        t = threading.Thread(target=poll)
        t.start()
        out = fn()
        stop.set()
        t.join()
        peak[0] = max(peak[0], rss())
        del out
        return peak[0] - start

    budget = int(sys.argv[2])

    def streamed():
        total = torch.zeros(B, H, Q)
        for _, sub in iter_query_chunks(layer, memory_budget_bytes=budget):
            total += contribution_weights_from_layer(sub, "intra").sum(2)
        return total

    res = {
        "pattern_bytes": pattern.numel() * 4,
        "cw_full": extra(lambda: contribution_weights_from_layer(layer, "intra")),
        "cw_budget": extra(lambda: contribution_weights_from_layer(layer, "intra", memory_budget_bytes=budget)),
        "metrics_full": extra(lambda: layer_metrics(layer, "intra")),
        "metrics_budget": extra(lambda: layer_metrics(layer, "intra", memory_budget_bytes=budget)),
        "streamed": extra(streamed),
    }
    print(json.dumps(res))


def smoke() -> None:
    """The whole path at 256 tokens: a fresh subprocess measures, this one writes its JSON."""
    from pathlib import Path

    res = measure_in_subprocess(256, 64 * 2**10, timeout=300)
    out = Path(smoke_folder()) / "long_context.json"
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res))
    print(f"figures: {out}")


if __name__ == "__main__":
    smoke() if sys.argv[1:] == ["--smoke"] else main()
