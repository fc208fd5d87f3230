"""Benchmark: OpenMP's wait policy — a passive wait against a passive wait after a brief spin.

geolens sets ``OMP_WAIT_POLICY=PASSIVE`` and libgomp's ``GOMP_SPINCOUNT`` (``geolens.threads``) when
it is imported before torch. This script measures what the spin buys and costs, on SmolLM2-135M
(the record of commit be6ae08 chose the rule: the spin only on a free machine):

- ``passive``: ``GOMP_SPINCOUNT=0``, a waiting thread sleeps at once (what geolens sets beside busy
  processes);
- ``spin``: ``GOMP_SPINCOUNT`` = ``geolens.threads.SPIN_COUNT``, a waiting thread spins about 30 µs,
  then sleeps (what geolens sets when no other process keeps a core busy).

Both are set in each worker's environment, in both conditions, so that each is measured idle and
loaded (geolens' own choice follows the load at import, ``geolens.threads.spin_count``).

Calls, each in a fresh process per policy and condition (geolens chooses its threads as a user's
process would): the quick report's corpus pass (its analyses on its 8 windows of 64 tokens, 2 at a
time), ``attribute`` per method on 16 tokens (small products: the free cores) and Value Zeroing
rollout on 128 tokens (products of 512 rows or more: every core, ``geolens.threads.for_rows``).
Conditions: ``idle``, and ``loaded``: three single-threaded busy processes (``while True: pass``).
Each round runs the four (policy, condition) pairs in an order that alternates between rounds. Per
call: the median wall seconds of each pair, and spin / passive of each round with the geometric
mean and a 95 % t-interval on the logs (below 1: the spin is faster). Needs scipy
(``pip install 'geolens[bench]'``), checked before any timing.

    python benchmarks/wait_policy.py [--repeats 3] [--out docs/benchmarks/wait_policy.json]
    python benchmarks/wait_policy.py --markdown docs/benchmarks/wait_policy.json   # the table of docs/benchmarks.md
    python benchmarks/wait_policy.py --smoke   # tiny-gqa, one round, output into a temporary folder (GEOLENS_SMOKE_OUT)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import busy_processes, commit, machine, ratio_interval, require, smoke_folder  # benchmarks/_common.py

HERE = Path(__file__).resolve()
METHODS = ("contribution_flow", "attention_rollout", "grad_x_input", "integrated_gradients", "value_zeroing_rollout")
POLICIES = ("passive", "spin")
BUSY = 3


def worker(model_name: str) -> dict:
    import geolens  # before torch: the wait policy is decided here (geolens.threads)

    geolens.threads.apply()
    import torch

    from geolens.models import load_model
    from geolens.report import ReportConfig
    from geolens.report.build import ReportContext, _select, shared_analyses
    from geolens.runner import run_corpus

    model = load_model(model_name)
    tiny = model_name.startswith("tiny")
    if tiny:
        from geolens.testing import tiny_tokens

        tokens = torch.cat([tiny_tokens(model, length=16)] * 2)
        window = tiny_tokens(model, length=24)[0]
    else:
        from geolens.data import corpus_windows

        config = ReportConfig.quick_defaults(model=model_name)
        tokens = corpus_windows(model, config.corpus, config.seq_len, config.n_sequences + config.n_heldout)
        window = corpus_windows(model, "lee", 128, 1)[0]
    config = ReportConfig.quick_defaults(model=model_name)
    corpus = tokens[:-1]
    ctx = ReportContext(model=model, tokens=corpus, heldout=tokens[-1:], config=config, progress=False)
    modules = [spec.load() for spec in _select(config.sections)]
    analyses, _ = shared_analyses([a for m in modules if hasattr(m, "analyses") for a in m.analyses(ctx).values()])
    calls = {}

    def clock(name, fn):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        calls[name] = dict(wall=time.perf_counter() - start, cpu=time.process_time() - start_cpu)

    clock("quick report's corpus pass", lambda: run_corpus(model, corpus, analyses, batch_size=2, progress=False))
    geolens.attribute(model, "warm up the lazy imports", "contribution_flow")
    short, long_ = (8, 24) if tiny else (16, 128)
    text = model.to_string(window[1:short])
    for method in METHODS:
        clock(f"attribute {method} ({short} tokens)", lambda: geolens.attribute(model, text, method))
    text = model.to_string(window[1:long_])
    clock(
        f"attribute value_zeroing_rollout ({long_} tokens)",
        lambda: geolens.attribute(model, text, "value_zeroing_rollout"),
    )
    return dict(calls=calls, threads=geolens.threads.policy())


def _run_worker(model_name: str, policy: str) -> dict:
    env = dict(os.environ)
    for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "GEOLENS_THREADS"):
        env.pop(name, None)
    from geolens.threads import SPIN_COUNT

    env["GOMP_SPINCOUNT"] = "0" if policy == "passive" else str(SPIN_COUNT)  # set here: geolens' own follows the load
    command = [sys.executable, str(HERE), "--worker", "--model", model_name]
    run = subprocess.run(command, capture_output=True, text=True, timeout=3600, env=env)
    if run.returncode != 0:
        raise SystemExit(f"wait_policy worker failed:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def summarise(rounds: list[dict]) -> dict:
    out = {}
    for name in rounds[0]["idle"]["spin"]["calls"]:
        row = {}
        for cond in ("idle", "loaded"):
            walls = {p: [r[cond][p]["calls"][name]["wall"] for r in rounds] for p in POLICIES}
            row[cond] = {p: statistics.median(w) for p, w in walls.items()}
            row[cond]["spin_over_passive"] = ratio_interval(walls["spin"], walls["passive"])
        out[name] = row
    return out


def markdown(record: dict) -> str:
    lines = [
        f"{record['model']}, {record['rounds']} rounds, {record['busy']} busy processes in the loaded condition, "
        f"GOMP_SPINCOUNT={record['spin_count']} against 0; {record['machine']}; geolens {record['geolens']} "
        f"(commit {record['commit']}).",
        "",
        "| call | idle: passive | idle: spin | spin / passive, idle | loaded: passive | loaded: spin | spin / passive, loaded |",
        "|---|---|---|---|---|---|---|",
    ]

    def ci(r):
        return f"{r['geometric_mean']:.2f} [{r['low']:.2f}, {r['high']:.2f}]"

    for name, row in record["calls"].items():
        i, lo = row["idle"], row["loaded"]
        lines.append(
            f"| {name} | {i['passive']:.2f} s | {i['spin']:.2f} s | {ci(i['spin_over_passive'])} "
            f"| {lo['passive']:.2f} s | {lo['spin']:.2f} s | {ci(lo['spin_over_passive'])} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--repeats", type=int, default=3, help="rounds of the four (policy, condition) pairs (default 3)"
    )
    parser.add_argument("--out", type=Path, help="the JSON record (default: print only)")
    parser.add_argument("--markdown", type=Path, help="print the table of a JSON record and exit")
    parser.add_argument("--smoke", action="store_true", help="tiny-gqa, one round, one busy process")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", default="smollm2-135m", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(args.markdown.read_text())))
        return 0
    if args.worker:
        print(json.dumps(worker(args.model)))
        return 0
    require(("scipy", "bench"))
    model_name = "tiny-gqa" if args.smoke else "smollm2-135m"
    repeats, busy = (1, 1) if args.smoke else (args.repeats, BUSY)
    pairs = [(c, p) for c in ("idle", "loaded") for p in POLICIES]
    rounds = []
    for r in range(repeats):
        this = {"idle": {}, "loaded": {}}
        for cond, policy in pairs if r % 2 == 0 else pairs[::-1]:
            with busy_processes(busy if cond == "loaded" else 0):
                this[cond][policy] = _run_worker(model_name, policy)
            walls = this[cond][policy]["calls"]
            print(
                f"round {r + 1}/{repeats} {cond} {policy}: " + ", ".join(f"{v['wall']:.2f}" for v in walls.values()),
                flush=True,
            )
        rounds.append(this)
    from geolens._version import __version__
    from geolens.threads import SPIN_COUNT

    record = dict(
        model=model_name,
        rounds=repeats,
        busy=busy,
        spin_count=SPIN_COUNT,
        geolens=__version__,
        commit=commit(HERE.parent),
        machine=machine(),
        calls=summarise(rounds),
        raw=rounds,
    )
    out = Path(smoke_folder()) / "wait_policy.json" if args.smoke else args.out
    print(markdown(record))
    if out:
        out.write_text(json.dumps(record, indent=1) + "\n")
        print(f"figures: {out.parent}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
