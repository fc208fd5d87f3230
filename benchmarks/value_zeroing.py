"""Benchmark: geolens Value Zeroing against inseq's, same model, same tokens, one run.

Value Zeroing (Mohebbi et al. 2023) scores source j for query i at layer l by 1 − cos between
the layer's output at i with and without v_j zeroed in every head. geolens computes it from one
clean forward: zeroing v_j leaves the pattern unchanged, so the attention output without j is
the clean one minus Σ_h α_ij ṽ_j^h, and only the rows i ≥ j go through the rest of the block
(:func:`geolens.value_zeroing`). inseq 0.7.1 (``inseq.load_model(model, "value_zeroing")``)
attributes a text step by step, one forward per (step, source) with the values patched.

Both run on SmolLM2-135M-Instruct (the float32 checkpoint geolens converts from the shipped GGUF,
``~/.cache/geolens/models/smollm2-135m-f32``), on the same ``--n-tokens`` token ids (BOS + a Lee
text), all 30 layers, ``--threads`` torch threads, each in a fresh subprocess:

- time: median of ``--repeats`` calls after one warm-up call, model loaded once; geolens once per
  ``--geolens-chunks`` setting (the default, and a small ``chunk_size`` that trades speed for memory);
- memory: the subprocess's peak RSS (``ru_maxrss``: loading, warm-up and timed calls), and the
  same peak just before the first Value Zeroing call (the model loaded and run once);
- agreement: inseq's ``target_attributions`` ``[key, step, layer]`` (step t scores query t)
  against geolens ``value_zeroing(..., final_norm=True)`` passed through inseq's post-processing
  (scores below its hard-coded ``min_score_threshold`` 1e-5 set to 0, then each row normalised to
  sum 1, as Mohebbi et al. do) (inseq compares hidden states after the final
  norm at the last layer, as Hugging Face ``hidden_states[-1]`` is), over queries 0 … n − 2 (the
  queries inseq scores); max |diff| over all layers and per layer.

inseq needs transformers < 4.54 (its hooks expect decoder layers that return tuples), so it runs
in its own environment, given by ``--inseq-python`` (default ``$INSEQ_PYTHON``)::

    python -m venv --system-site-packages .venvs/inseq
    .venvs/inseq/bin/pip install "inseq==0.7.1" "transformers>=4.50,<4.54"
    python benchmarks/value_zeroing.py --inseq-python .venvs/inseq/bin/python --out docs/benchmarks/value_zeroing.json

transformers 4.x reads ``rope_theta`` from the top level of ``config.json`` and ignores the 5.x
``rope_parameters`` field the checkpoint was saved with, so the inseq child sets it explicitly.

Needs scipy (``pip install 'geolens[bench]'``), the ``models`` extra for SmolLM2, and inseq in the
``--inseq-python`` environment; all three are checked before anything is timed.

    python benchmarks/value_zeroing.py --smoke   # checks the script in seconds (tiny-gqa, no inseq: see below)

``--smoke`` runs the whole path on ``tiny-gqa`` with 12 tokens and 2 repeats, its JSON written into
a temporary folder; without ``--inseq-python`` the inseq side is a stand-in (geolens' own scores
put into inseq's output format by a third child), so its figures and agreement mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import commit, require, smoke_folder  # benchmarks/_common.py

from geolens import threads as geolens_threads

CHECKPOINT = Path(os.environ.get("GEOLENS_CACHE", Path.home() / ".cache" / "geolens")) / "models" / "smollm2-135m-f32"


INSEQ_MIN_SCORE = 1e-5  # inseq's ValueZeroing zeroes raw scores below this before normalising rows


GOAL_SPEEDUP = 3.0  # issue 15: at least 3× faster than inseq (at no more peak memory)


def require_inseq(python: str) -> None:
    """Exit at once, in one line, when the --inseq-python environment cannot import inseq."""
    try:
        ok = subprocess.run([python, "-c", "import inseq"], capture_output=True, text=True, timeout=600).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if not ok:
        raise SystemExit(
            f"benchmarks/value_zeroing.py: {python} cannot import inseq: "
            f"{python} -m pip install 'inseq==0.7.1' 'transformers>=4.50,<4.54'"
        )


def speedup_interval(slow: list[float], fast: list[float], level: float = 0.95) -> dict:
    """slow/fast as a ratio of geometric means, with a Welch t-interval on the difference of mean
    log times (the two tools run in separate processes, so their calls are not paired)."""
    import numpy as np
    from scipy import stats

    a, b = np.log(slow), np.log(fast)
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = float(stats.t.ppf((1 + level) / 2, df) * np.sqrt(va + vb))
    d = float(a.mean() - b.mean())
    return {"ratio": float(np.exp(d)), "low": float(np.exp(d - half)), "high": float(np.exp(d + half)), "level": level}


def verdict(interval: dict, goal: float) -> str:
    if interval["low"] >= goal:
        return "met"
    return "not met" if interval["high"] < goal else "undecided"


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def child_geolens(args) -> None:
    import torch

    torch.set_grad_enabled(False)
    geolens_threads.apply(args.threads)  # kept when a model loads (geolens.threads)
    import geolens
    from geolens.data import load_corpus
    from geolens.models import load_model

    model = load_model(args.model)
    text = " ".join(load_corpus("lee", max_docs=3))
    ids = model.to_tokens(text)[:, : args.n_tokens]
    model(ids)  # the first forward pages the weights in, as inseq's warm-up does
    model_rss = peak_rss_mib()  # the process's peak with the model loaded and run once
    chunk = args.chunk or None
    geolens.value_zeroing(model, ids, final_norm=True, chunk_size=chunk)  # warm-up
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        vz = geolens.value_zeroing(model, ids, final_norm=True, chunk_size=chunk)
        times.append(time.perf_counter() - t0)
    torch.save({"ids": ids[0].tolist(), "scores": vz[:, 0]}, args.child_out)
    print(json.dumps({"times": times, "peak_rss_mib": peak_rss_mib(), "model_peak_rss_mib": model_rss}))


def child_inseq(args) -> None:
    import torch

    torch.set_grad_enabled(False)
    geolens_threads.apply(args.threads)  # kept when a model loads (geolens.threads)
    import inseq
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    cfg = AutoConfig.from_pretrained(CHECKPOINT)
    cfg.rope_theta = json.loads((CHECKPOINT / "config.json").read_text())["rope_parameters"]["rope_theta"]
    hf = AutoModelForCausalLM.from_pretrained(
        CHECKPOINT, config=cfg, torch_dtype=torch.float32, attn_implementation="eager"
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_file=str(CHECKPOINT / "tokenizer.json"),
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
    )
    ids = torch.load(args.child_in)["ids"]
    text = tok.decode(ids)
    if tok(text)["input_ids"] != ids:
        raise SystemExit("inseq child: the text does not re-tokenise to geolens' ids")
    model = inseq.load_model(hf, "value_zeroing", tokenizer=tok)
    hf(torch.tensor([ids]))  # one plain forward pages the weights in, as in the geolens child
    model_rss = peak_rss_mib()

    def call():
        out = model.attribute(input_texts=tok.decode(ids[:1]), generated_texts=text, show_progress=False)
        return out.sequence_attributions[0].target_attributions  # [key, step, layer]

    call()  # warm-up
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        scores = call()
        times.append(time.perf_counter() - t0)
    torch.save({"scores": scores.permute(2, 1, 0).contiguous()}, args.child_out)  # [layer, query, key]
    print(json.dumps({"times": times, "peak_rss_mib": peak_rss_mib(), "model_peak_rss_mib": model_rss}))


def child_reference(args) -> None:
    """--smoke without inseq: stands in for the inseq child. geolens' own scores (chunk_size=1) in
    inseq's output format ([layer, query 0 … n − 2, key], scores below 1e-5 zeroed, rows normalised,
    future sources NaN), so that the rest of the script runs; its figures mean nothing."""
    import torch

    torch.set_grad_enabled(False)
    geolens_threads.apply(args.threads)  # kept when a model loads (geolens.threads)
    import geolens
    from geolens.models import load_model

    model = load_model(args.model)
    ids = torch.tensor([torch.load(args.child_in)["ids"]])
    model(ids)
    model_rss = peak_rss_mib()

    def call():
        vz = geolens.value_zeroing(model, ids, final_norm=True, chunk_size=1)[:, 0, :-1]  # [layer, query, key]
        vz = torch.where(vz >= INSEQ_MIN_SCORE, vz, torch.zeros_like(vz))
        vz = vz / vz.sum(-1, keepdim=True).clamp_min(1e-30)
        future = torch.ones(vz.shape[-2], vz.shape[-1], dtype=torch.bool).triu(1)
        return vz.masked_fill(future, float("nan"))

    call()  # warm-up
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        scores = call()
        times.append(time.perf_counter() - t0)
    torch.save({"scores": scores.contiguous()}, args.child_out)
    print(json.dumps({"times": times, "peak_rss_mib": peak_rss_mib(), "model_peak_rss_mib": model_rss}))


def run_child(
    python: str, which: str, args, tmp: Path, child_in: Path | None = None, chunk: int = 0
) -> tuple[dict, Path]:
    out = tmp / f"{which}-{chunk}.pt"
    cmd = [
        python,
        __file__,
        f"--child-{which}",
        "--n-tokens",
        str(args.n_tokens),
        "--threads",
        str(args.threads),
        "--repeats",
        str(args.repeats),
        "--child-out",
        str(out),
        "--chunk",
        str(chunk),
        "--model",
        args.model,
    ]
    if child_in is not None:
        cmd += ["--child-in", str(child_in)]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), PYTHONWARNINGS="ignore")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{which} child failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1]), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument(
        "--geolens-chunks",
        type=int,
        nargs="+",
        default=[0, 4],
        help="value_zeroing chunk_size settings timed (0: the default; small: less memory)",
    )
    parser.add_argument("--chunk", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--inseq-python", default=os.environ.get("INSEQ_PYTHON", ""))
    parser.add_argument("--out", default="", help="write the figures to this JSON file")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="check the script in seconds: tiny-gqa, 12 tokens, 2 repeats, --out into a temporary folder (inseq stand-in without --inseq-python)",
    )
    parser.add_argument("--model", default="smollm2-135m", help=argparse.SUPPRESS)  # tiny-gqa for --smoke
    parser.add_argument("--child-geolens", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child-inseq", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child-reference", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    parser.add_argument("--child-in", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_geolens:
        return child_geolens(args)
    if args.child_inseq:
        return child_inseq(args)
    if args.child_reference:
        return child_reference(args)
    if args.smoke:
        args.model, args.n_tokens, args.repeats, args.geolens_chunks = "tiny-gqa", 12, 2, [0, 4]
        args.out = args.out or os.path.join(smoke_folder(), "value_zeroing.json")
    elif not args.inseq_python:
        raise SystemExit(
            "value_zeroing benchmark: give --inseq-python (an environment with inseq 0.7.1, transformers < 4.54)"
        )
    require(("scipy", "bench"), *([("gguf", "models")] if not args.model.startswith("tiny-") else []))
    if args.inseq_python:
        require_inseq(args.inseq_python)
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        runs = [run_child(sys.executable, "geolens", args, tmp, chunk=c) for c in args.geolens_chunks]
        g, g_path = runs[0]
        if args.inseq_python:
            i, i_path = run_child(args.inseq_python, "inseq", args, tmp, child_in=g_path)
        else:  # --smoke without inseq: the stand-in
            i, i_path = run_child(sys.executable, "reference", args, tmp, child_in=g_path)
        gs, ins = torch.load(g_path)["scores"], torch.load(i_path)["scores"]
        same = max(float((torch.load(p)["scores"] - gs).abs().max()) for _, p in runs)
    n = gs.shape[-1]
    gs = gs[:, : n - 1]  # inseq scores queries 0 … n − 2
    kept = gs >= INSEQ_MIN_SCORE
    gs = torch.where(kept, gs, torch.zeros_like(gs))
    row = gs.sum(-1, keepdim=True)
    gs = gs / torch.where(row == 0, torch.ones_like(row), row)
    if ins.shape != gs.shape:
        raise SystemExit(f"shapes differ: geolens {tuple(gs.shape)}, inseq {tuple(ins.shape)}")
    causal = torch.ones(n - 1, n, dtype=torch.bool).tril()  # j ≤ i; inseq leaves future sources NaN
    if not torch.isfinite(ins[:, causal]).all():
        raise SystemExit("inseq returned non-finite scores for visible sources")
    diff = (gs.double() - ins.double()).abs() * causal
    diff = diff.nan_to_num(0.0)
    # A raw score within float32 rounding of the 1e-5 threshold can be kept by one tool and
    # dropped by the other, which moves its whole row; count those rows and measure the rest apart.
    flipped = ((kept != (ins.nan_to_num(0.0) > 0)) & causal).any(-1)  # [layer, query]
    clean_rows = diff.masked_fill(flipped[..., None], 0.0)
    per_layer = diff.flatten(1).amax(1)
    g_med, i_med = statistics.median(g["times"]), statistics.median(i["times"])
    result = {
        "model": args.model,
        "n_tokens": n,
        "layers": gs.shape[0],
        "threads": args.threads,
        "repeats": args.repeats,
        "geolens_s": g["times"],
        "inseq_s": i["times"],
        "geolens_median_s": g_med,
        "inseq_median_s": i_med,
        "speedup": i_med / g_med,
        "geolens_peak_rss_mib": g["peak_rss_mib"],
        "inseq_peak_rss_mib": i["peak_rss_mib"],
        "inseq_model_peak_rss_mib": i["model_peak_rss_mib"],
        "geolens_by_chunk": [
            {
                "chunk_size": c or "default",
                "median_s": statistics.median(r["times"]),
                "speedup": i_med / statistics.median(r["times"]),
                "speedup_interval": speedup_interval(i["times"], r["times"]),
                "times": r["times"],
                "peak_rss_mib": r["peak_rss_mib"],
                "model_peak_rss_mib": r["model_peak_rss_mib"],
            }
            for c, (r, _) in zip(args.geolens_chunks, runs)
        ],
        "max_abs_diff_between_chunk_settings": same,
        "max_abs_diff": float(diff.max()),
        "max_abs_diff_per_layer": per_layer.tolist(),
        "rows": int(causal.any(-1).sum()) * gs.shape[0],
        "rows_with_threshold_flip": int(flipped.sum()),
        "max_abs_diff_other_rows": float(clean_rows.max()),
        "max_score": float(ins[:, causal].abs().max()),
        "load_average": os.getloadavg(),
    }
    label = "SmolLM2-135M" if args.model == "smollm2-135m" else f"{args.model} (smoke run: the figures mean nothing)"
    if not args.inseq_python:
        label += "; inseq replaced by a stand-in (geolens' own scores in inseq's format)"
    print(f"{label}, {n} tokens, all {gs.shape[0]} layers, {args.threads} threads, median of {args.repeats}")
    for c, (r, _) in zip(args.geolens_chunks, runs):
        med = statistics.median(r["times"])
        ci = speedup_interval(i["times"], r["times"])
        print(
            f"  geolens value_zeroing(final_norm=True, chunk_size={c or 'default'}): {med:.3f} s ({i_med / med:.1f}× faster; "
            f"geometric means {ci['ratio']:.2f}× [{ci['low']:.2f}, {ci['high']:.2f}], 95% Welch interval; "
            f"goal >= {GOAL_SPEEDUP:.0f}×: {verdict(ci, GOAL_SPEEDUP)})   peak RSS {r['peak_rss_mib']:.0f} MiB "
            f"({'no more' if r['peak_rss_mib'] <= i['peak_rss_mib'] else 'more'} than inseq's {i['peak_rss_mib']:.0f}, one process each; "
            f"{r['model_peak_rss_mib']:.0f} with the model loaded and run once, before Value Zeroing)"
        )
    print(
        f"  inseq 0.7.1 value_zeroing: {i_med:.3f} s   peak RSS {i['peak_rss_mib']:.0f} MiB "
        f"({i['model_peak_rss_mib']:.0f} with the model loaded and run once)"
    )
    print(f"  chunk settings agree to {same:.1e}")
    print(
        f"  agreement (default chunk): max |diff| {diff.max():.2e} (largest score {ins[:, causal].abs().max():.3f}); "
        f"worst layer {int(per_layer.argmax())} ({per_layer.max():.2e})"
    )
    print(
        f"  {int(flipped.sum())} of {gs.shape[0] * (n - 1)} (layer, query) rows hold a score that one tool keeps and the other "
        f"zeroes at inseq's 1e-5 threshold; max |diff| on the other rows {clean_rows.max():.2e}"
    )
    print(f"  load average {os.getloadavg()[0]:.2f}")
    if args.out:
        result["commit"] = commit(os.path.dirname(os.path.abspath(__file__)))
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        print(f"figures: {args.out}")


if __name__ == "__main__":
    main()
