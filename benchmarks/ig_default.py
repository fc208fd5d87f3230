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
- ``local S``: version 3's adaptive local grid started at S midpoints, refined until 1 % or the cap;
- ``default``: what :func:`geolens.attribute` runs (:mod:`geolens.flow.ig_options`: the local grid
  from 8, refined until 1 % or 96 gradients), whatever ``--cap``.

Also per prediction, forward passes only, the path's roughness: f at the 257 points α = k/256, and
the largest change between neighbours and the total variation Σ|Δf|, each over |f(x) − f(x′)|
(a path that rises steadily has total variation 1; a rule with S gradients cannot follow a bump
narrower than 1/S), and the width of the narrowest spike: the shortest run of α over which f moves
at least a quarter of |f(x) − f(x′)| away from a point's value and comes back within an eighth of
it. ``ig_paths.png`` beside the record draws f along the first nine paths of each model.

Printed per model and rule: the median relative gap, the share of predictions within 1 %, the
median and largest gradients spent, and the median wall seconds of one call; ``--out`` keeps every
row, the summary, the commit the run started at and each path's f as JSON, rewritten after each
prediction (the smoke run writes it and the figure into its temporary folder). One rule at a time per prediction (rules interleaved), on the threads
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

from _common import commit, smoke_folder  # benchmarks/_common.py

ROOT = Path(__file__).resolve().parents[1]
RULES = (
    ("midpoint", 24),
    ("gauss_legendre", 8),
    ("gauss_legendre", 16),
    ("gauss_legendre", 24),
    ("local", 8),
    ("default", None),
)
ROUGHNESS_POINTS = 257
PATHS_DRAWN = 9


def predictions(model_name: str, n_documents: int):
    import pandas as pd

    pred = pd.read_csv(ROOT / "docs" / "flow" / "v3" / model_name / "erasure_predictions.csv.gz")
    return pred[pred.document < n_documents][["document", "position", "target"]].drop_duplicates()


def run_rule(model, tokens, position, target, xb, rule: str, steps: int | None, cap: int):
    from geolens.flow.baselines import integrated_gradients
    from geolens.flow.ig_options import ig_settings

    if rule == "default":
        kwargs = dict(ig_settings({})["kwargs"], target=target, baseline_embeddings=xb)
        return integrated_gradients(model, tokens, None, position, **kwargs)
    kwargs = dict(target=target, baseline_embeddings=xb, n_steps=steps, batch_size=8)
    if rule == "local":
        kwargs.update(grid="local", tolerance=0.01, max_steps=cap)
    elif rule == "gauss_legendre":
        kwargs.update(grid="gauss_legendre")
    return integrated_gradients(model, tokens, None, position, **kwargs)


def roughness(model, tokens, position, target, xb) -> dict:
    """The path's largest step, total variation and narrowest spike (:func:`spike_width`), over
    |f(x) − f(x′)| (floor 0.01), from f on the even grid of :data:`ROUGHNESS_POINTS` points,
    forward passes only; ``f`` keeps the values."""
    import torch

    from geolens.flow.baselines import _path_logprobs, continued_tokens, input_embeddings

    x = input_embeddings(model, continued_tokens(tokens, position, target))
    xb = torch.cat([xb, x[position + 1 :]])
    f = _path_logprobs(model, x, xb, torch.linspace(0.0, 1.0, ROUGHNESS_POINTS, dtype=torch.float64), target, 16)
    steps, scale = f.diff().abs(), max(abs(float(f[-1] - f[0])), 0.01)
    return dict(
        largest_step=float(steps.max()) / scale,
        total_variation=float(steps.sum()) / scale,
        spike_width=spike_width(f.tolist(), 0.25 * scale),
        f=[round(float(v), 5) for v in f],
    )


def spike_width(f: list, height: float) -> float | None:
    """The shortest α-span (the points spaced evenly on [0, 1]) over which f moves at least
    ``height`` away from a point's value and comes back within ``height / 2`` of it; None when
    the path has no such spike.

    >>> spike_width([0.0, 0.0, 1.0, 0.0, 0.0], 0.5)  # up and back down over two steps of 1/4
    0.5
    >>> spike_width([0.0, 1.0, 2.0, 3.0], 0.5) is None  # a steady rise is no spike
    True
    """
    if len(f) < 2:
        return None
    step, best = 1.0 / (len(f) - 1), None
    for i, start in enumerate(f):
        away = False
        for j in range(i + 1, len(f)):
            if best is not None and (j - i) * step >= best:
                break
            if abs(f[j] - start) >= height:
                away = True
            elif away and abs(f[j] - start) <= height / 2:
                best = (j - i) * step
                break
    return best


