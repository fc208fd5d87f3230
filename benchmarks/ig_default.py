"""Benchmark: which integrated-gradients rule reaches the flow protocol's 1 % completeness with the
fewest gradients (issue 48: the default must bring the median prediction within 1 % using at most
25 gradients).

The predictions are the flow erasure test's, version 3 (docs/flow/v3/<model>/erasure_predictions.csv.gz:
Lee windows, positions 15, 31 and 63, the clean top-1 target, the prefix-mean baseline x′), those of
the first ``--documents`` documents. For each prediction and each rule, integrated gradients of
f = log p(target) on the input embeddings along x′ + α (x − x′); the relative completeness gap
|Σ_j IG_j − (f(x) − f(x′))| / max(|f(x) − f(x′)|, 0.01) (geolens.flow.relative_gap, the protocol's
rule). The rules, each within ``--cap`` gradients:

- ``midpoint S``: the even-grid midpoint sum of S gradients (geolens' default before, with S = 64);
- ``gauss_legendre S``: the S-node Gauss–Legendre quadrature (captum's and inseq's rule);
- ``local S``: version 3's adaptive local grid started at S midpoints, refined until 1 % or the cap.

Printed per model and rule: the median relative gap, the share of predictions within 1 %, the
median and largest gradients spent, and the median wall seconds of one call; ``--out`` keeps every
row and the summary as JSON. One rule at a time per prediction (rules interleaved), on the threads
geolens chooses.

    python benchmarks/ig_default.py [--model smollm2-135m --model gemma3-270m] [--documents 10] [--cap 25] [--out FILE.json]
    python benchmarks/ig_default.py --smoke   # tiny-gqa, seconds, output into a temporary folder (GEOLENS_SMOKE_OUT)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from _common import smoke_folder  # benchmarks/_common.py

ROOT = Path(__file__).resolve().parents[1]
RULES = (("midpoint", 24), ("gauss_legendre", 8), ("gauss_legendre", 16), ("gauss_legendre", 24), ("local", 8))


def predictions(model_name: str, n_documents: int):
    import pandas as pd

    pred = pd.read_csv(ROOT / "docs" / "flow" / "v3" / model_name / "erasure_predictions.csv.gz")
    return pred[pred.document < n_documents][["document", "position", "target"]].drop_duplicates()


def run_rule(model, tokens, position, target, xb, rule: str, steps: int, cap: int):
    from geolens.flow.baselines import integrated_gradients

    kwargs = dict(target=target, baseline_embeddings=xb, n_steps=steps, batch_size=8)
    if rule == "local":
        kwargs.update(grid="local", tolerance=0.01, max_steps=cap)
    elif rule == "gauss_legendre":
        kwargs.update(grid="gauss_legendre")
    return integrated_gradients(model, tokens, None, position, **kwargs)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", help="smollm2-135m and gemma3-270m by default")
    parser.add_argument("--documents", type=int, default=10, help="first documents of the flow v3 run (default 10)")
    parser.add_argument("--cap", type=int, default=25, help="the most gradients a rule may spend (default 25)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--smoke", action="store_true", help="tiny-gqa on two made-up predictions")
    args = parser.parse_args(argv)

    import pandas as pd
    import torch

    import geolens
    from geolens.data import load_corpus
    from geolens.faithfulness.preregistered import protocol_windows
    from geolens.flow import input_embeddings, prefix_mean_baseline

    rows = []
    for model_name in ["tiny-gqa"] if args.smoke else (args.model or ["smollm2-135m", "gemma3-270m"]):
        model = geolens.load_model(model_name)
        if args.smoke:
            from geolens.testing import tiny_tokens

            windows = tiny_tokens(model, length=12)
            chosen = pd.DataFrame(dict(document=[0, 1], position=[7, 9], target=[None, None]))
        else:
            protocol = json.loads((ROOT / "docs" / "flow" / "v3" / "protocol.json").read_text())
            chosen = predictions(model_name, args.documents)
            windows, _ = protocol_windows(model, protocol, load_corpus("lee"), n_documents=args.documents)
        print(f"{model_name}: {len(chosen)} predictions, {torch.get_num_threads()} threads", flush=True)
        for p in chosen.itertuples():
            tokens = windows[int(p.document)]
            x = input_embeddings(model, tokens[: int(p.position) + 1])
            xb = prefix_mean_baseline(x, range(1, int(p.position)))
            target = None if pd.isna(p.target) else int(p.target)
            for rule, steps in RULES:
                start = time.perf_counter()
                ig = run_rule(model, tokens, int(p.position), target, xb, rule, steps, args.cap)
                rows.append(
                    dict(
                        model=model_name,
                        document=int(p.document),
                        position=int(p.position),
                        rule=f"{rule} {steps}",
                        gradients=int(ig.n_steps),
                        rel_gap=float(ig.rel_gap),
                        seconds=time.perf_counter() - start,
                    )
                )
    table = pd.DataFrame(rows)
    summary = [
        dict(
            model=m,
            rule=rule,
            n=len(part),
            median_rel_gap=float(part.rel_gap.median()),
            share_within_1pct=float((part.rel_gap <= 0.01).mean()),
            median_gradients=float(part.gradients.median()),
            max_gradients=int(part.gradients.max()),
            median_seconds=float(part.seconds.median()),
        )
        for (m, rule), part in table.groupby(["model", "rule"], sort=False)
    ]
    out = Path(smoke_folder()) / "ig_default.json" if args.smoke else args.out
    if out:
        record = dict(cap=args.cap, documents=args.documents, threads=torch.get_num_threads(), summary=summary)
        Path(out).write_text(json.dumps(dict(record, rows=rows), indent=1) + "\n")
    print(f"\nrelative completeness gap per rule (at most {args.cap} gradients; goal: median within 1 %)")
    print(f"{'model':<14} {'rule':<18} {'n':>4} {'median gap':>11} {'within 1%':>10} {'gradients':>12} {'s/call':>7}")
    for (m, rule), part in table.groupby(["model", "rule"], sort=False):
        print(
            f"{m:<14} {rule:<18} {len(part):>4} {part.rel_gap.median():>11.2%} {(part.rel_gap <= 0.01).mean():>10.0%} "
            f"{int(part.gradients.median()):>5} (≤{int(part.gradients.max())}) {part.seconds.median():>7.2f}"
        )
    if out:
        print(f"figures: {os.path.dirname(os.path.abspath(out))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
