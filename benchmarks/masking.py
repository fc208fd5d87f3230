"""Speed of the masking intervention: batched masks vs one mask per forward, measured in one run.

For one sequence and ``--n-masks`` removal masks (comprehensiveness masks of a random ranking at
evenly spaced k, ranked per query across heads as in the primary protocol), three ways to get the
per-mask next-token NLL:

- ``one-per-forward``: one forward pass per mask (batch 1, hooks rebuilt each time);
- ``batched``: all masks as rows of one batch (``chunk`` rows per forward), the whole network run
  for every row;
- ``batched+branch``: the same, but the sequence runs once up to the first masked layer and is
  expanded there (:func:`geolens.interventions.masking.branch_hook`).

Prints masked forwards per second for each and the speed-ups over one-per-forward, and checks that
all three give the same NLL (max abs difference). It then projects the cost of the primary
``geolens faithfulness`` run from the measured batched throughput: per document one cached clean
forward plus (5 distinct rankings × 2 directions × 9 fractions + 1 sink-alone) masked forwards.
Times are wall-clock on this machine in this run (no timed assertions anywhere: see the
conventions); on a shared machine they include the other processes' load, printed with them.

    python benchmarks/masking.py                  # SmolLM2-135M, 128 tokens, all layers
    python benchmarks/masking.py --tiny           # a tiny random model (seconds)
    python benchmarks/masking.py --smoke          # checks the script: --tiny, 4 masks, JSON into a temporary folder
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
from _common import require, smoke_folder  # benchmarks/_common.py


def measure(model, seq, layers, n_masks, chunk, repeats=1):
    from geolens.interventions import applied
    from geolens.interventions.masking import mask_from_ranks, masked_token_nll, pattern_mask_hooks, removal_ranks, token_nll

    n = seq.shape[1]
    g = torch.Generator().manual_seed(0)
    scores = torch.rand(len(layers), 1, model.cfg.n_heads, n, n, generator=g)
    fractions = torch.linspace(0.05, 0.95, n_masks).tolist()
    ranks = removal_ranks(scores, scope="query", allow_sink=True, allow_current=True)
    remove = torch.cat([mask_from_ranks(*ranks, k) for k in fractions], dim=1)
    timings, results = {}, {}

    def one_per_forward():
        rows = []
        for m in range(n_masks):
            with applied(model, pattern_mask_hooks(model, remove[:, m : m + 1], layers)):
                rows.append(token_nll(model(seq, return_type="logits"), seq))
        return torch.cat(rows)

    ways = {
        "one-per-forward": one_per_forward,
        "batched": lambda: masked_token_nll(model, seq, remove, layers, chunk_size=chunk, branch=False),
        "batched+branch": lambda: masked_token_nll(model, seq, remove, layers, chunk_size=chunk, branch=True),
    }
    with torch.no_grad():
        ways["batched+branch"]()  # warm-up (allocations, first-call overheads)
        for name, fn in ways.items():
            best = float("inf")
            for _ in range(repeats):
                t = time.perf_counter()
                results[name] = fn()
                best = min(best, time.perf_counter() - t)
            timings[name] = best
    ref = results["one-per-forward"]
    out = {}
    for name in ways:
        out[name] = dict(
            seconds=round(timings[name], 3),
            masked_forwards_per_s=round(n_masks / timings[name], 3),
            speedup_vs_one_per_forward=round(timings["one-per-forward"] / timings[name], 2),
            max_abs_diff_nll=float((results[name] - ref).abs().max()),
        )
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="tiny random GQA model instead of SmolLM2")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--n-masks", type=int, default=12)
    p.add_argument("--chunk", type=int, default=12, help="masks per batched forward")
    p.add_argument("--layers", default="all", help="';'-separated layer sets (each 'all' or comma-separated)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--repeats", type=int, default=1, help="best of this many timings per way")
    p.add_argument("--json", default="", help="also write the numbers to this file")
    p.add_argument("--smoke", action="store_true", help="check the script in seconds: --tiny, 16 tokens, 4 masks, --json into a temporary folder")
    args = p.parse_args()
    if args.smoke:
        args.tiny, args.seq_len, args.n_masks, args.chunk = True, 16, 4, 2
        args.json = args.json or os.path.join(smoke_folder(), "masking.json")

    if not args.tiny:
        require(("gguf", "models"))
    torch.set_grad_enabled(False)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.tiny:
        from geolens.testing import tiny_bridge, tiny_tokens

        model = tiny_bridge("gqa", n_layers=4)
        seq = tiny_tokens(model, length=min(args.seq_len, 64))[:1]
        name = "tiny-gqa (4 layers)"
    else:
        from geolens.data import corpus_windows
        from geolens.models import load_model

        model = load_model("smollm2-135m")
        seq = corpus_windows(model, "lee", args.seq_len, 1)
        name = "smollm2-135m"
    L = model.cfg.n_layers
    print(f"{name}: one sequence of {seq.shape[1]} tokens, {args.n_masks} masks, {args.chunk} masks per batched forward, "
          f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")  # fmt: skip
    report = {}
    for spec in args.layers.split(";"):
        layers = list(range(L)) if spec == "all" else sorted({int(x) % L for x in spec.split(",")})
        res = measure(model, seq, layers, args.n_masks, args.chunk, args.repeats)
        label = "all" if len(layers) == L else ",".join(map(str, layers))
        report[label] = res
        print(f"\nmasked layers {label}:")
        print(f"  {'way':<16} {'seconds':>8} {'forwards/s':>11} {'speed-up':>9} {'max |ΔNLL|':>11}")
        for way, r in res.items():
            print(f"  {way:<16} {r['seconds']:>8.2f} {r['masked_forwards_per_s']:>11.2f} {r['speedup_vs_one_per_forward']:>8.2f}x {r['max_abs_diff_nll']:>11.2e}")
    per_doc = 5 * 2 * 9 + 1  # masked forwards per document of the primary protocol (+ 1 clean forward)
    projection = {}
    for label, res in report.items():
        rate = res["batched+branch"]["masked_forwards_per_s"]
        one = res["one-per-forward"]["masked_forwards_per_s"]
        projection[label] = dict(masked_forwards_per_document=per_doc, minutes_per_100_documents_batched=round(100 * (per_doc + 1) / rate / 60, 1),
                                 minutes_per_100_documents_one_per_forward=round(100 * (per_doc + 1) / one / 60, 1))  # fmt: skip
        print(f"\nprimary protocol (masked layers {label}): {per_doc} masked forwards per document; 100 documents ≈ "
              f"{projection[label]['minutes_per_100_documents_batched']} min batched vs {projection[label]['minutes_per_100_documents_one_per_forward']} min "
              f"one mask per forward (speed-up {res['batched+branch']['speedup_vs_one_per_forward']:.2f}x)")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(model=name, seq_len=int(seq.shape[1]), n_masks=args.n_masks, chunk=args.chunk, threads=torch.get_num_threads(),
                           load_average=os.getloadavg()[0], cpus=os.cpu_count(), results=report, projection=projection), f, indent=2)  # fmt: skip
        print(f"figures: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