def write_record(out: Path, args, rows: list, paths: list, at: str) -> None:
    """The JSON record: the settings, the summary per model and rule, every row and every path's f."""
    import pandas as pd
    import torch

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
            median_largest_step=float(part.largest_step.median()),
            median_total_variation=float(part.total_variation.median()),
            paths_with_spike=int(part.spike_width.notna().sum()),
            median_spike_width=None if part.spike_width.isna().all() else float(part.spike_width.median()),
        )
        for (m, rule), part in table.groupby(["model", "rule"], sort=False)
    ]
    record = dict(
        cap=args.cap,
        documents=args.documents,
        threads=torch.get_num_threads(),
        commit=at,
        roughness_points=ROUGHNESS_POINTS,
        summary=summary,
    )
    from geolens.checkpoint import atomic_write_bytes  # replaced whole: a kill leaves the last record

    atomic_write_bytes(out, (json.dumps(dict(record, rows=rows, paths=paths), indent=1) + "\n").encode())


def draw_paths(paths: list, out: Path) -> None:
    """f along the first :data:`PATHS_DRAWN` paths of each model, one row of panels per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    paths = pd.DataFrame(paths)
    models = list(dict.fromkeys(paths.model))
    fig, axes = plt.subplots(len(models), PATHS_DRAWN, figsize=(2.2 * PATHS_DRAWN, 2.0 * len(models)), squeeze=False)
    for row, name in zip(axes, models):
        for ax, p in zip(row, paths[paths.model == name].head(PATHS_DRAWN).itertuples()):
            ax.plot([k / (len(p.f) - 1) for k in range(len(p.f))], p.f, lw=0.8)
            ax.set_title(f"{name} d{p.document} p{p.position}", fontsize=7)
            ax.tick_params(labelsize=6)
        row[0].set_ylabel("f = log p(target)", fontsize=7)
    for ax in axes[-1]:
        ax.set_xlabel("α", fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


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

    rows, paths, started_at = [], [], commit(ROOT)  # the commit the run started at
    out = Path(smoke_folder()) / "ig_default.json" if args.smoke else args.out
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
            path = None
            for rule, steps in RULES:
                start = time.perf_counter()
                ig = run_rule(model, tokens, int(p.position), target, xb, rule, steps, args.cap)
                seconds = time.perf_counter() - start
                if path is None:
                    path = roughness(model, tokens, int(p.position), ig.target, xb)
                    where = dict(model=model_name, document=int(p.document), position=int(p.position))
                    paths.append(dict(where, f=path.pop("f")))
                rows.append(
                    dict(
                        model=model_name,
                        document=int(p.document),
                        position=int(p.position),
                        rule=rule if steps is None else f"{rule} {steps}",
                        gradients=int(ig.n_steps),
                        rel_gap=float(ig.rel_gap),
                        seconds=seconds,
                        **path,
                    )
                )
            if out:  # a record of the predictions so far, replaced after each one
                write_record(out, args, rows, paths, started_at)
    table = pd.DataFrame(rows)
    if out:
        draw_paths(paths, Path(out).parent / "ig_paths.png")
    print(f"\nrelative completeness gap per rule (at most {args.cap} gradients; goal: median within 1 %)")
    print(f"{'model':<14} {'rule':<18} {'n':>4} {'median gap':>11} {'within 1%':>10} {'gradients':>12} {'s/call':>7}")
    for (m, rule), part in table.groupby(["model", "rule"], sort=False):
        print(
            f"{m:<14} {rule:<18} {len(part):>4} {part.rel_gap.median():>11.2%} {(part.rel_gap <= 0.01).mean():>10.0%} "
            f"{int(part.gradients.median()):>5} (≤{int(part.gradients.max())}) {part.seconds.median():>7.2f}"
        )
    print(
        f"\nthe path's roughness (f at {ROUGHNESS_POINTS} even points; over |f(x) − f(x′)|, median of the predictions)"
    )
    for m, part in table.drop_duplicates(["model", "document", "position"]).groupby("model", sort=False):
        print(
            f"{m:<14} largest step between neighbours {part.largest_step.median():.2f}, "
            f"total variation {part.total_variation.median():.2f} (1.00: a path that only rises or only falls)"
        )
        widths = part.spike_width.dropna()
        print(
            f"{'':<14} a spike of a quarter of the net change in {len(widths)} of {len(part)} paths; narrowest "
            f"{widths.median() if len(widths) else float('nan'):.3f} in α at the median, under 1/25 in "
            f"{int((widths < 1 / 25).sum())}"
        )
    if out:
        print(f"figures: {os.path.dirname(os.path.abspath(out))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
