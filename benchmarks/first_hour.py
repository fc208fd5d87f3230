"""Benchmark: the first hour with geolens — every everyday call, idle and beside three busy processes.

What a newcomer runs first, on SmolLM2-135M (CPU), each timed as wall and CPU seconds:

- ``load``: ``import geolens`` and ``geolens.load_model("smollm2-135m")`` from the cache, in a fresh process;
- ``attribute`` per model-level method (contribution flow, ALTI, attention rollout, Value Zeroing
  rollout, gradient × input, integrated gradients at its default) and one layer-level call
  (``contribution`` at the middle layer), on the first 16 and 128 tokens of a Lee window; each
  also as a ratio to one forward (the flows) or one forward + backward (the gradient methods) of
  the same input, timed in the same process just before;
- ``evaluate_attribution`` with one and with three metrics against the shipped SmolLM2 reference
  set (its layer cache warm), and once, idle, before the rounds, one metric in a fresh process
  (import and model load included) with that cache warm and with it empty (the first call of a
  machine; ``--fresh-only RECORD`` measures only these two into an existing record);
- ``geolens report --quick`` in a fresh process (the whole command) and each of its sections
  (report.json's wall and CPU seconds);
- integrated gradients and gradient × input against captum's ``IntegratedGradients`` and
  ``InputXGradient`` at equal settings (the same forward function from the input embeddings, the
  same baseline and target, captum's default of 50 Gauss–Legendre nodes, batch of 8), as the ratio
  geolens / captum.

Conditions: ``idle``, and ``loaded``: three single-threaded busy processes (``while True: pass``)
started a second before and killed after. Each round runs both conditions, in alternating order,
each in fresh processes, so that geolens chooses its threads as a user's process would
(geolens.threads). Per call and condition: the median over rounds; per call, the ratio loaded /
idle of each round, their geometric mean with a 95 % t-interval on the logs (goal, issue 48: at
most 2.5). A second table splits each call's loaded / idle time (of the medians) into the CPU work
it did loaded over idle and the cores it kept busy idle over those it got loaded, beside the time
one thread would take at its fair share (:func:`fair_share`). Needs scipy and captum (``pip install 'geolens[bench]'``), checked before any timing.

    python benchmarks/first_hour.py [--repeats 3] [--out docs/benchmarks/first_hour.json]
    python benchmarks/first_hour.py --repeats 3 --add-to docs/benchmarks/first_hour.json   # 3 more rounds into it
    python benchmarks/first_hour.py --markdown docs/benchmarks/first_hour.json   # the tables of docs/benchmarks.md
    python benchmarks/first_hour.py --smoke   # tiny-gqa, one round, output into a temporary folder (GEOLENS_SMOKE_OUT)
"""

from __future__ import annotations

import time

_STARTED = (time.perf_counter(), time.process_time())  # a worker's clock from its first line (imports included)

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

from _common import busy_processes, commit, machine, ratio_interval, require, smoke_folder, verdict  # noqa: E402  (benchmarks/_common.py)

HERE = Path(__file__).resolve()
MODEL_METHODS = (
    "contribution_flow",
    "alti",
    "attention_rollout",
    "value_zeroing_rollout",
    "grad_x_input",
    "integrated_gradients",
)
GRADIENT_METHODS = {"grad_x_input", "integrated_gradients"}
GOAL = 2.5  # issue 48: loaded / idle wall time
BUSY = 3


# ---------------------------------------------------------------------------------------------
# One worker: a fresh process that times the in-process calls


def _clock(fn, *args, **kwargs) -> tuple[dict, object]:
    w, c = time.perf_counter(), time.process_time()
    out = fn(*args, **kwargs)
    return dict(wall=time.perf_counter() - w, cpu=time.process_time() - c), out


def _best_wall(fn, n: int = 3) -> float:
    times = []
    for _ in range(n):
        w = time.perf_counter()
        fn()
        times.append(time.perf_counter() - w)
    return min(times)


