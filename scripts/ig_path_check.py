"""Why integrated gradients needs many steps on some predictions of a flow erasure run (protocol
version 2, docs/flow/v2/PROTOCOL.md): f = log p(target) along the straight path from the
prefix-mean baseline x′ to the input x, forward passes only (geolens.flow.integration_path).

For each prediction of the chosen documents it prints the steps integrated gradients took and the
gap it reached (from the run's erasure_predictions.csv.gz), then the path's net change
f(x) − f(x′), its total variation on an even grid, their ratio, and the grid interval where f
changes most. A ratio far above 1 means f falls and recovers on the way; a change of several nats
within one interval of the grid means a feature narrower than the grid, which a midpoint sum
resolves only with many steps. Default documents: those with a prediction over the protocol's
tolerance; ``--predictions over`` keeps only those predictions.

    python scripts/ig_path_check.py --model smollm2-135m --run docs/flow/v2/smollm2-135m --out /tmp/ig_path.csv
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd
import torch


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--run", required=True, type=Path, help="a flow erasure version-2 results folder")
    parser.add_argument("--documents", type=int, nargs="*", help="document indices (default: those over tolerance)")
    parser.add_argument(
        "--predictions",
        choices=("all", "over"),
        default="all",
        help="all predictions of the documents, or only those over the tolerance (default all)",
    )
    parser.add_argument("--points", type=int, default=257, help="grid points from α = 0 to 1 (default 257)")
    parser.add_argument("--out", type=Path, help="CSV of the rows printed")
    args = parser.parse_args(argv)
    progress = args.run / "erasure_progress.json"
    if not progress.exists():
        print(f"ig_path_check: {progress} does not exist", file=sys.stderr)
        return 2
    protocol = json.loads(progress.read_text(encoding="utf-8"))["fingerprint"]["protocol"]
    tolerance = protocol["integrated_gradients"]["adaptive"]["tolerance"]
    pred = pd.read_csv(args.run / "erasure_predictions.csv.gz")
    from geolens.flow.baselines import REL_GAP_FLOOR, relative_gap

    pred["rel_gap"] = relative_gap(pred.ig_sum, pred.ig_f_input, pred.ig_f_baseline)
    documents = args.documents or sorted(set(pred.loc[pred.rel_gap > tolerance, "document"]))
    if not set(documents) <= set(pred.document):
        print(
            f"ig_path_check: documents {sorted(set(documents) - set(pred.document))} are not in the run",
            file=sys.stderr,
        )
        return 2

    import geolens
    from geolens.data import load_corpus
    from geolens.faithfulness.preregistered import protocol_windows
    from geolens.flow import input_embeddings, integration_path, prefix_mean_baseline

    model = geolens.load_model(args.model)
    windows, _ = protocol_windows(
        model, protocol, load_corpus(protocol["data"]["corpus"]), n_documents=max(documents) + 1
    )
    rows = []
    chosen = pred[pred.document.isin(documents) & ((pred.rel_gap > tolerance) | (args.predictions == "all"))]
    for _, p in chosen.iterrows():
        d, i = int(p.document), int(p.position)
        x = input_embeddings(model, windows[d][: i + 1])
        path = integration_path(
            model,
            windows[d],
            i,
            baseline_embeddings=prefix_mean_baseline(x, range(1, i)),
            target=int(p.target),
            alphas=args.points,
        )
        at, change = path.steepest
        rows.append(
            dict(
                document=d,
                position=i,
                ig_steps=int(p.ig_steps),
                rel_gap=float(p.rel_gap),
                net=path.net,
                total_variation=path.total_variation,
                ratio=path.total_variation / max(abs(path.net), REL_GAP_FLOOR),
                min_f=float(path.f.min()),
                steepest_alpha=at,
                steepest_change=change,
            )
        )
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in rows[-1].items()), flush=True)
    table = pd.DataFrame(rows)
    if args.out:
        table.to_csv(args.out, index=False)
    over = table.rel_gap > tolerance
    for name, part in (("over tolerance", table[over]), ("within tolerance", table[~over])):
        if len(part):
            steep = part.steepest_change.abs()
            print(
                f"{name}: n = {len(part)}; total variation / |net| median {part.ratio.median():.3g} "
                f"(range {part.ratio.min():.3g}–{part.ratio.max():.3g}); largest change of f in one grid "
                f"interval median {steep.median():.3g} nats (range {steep.min():.3g}–{steep.max():.3g})"
            )
    return 0


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    sys.exit(main())
