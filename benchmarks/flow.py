"""Benchmark: contribution flow (all layers) vs the forward pass and vs a naive materialising version.

On SmolLM2-135M (CPU), one 512-token Lee window (``geolens.data.corpus_windows(model, "lee", 512, 1)``):

(a) ``run_with_cache`` with ``geolens.flow.flow_names_filter`` (what the flow reads);
(b) ``geolens.contribution_flow(model, cache, "contribution")`` on that cache: all 30 layers'
    mixing matrices by the efficient form (u_i^h · v_j^h, docs/method.md §10) and their composition;
(c) a naive version that materialises the per-head, per-source vectors α_ij^h ṽ_j^h as
    ``[query, key, head, d_model]`` for each layer (what the efficient form avoids), sums them into
    t_ij, projects on x̃_i, clips and normalises. At 512 tokens the whole tensor is 5.4 GB per layer,
    so (c) runs on ``--naive-layers`` layers and one block of ``--naive-queries`` queries spread
    evenly over the positions (``[block, key, head, d_model]``, all keys, the causal mask in α's
    zeros, as a plain implementation would) and is **extrapolated**: × (queries / block) × (layers
    / timed layers). The composition R = M R is left out of (c), which favours (c).

(a), (b) and (c) run in interleaved rounds whose order rotates (``--repeats``); b/a (goal ≤ 1) and
c/b (goal ≥ 100) are the geometric means of the per-round ratios with a 95% t-interval on their logs;
a goal is met when the whole interval is on its side.

    python benchmarks/flow.py [--seq-len 512] [--repeats 10] [--naive-layers 2] [--naive-queries 16] [--out FILE.json]
    python benchmarks/flow.py --smoke   # tiny-gqa, seconds, output into a temporary folder (GEOLENS_SMOKE_OUT)

Needs scipy (``pip install 'geolens[bench]'``) and, for SmolLM2-135M, the ``models`` extra (gguf);
both are checked before anything is timed.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from _common import commit, ratio_interval, require, smoke_folder, verdict  # benchmarks/_common.py

GOAL_B_A = 1.0  # issue 24: the whole flow within one forward-with-cache
GOAL_C_B = 100.0  # issue 24: the naive version at least 100 times slower


def naive_mixing_rows(res, queries: list[int]):
    """Rows M[i, :] of one layer's contribution mixing for the given queries, with every per-head,
    per-source vector α_ij^h ṽ_j^h materialised as one ``[query, key, head, d_model]`` tensor (all
    keys; the causal mask is in α's zeros), summed over heads into t_ij, projected on x̃_i, clipped
    and normalised. ``res``: a :class:`geolens.flow.LayerResidual`."""
    import torch

    view = res.view
    q = torch.tensor(queries)
    vt = torch.einsum("bkhd,hdm->bkhm", view.v, view.W_O)[0]  # [key, head, d_model]
    alpha = view.pattern[0][:, q].permute(1, 2, 0)  # [query, key, head]
    per_head = alpha[..., None] * vt[None]  # [query, key, head, d_model]: α_ij^h ṽ_j^h
    t = per_head.sum(2)  # [query, key, d_model]
    if res.scale is not None:
        t = t * res.scale[0, q][:, None]
    t[torch.arange(len(queries)), q] += res.own[0, q]
    x = res.mixed[0, q]  # [query, d_model]
    share = (torch.einsum("qkm,qm->qk", t, x) / (x * x).sum(-1, keepdim=True)).clamp_min(0)
    return share / share.sum(-1, keepdim=True)


def bench(model, seq_len: int, repeats: int, naive_layers: int, naive_queries: int) -> dict:
    import torch

    import geolens
    from geolens.data import corpus_windows
    from geolens.flow import LayerResidual, flow_names_filter

    tokens = corpus_windows(model, "lee", seq_len, 1)
    n_layers = model.cfg.n_layers
    nf = flow_names_filter(model)
    n = tokens.shape[1]
    queries = sorted({int(round(q)) for q in torch.linspace(0, n - 1, min(naive_queries, n)).tolist()})
    layers = list(range(min(naive_layers, n_layers)))
    scale_c = (n / len(queries)) * (n_layers / len(layers))  # every query costs the same: all keys
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=nf)

        def naive():
            for l in layers:
                naive_mixing_rows(LayerResidual(model, cache, l), queries)

        # check (c) against (b)'s mixing before timing: the same rows
        M = geolens.flow.layer_mixing(model, cache, layers[0], "contribution")[0]
        got = naive_mixing_rows(LayerResidual(model, cache, layers[0]), queries)
        err = float((got - M[queries]).abs().max())
        columns = {
            "a": lambda: model.run_with_cache(tokens, names_filter=nf),
            "b": lambda: geolens.contribution_flow(model, cache, "contribution"),
            "c": naive,
        }
        for fn in columns.values():  # one untimed call each
            fn()
        rounds = {k: [] for k in columns}
        names = list(columns)
        for r in range(repeats):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                t = time.perf_counter()
                result = columns[name]()
                rounds[name].append(time.perf_counter() - t)
                del result
    rounds["c"] = [t * scale_c for t in rounds["c"]]  # extrapolated to all queries and layers
    return dict(
        seq_len=n,
        n_layers=n_layers,
        repeats=repeats,
        naive_layers=layers,
        naive_queries=queries,
        naive_scale=scale_c,
        naive_max_abs_difference=err,
        rounds=rounds,
        best={k: min(v) for k, v in rounds.items()},
        ratio_b_a=ratio_interval(rounds["b"], rounds["a"]),
        ratio_c_b=ratio_interval(rounds["c"], rounds["b"]),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=10, help="interleaved rounds (order rotated; default 10)")
    parser.add_argument("--naive-layers", type=int, default=2, help="layers timed for (c), extrapolated to all")
    parser.add_argument(
        "--naive-queries", type=int, default=16, help="queries timed for (c), spread evenly, extrapolated to all"
    )
    parser.add_argument("--out", help="write every measured figure to this JSON file")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="check the script in seconds: tiny-gqa, 32 tokens, 2 rounds, JSON into a temporary folder",
    )
    parser.add_argument("--model", default="smollm2-135m", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke:
        args.model, args.seq_len, args.repeats, args.naive_layers, args.naive_queries = "tiny-gqa", 32, 2, 1, 4
        args.out = args.out or os.path.join(smoke_folder(), "flow.json")
    require(("scipy", "bench"), *([("gguf", "models")] if not args.model.startswith("tiny-") else []))
    import torch

    import geolens

    model = geolens.load_model(args.model)
    label = "SmolLM2-135M" if args.model == "smollm2-135m" else f"{args.model} (smoke run: the figures mean nothing)"
    r = bench(model, args.seq_len, args.repeats, args.naive_layers, args.naive_queries)
    print(
        f"{label}, CPU, torch {torch.__version__}, {torch.get_num_threads()} threads, batch 1, {r['seq_len']} tokens, "
        f"{r['n_layers']} layers, {r['repeats']} interleaved rounds"
    )
    print(
        f"(c) naive: layers {r['naive_layers']} and {len(r['naive_queries'])} queries timed, x{r['naive_scale']:.1f} to all "
        f"layers and queries (by queries); its rows differ from layer_mixing by at most {r['naive_max_abs_difference']:.2g}"
    )
    best = r["best"]
    print(
        f"best of rounds: (a) run_with_cache(flow_names_filter) {best['a']:.3f} s, (b) contribution_flow {best['b']:.3f} s, "
        f"(c) naive (extrapolated) {best['c']:.1f} s"
    )
    for key, name, goal, at_most in (("ratio_b_a", "b/a", GOAL_B_A, True), ("ratio_c_b", "c/b", GOAL_C_B, False)):
        ci = r[key]
        print(
            f"{name} round by round: geometric mean {ci['geometric_mean']:.3f} [{ci['low']:.3f}, {ci['high']:.3f}] "
            f"({ci['level']:.0%} t-interval over {ci['rounds']} rounds); goal {name} {'<=' if at_most else '>='} {goal:g}: "
            f"{verdict(ci, goal, at_most=at_most)}"
        )
    if args.out:
        record = dict(
            model=args.model,
            torch=torch.__version__,
            threads=torch.get_num_threads(),
            commit=commit(os.path.dirname(os.path.abspath(__file__))),
            **r,
        )
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)
        print(f"figures: {args.out}")


if __name__ == "__main__":
    main()