def worker(model_name: str, lengths: list[int], evaluate_on: str | None) -> dict:
    import geolens  # before torch: the OpenMP wait policy (geolens.threads)
    from geolens.models import load_model

    model = load_model(model_name)
    import torch

    record = {
        "load": dict(wall=time.perf_counter() - _STARTED[0], cpu=time.process_time() - _STARTED[1]),
        "threads": geolens.threads.policy(),
        "calls": {},
        "units": {},
    }
    from geolens.data import corpus_windows
    from geolens.flow.baselines import _logprob_and_gradient, input_embeddings

    window = corpus_windows(model, "lee", max(lengths), 1)[0] if model_name != "tiny-gqa" else None
    if window is None:
        from geolens.testing import tiny_tokens

        window = tiny_tokens(model, length=max(lengths))[0]
    geolens.attribute(model, "warm up the lazy imports", "contribution_flow")
    for n in lengths:
        tokens = window[:n]
        text = model.to_string(tokens[1:])
        with torch.no_grad():
            fwd = _best_wall(lambda: model(tokens[None]))
            target = int(model(tokens[None])[0, -1].argmax())
        x = input_embeddings(model, tokens)
        fwd_bwd = _best_wall(lambda: _logprob_and_gradient(model, x[None], target))
        record["units"][str(n)] = dict(forward=fwd, forward_backward=fwd_bwd)
        for method in MODEL_METHODS:
            t, result = _clock(geolens.attribute, model, text, method)
            t["unit"] = fwd_bwd if method in GRADIENT_METHODS else fwd
            t["tokens"] = int(len(result.tokens)) if hasattr(result, "tokens") else n
            if method == "integrated_gradients":  # the default rule's gradients and completeness
                info = result.info["integrated_gradients"]
                t.update(gradients=int(info["n_steps"]), relative_gap=float(info["relative_gap"]))
            record["calls"][f"attribute {method} ({n} tokens)"] = t
        layer = int(model.cfg.n_layers) // 2
        t, _ = _clock(geolens.attribute, model, text, "contribution", layer=layer)
        t["unit"] = fwd
        record["calls"][f"attribute contribution, layer {layer} ({n} tokens)"] = t
        record["calls"].update(_against_captum(model, tokens, target, n))
    if evaluate_on is not None:
        one = ["contribution_abs"]
        three = ["contribution_abs", "output_normalized_intra", "raw_attention"]
        for label, methods in (("1 metric", one), ("3 metrics", three)):
            kwargs = dict(progress=False)
            if evaluate_on != "reference":
                kwargs.update(texts=["the cat sat on the mat again.", "a dog ran far away from home!"], n_boot=100)
            t, _ = _clock(geolens.evaluate_attribution, methods if len(methods) > 1 else methods[0], model, **kwargs)
            record["calls"][f"evaluate_attribution, {label}"] = t
    return record


def _against_captum(model, tokens, target: int, n: int) -> dict:
    """geolens' integrated gradients and gradient × input against captum's at equal settings: the same
    forward from the input embeddings (f = log p(target) at the last position), baseline (the erased
    prefix), rule and count (captum's default: 50 Gauss–Legendre nodes), batch of 8."""
    from captum.attr import InputXGradient, IntegratedGradients

    from geolens.flow.baselines import _logprobs, gradient_x_input, input_embeddings, integrated_gradients
    from geolens.flow.erasure import erase, space_token

    position = int(tokens.shape[0]) - 1
    erased = tokens.new_zeros(tokens.shape[0], dtype=bool)
    erased[1:] = True
    baseline = erase(tokens, erased, space_token(model))
    x, xb = input_embeddings(model, tokens), input_embeddings(model, baseline)

    def f(points):
        return _logprobs(model, points, target)

    out = {}
    mine, _ = _clock(
        integrated_gradients, model, tokens, baseline, position, target=target, n_steps=50, grid="gauss_legendre"
    )
    theirs, _ = _clock(
        IntegratedGradients(f).attribute,
        x[None],
        baselines=xb[None],
        n_steps=50,
        method="gausslegendre",
        internal_batch_size=8,
    )
    out[f"integrated gradients vs captum ({n} tokens)"] = dict(mine, captum=theirs["wall"], captum_cpu=theirs["cpu"])
    mine, _ = _clock(gradient_x_input, model, tokens, position, target=target)
    theirs, _ = _clock(lambda: InputXGradient(f).attribute(input_embeddings(model, tokens)[None]))
    out[f"gradient × input vs captum ({n} tokens)"] = dict(mine, captum=theirs["wall"], captum_cpu=theirs["cpu"])
    return out


# ---------------------------------------------------------------------------------------------
# The driver: rounds of both conditions, fresh processes


