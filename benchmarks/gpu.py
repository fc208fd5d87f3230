"""GPU figures: the contribution engine and a forward pass on a Llama-3-8B-shaped model.

The model is built from a config with random weights (no download): 32 layers, d_model 4096,
32 query heads sharing 8 kv heads of size 128, gated MLP 14336, vocabulary 128256, RoPE base
500000; eager attention, so that ``hook_pattern`` exists. For each dtype (bf16, fp32) and length
(2048, 8192 tokens, batch 1) it records, in one run:

- the plain forward time (no hooks);
- the forward time with geolens inside it: hooks on ``hook_v`` / ``hook_pattern`` compute the
  intra and inter contribution weights of every layer as it is produced (``contribution_weight_pair``,
  query-chunked under ``--budget-gib``), reduce them and drop them (as ``benchmarks/contributions.py
  --scaling`` does on CPU); the geolens share is the time spent inside those hooks;
- the peak GPU memory of each (``torch.cuda.max_memory_allocated``), absolute.

Times are medians of ``--repeats`` after one warm-up, with the device synchronised around each
timed region. GPU runs never gate tests. Without a CUDA device the script says so and exits 0;
``--smoke`` runs the same code on a tiny config on the CPU (used to check the script itself; its
figures go to a temporary folder unless ``--out`` is given).

    python benchmarks/gpu.py --out docs/benchmarks/gpu.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _common import smoke_folder  # benchmarks/_common.py
from contributions import streamed_forward  # noqa: E402  (same folder)

LLAMA3_8B = dict(
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=128256,
    rope_theta=500000.0,
    max_position_embeddings=8192,
    rms_norm_eps=1e-5,
)
TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=512,
    rope_theta=10000.0,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
)


def build(shape: dict, dtype: torch.dtype, device: str):
    """A random Llama model of ``shape`` as a TransformerBridge on ``device`` (weights N(0, 0.02))."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from geolens.adapter.bridge import transformer_bridge
    from geolens.testing import tiny_tokenizer

    cfg = LlamaConfig(**shape, attn_implementation="eager", tie_word_embeddings=False)
    with torch.device("meta"):
        hf = LlamaForCausalLM(cfg)
    hf = hf.to_empty(device=device).to(dtype)
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)
        hf.model.rotary_emb.inv_freq = 1.0 / (
            shape["rope_theta"]
            ** (torch.arange(0, shape["head_dim"], 2, device=device, dtype=torch.float32) / shape["head_dim"])
        )
    hf.eval()
    return transformer_bridge("llama3-8b-shaped-random", hf, tiny_tokenizer(), compatibility_mode=False, device=device)


def timed(fn, repeats: int, device: str) -> tuple[float, float]:
    """(median seconds of fn's own measure or wall time, peak memory GiB) over ``repeats`` calls."""
    fn()  # warm-up
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        inner = fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t if inner is None else inner)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")
    return statistics.median(times), peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--dtypes", nargs="+", default=["bf16", "fp32"], choices=["bf16", "fp32"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget-gib", type=float, default=8.0, help="query-chunk temporaries per layer")
    parser.add_argument("--smoke", action="store_true", help="tiny config on the CPU (checks the script)")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    if args.smoke:
        device, shape, lengths = "cpu", TINY, [64, 128]
        args.out = args.out or str(Path(smoke_folder()) / "gpu.json")
    elif torch.cuda.is_available():
        device, shape, lengths = "cuda", LLAMA3_8B, args.lengths
    else:
        print(
            "benchmarks/gpu.py: no CUDA device here, so no GPU figures were measured (use --smoke to check the script on the CPU)"
        )
        return
    torch.set_grad_enabled(False)
    rows = []
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu (smoke)"
    print(f"{name}; Llama-3-8B-shaped random model" if device == "cuda" else "smoke run: tiny Llama on the CPU")
    print(
        f"{'dtype':>5} {'seq':>6} {'forward s':>10} {'fwd peak GiB':>13} {'fwd+geolens s':>14} {'geolens s':>10} {'geolens/fwd':>12} {'peak GiB':>9}"
    )
    for dt in args.dtypes:
        dtype = torch.bfloat16 if dt == "bf16" else torch.float32
        model = build(shape, dtype, device)
        for n in lengths:
            tokens = torch.randint(0, shape["vocab_size"], (1, n), device=device)
            fwd, fwd_peak = timed(
                lambda: (streamed_forward(model, tokens, with_geolens=False), None)[1], args.repeats, device
            )
            spent: list[float] = []

            def with_geolens():
                t = time.perf_counter()
                spent.append(streamed_forward(model, tokens, with_geolens=True, budget=int(args.budget_gib * 2**30)))
                if device == "cuda":
                    torch.cuda.synchronize()
                return time.perf_counter() - t

            both, both_peak = timed(with_geolens, args.repeats, device)
            geo = statistics.median(spent[1:])
            rows.append(
                dict(
                    dtype=dt,
                    seq_len=n,
                    forward_s=fwd,
                    forward_peak_gib=fwd_peak,
                    forward_with_geolens_s=both,
                    geolens_s=geo,
                    geolens_over_forward=geo / fwd,
                    peak_gib=both_peak,
                )
            )
            print(
                f"{dt:>5} {n:>6} {fwd:>10.3f} {fwd_peak:>13.2f} {both:>14.3f} {geo:>10.3f} {geo / fwd:>12.3f} {both_peak:>9.2f}",
                flush=True,
            )
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"device": name, "shape": shape, "rows": rows}, indent=2) + "\n")
        print(f"figures: {args.out}")


if __name__ == "__main__":
    main()