def fresh_evaluations() -> dict:
    """``evaluate_attribution("contribution_abs", "smollm2-135m")`` in a fresh process, from its first
    line (import and model load included), idle: with the reference set's layer cache warm, and cold
    (an empty cache folder: the first call of a machine, which fills it)."""
    out = {}
    for key, setup in (
        ("fresh_process_evaluate_seconds", ""),
        (
            "cold_evaluate_seconds",
            "import tempfile, pathlib, geolens.faithfulness.effects_cache as e; "
            "e.FOLDER = pathlib.Path(tempfile.mkdtemp()); ",
        ),
    ):
        code = (
            "import time; t = time.perf_counter(); import geolens; "
            + setup
            + "geolens.evaluate_attribution('contribution_abs', 'smollm2-135m', progress=False); "
            "print(time.perf_counter() - t)"
        )
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=3600)
        if run.returncode != 0:
            raise SystemExit(f"first_hour: evaluate_attribution in a fresh process failed:\n{run.stderr[-3000:]}")
        out[key] = float(run.stdout.strip().splitlines()[-1])
    return out


def _run_worker(model_name: str, lengths: list[int], evaluate_on: str | None) -> dict:
    command = [sys.executable, str(HERE), "--worker", "--model", model_name, "--lengths", *map(str, lengths)]
    if evaluate_on:
        command += ["--evaluate-on", evaluate_on]
    run = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    if run.returncode != 0:
        raise SystemExit(f"first_hour worker failed:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def _run_report(model_name: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="geolens-first-hour-") as folder:
        out = Path(folder) / "report"
        command = ["geolens", "report", "--quick", "--no-progress", "--out", str(out)]
        if model_name == "tiny-gqa":
            command += ["--model", "tiny-gqa"]
        before = os.times()
        t, run = _clock(subprocess.run, command, capture_output=True, text=True, timeout=3600)
        after = os.times()
        if run.returncode != 0:
            raise SystemExit(f"geolens report --quick failed:\n{run.stderr[-3000:]}")
        data = json.loads((out / "report.json").read_text())
    cpu = (after.children_user + after.children_system) - (before.children_user + before.children_system)
    sections = {s["title"]: dict(wall=s["seconds"], cpu=s.get("cpu_seconds")) for s in data["sections"].values()}
    p = data["params"]
    sections["corpus pass (shared)"] = dict(wall=p["corpus_pass_seconds"], cpu=p.get("corpus_pass_cpu_seconds"))
    return dict(command=t["wall"], command_cpu=cpu, sections=sections, threads=p.get("threads"))


def summarise(rounds: list[dict]) -> dict:
    """Per call: the median wall and CPU seconds per condition, the median ratio to its unit, and the
    loaded / idle interval with its verdict against :data:`GOAL`."""
    calls: dict[str, dict[str, list]] = {}
    for r in rounds:
        for cond in ("idle", "loaded"):
            w, rep = r[cond]["worker"], r[cond]["report"]
            entries = {"load_model (fresh process, import included)": w["load"], **w["calls"]}
            entries["geolens report --quick (whole command)"] = dict(wall=rep["command"], cpu=rep["command_cpu"])
            entries.update({f"report section: {k}": v for k, v in rep["sections"].items()})
            for name, t in entries.items():
                calls.setdefault(name, {}).setdefault(cond, []).append(t)
    out = {}
    for name, by in calls.items():
        row = {}
        for cond, ts in by.items():
            row[cond] = dict(
                wall=statistics.median(t["wall"] for t in ts),
                cpu=statistics.median(t["cpu"] for t in ts) if all(t.get("cpu") is not None for t in ts) else None,
            )
            if all("unit" in t for t in ts):
                row[cond]["per_unit"] = statistics.median(t["wall"] / t["unit"] for t in ts)
            if all("captum" in t for t in ts):
                row[cond]["vs_captum"] = statistics.median(t["wall"] / t["captum"] for t in ts)
        if "idle" in by and "loaded" in by and len(by["idle"]) == len(by["loaded"]):
            ci = ratio_interval([t["wall"] for t in by["loaded"]], [t["wall"] for t in by["idle"]])
            ci["verdict"] = verdict(ci, GOAL)
            row["loaded_over_idle"] = ci
        out[name] = row
    return out


def markdown(record: dict) -> str:
    lines = [
        f"{record['model']}, {record['rounds']} rounds, {record['busy']} busy processes in the loaded condition; "
        f"geolens {record['geolens']}, commit {record['commit']}{_earlier_commits(record)}, {record['machine']}.",
        "",
        "| call | idle wall s | idle CPU s | × unit | vs captum | loaded wall s | loaded / idle [95% CI] | ≤ 2.5× |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]

    def num(x, fmt="{:.2f}"):
        return "–" if x is None else fmt.format(x)

    for name, row in record["calls"].items():
        idle, loaded, ci = row.get("idle", {}), row.get("loaded", {}), row.get("loaded_over_idle")
        ratio = "–" if ci is None else f"{ci['geometric_mean']:.2f} [{ci['low']:.2f}, {ci['high']:.2f}]"
        lines.append(
            f"| {name} | {num(idle.get('wall'))} | {num(idle.get('cpu'))} | {num(idle.get('per_unit'), '{:.1f}')} | "
            f"{num(idle.get('vs_captum'))} | {num(loaded.get('wall'))} | {ratio} | {ci['verdict'] if ci else '–'} |"
        )
    return "\n".join(lines + ["", *where_the_time_goes(record)])


def _earlier_commits(record: dict) -> str:
    """The header's note when the record's rounds ran at several commits, e.g. " (rounds 4–6;
    rounds 1–3 at commit X)".

    >>> _earlier_commits(dict(commit="b", raw=[dict(commit="a"), dict(commit="a"), {}, dict(commit="b")]))
    ' (rounds 3–4; rounds 1–2 at commit a)'
    >>> _earlier_commits(dict(commit="b", raw=[dict(commit="b")]))
    ''
    """
    at = [r.get("commit", record["commit"]) for r in record.get("raw", [])]
    if len(set(at)) < 2:
        return ""
    spans, start = [], 0
    for i in range(1, len(at) + 1):
        if i == len(at) or at[i] != at[start]:
            spans.append((start + 1, i, at[start]))
            start = i
    last = spans.pop()
    earlier = "; ".join(f"rounds {a}–{b} at commit {c}" if a != b else f"round {a} at commit {c}" for a, b, c in spans)
    return f" (rounds {last[0]}–{last[1]}; {earlier})"


def where_the_time_goes(record: dict) -> list[str]:
    """The second table: each call's loaded / idle wall time (of the medians) as the product of the
    CPU work it did loaded over idle and the cores it kept busy idle over those it got loaded, an
    identity; and the wall-time ratio at which one thread, given its fair share beside the busy
    processes (:func:`fair_share`, on the record's cores), would run doing the CPU work the call
    did loaded."""
    share = fair_share(1, int(record["busy"]), record_cores(record))
    lines = [
        f"| call | cores busy idle | cores got loaded | CPU loaded / idle | loaded / idle wall (medians) "
        f"| at one thread's fair share ({share:.2f} core), same CPU |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, row in record["calls"].items():
        idle, loaded = row.get("idle", {}), row.get("loaded", {})
        if not idle.get("cpu") or not loaded.get("cpu"):
            continue
        used, got = idle["cpu"] / idle["wall"], loaded["cpu"] / loaded["wall"]
        work = loaded["cpu"] / idle["cpu"]
        lines.append(
            f"| {name} | {used:.2f} | {got:.2f} | {work:.2f} | {work * used / got:.2f} | {work * used / share:.2f} |"
        )
    return lines


def record_cores(record: dict) -> int:
    """The cores of the record's machine, as its worker processes saw them (2 where the record does not say)."""
    seen = {r[c]["worker"]["threads"].get("cores") for r in record.get("raw", []) for c in ("idle", "loaded")}
    seen.discard(None)
    if len(seen) > 1:
        raise ValueError(f"the record's rounds saw different core counts: {sorted(seen)}")
    return seen.pop() if seen else 2


def fair_share(threads: int, busy: int, cores: int) -> float:
    """The cores a process's ``threads`` runnable threads get beside ``busy`` single-threaded busy
    processes on ``cores`` cores when the scheduler shares time equally among threads.

    >>> fair_share(1, 3, 2), fair_share(2, 3, 2)
    (0.5, 0.8)
    """
    return min(threads, cores * threads / (threads + busy))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="rounds of both conditions (default 3)")
    parser.add_argument("--out", type=Path, help="the JSON record (default: print only)")
    parser.add_argument("--markdown", type=Path, help="print the tables of a JSON record and exit")
    parser.add_argument("--smoke", action="store_true", help="tiny-gqa, one round, one busy process")
    parser.add_argument(
        "--fresh-only", type=Path, help="measure only the fresh-process evaluate_attribution calls into this record"
    )
    parser.add_argument(
        "--add-to",
        type=Path,
        help="run --repeats more rounds and add them to this record (same model, load and machine), rewritten after each",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", default="smollm2-135m", help=argparse.SUPPRESS)
    parser.add_argument("--lengths", type=int, nargs="+", default=[16, 128], help=argparse.SUPPRESS)
    parser.add_argument("--evaluate-on", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(args.markdown.read_text())))
        return 0
    if args.worker:
        print(json.dumps(worker(args.model, args.lengths, args.evaluate_on)))
        return 0
    if args.fresh_only:  # the record's rounds kept; its fresh-process figures measured again
        record = json.loads(args.fresh_only.read_text())
        record.update(fresh_evaluations())
        args.fresh_only.write_text(json.dumps(record, indent=1) + "\n")
        print({k: round(record[k], 1) for k in ("fresh_process_evaluate_seconds", "cold_evaluate_seconds")})
        return 0
    try:
        earlier = _earlier_rounds(args.add_to) if args.add_to else None
    except ValueError as e:
        parser.error(str(e))  # one line, exit 2, before anything runs
    require(("scipy", "bench"), ("captum", "bench"))
    import torch  # noqa: F401  (before geolens: geolens.threads then leaves the workers' inherited environment as it is)

    from geolens._version import __version__

    model_name = "tiny-gqa" if args.smoke else "smollm2-135m"
    lengths = [8, 12] if args.smoke else [16, 128]
    evaluate_on = "texts" if args.smoke else "reference"
    repeats, busy = (1, 1) if args.smoke else (args.repeats, BUSY)
    if earlier:
        fresh = {k: earlier[k] for k in ("fresh_process_evaluate_seconds", "cold_evaluate_seconds") if k in earlier}
    else:
        fresh = None if args.smoke else fresh_evaluations()
    rounds, here = list(earlier["raw"]) if earlier else [], commit(HERE.parent)
    out = Path(smoke_folder()) / "first_hour.json" if args.smoke else (args.add_to or args.out)
    first = len(rounds)
    for r in range(first, first + repeats):
        this = {}
        for cond in ("idle", "loaded") if r % 2 == 0 else ("loaded", "idle"):
            with busy_processes(busy if cond == "loaded" else 0):
                this[cond] = dict(worker=_run_worker(model_name, lengths, evaluate_on), report=_run_report(model_name))
            print(f"round {r + 1}/{first + repeats} {cond}: report {this[cond]['report']['command']:.1f} s", flush=True)
        rounds.append(dict(this, commit=here))
        record = _record(model_name, busy, fresh, rounds, __version__)
        if out and (args.add_to or r == first + repeats - 1):  # an added round is kept as soon as it ends
            _write(out, record)
    print(markdown(record))
    if out:
        print(f"figures: {out.parent}")
    return 0


def _record(model_name: str, busy: int, fresh: dict | None, rounds: list[dict], version: str) -> dict:
    return dict(
        model=model_name,
        rounds=len(rounds),
        busy=busy,
        geolens=version,
        commit=rounds[-1]["commit"],
        machine=machine(),
        goal_loaded_over_idle=GOAL,
        **(fresh or {}),
        calls=summarise(rounds),
        raw=rounds,
    )


def _write(out: Path, record: dict) -> None:
    from geolens.checkpoint import atomic_write_bytes  # replaced whole: a kill leaves the last record

    atomic_write_bytes(out, (json.dumps(record, indent=1) + "\n").encode())


def _earlier_rounds(path: Path) -> dict:
    """The record ``--add-to`` adds rounds to, its rounds named with its commit; ValueError unless it
    is a first-hour record of this model and load on a machine like this one."""
    try:
        record = json.loads(path.read_text())
        same = record["model"] == "smollm2-135m" and record["busy"] == BUSY and record["machine"] == machine()
        rounds = [dict(r, commit=r.get("commit", record["commit"])) for r in record["raw"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"--add-to {path}: not a first-hour record ({type(e).__name__}: {e})") from None
    if not same:
        raise ValueError(
            f"--add-to {path}: recorded for {record['model']} beside {record['busy']} busy processes on "
            f"'{record['machine']}'; this run is smollm2-135m beside {BUSY} on '{machine()}'"
        )
    return dict(record, raw=rounds)


if __name__ == "__main__":
    sys.exit(main())
