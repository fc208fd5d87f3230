"""Report section: head pruning by regime vs baselines (docs/method.md §6, Mudarisov et al. 2026).

The pruning pipeline (:func:`geolens.pipelines.pruning.run_pruning`, mean-ablation): its
references (head taxonomy, attention entropy, mean ``hook_z``) are streamed in the report's shared
corpus pass; ΔPPL is measured on the held-out windows, which that pass never sees, for each order
of :func:`geolens.pruning.pruning_orders` (regime: Reset → Mixer → Retriever; weight magnitude;
attention entropy; random seeds) at each retention level.
"""

from __future__ import annotations

import numpy as np

from geolens.claims import counted
from geolens.pipelines.pruning import PruningParams, pruning_analyses, run_pruning
from geolens.pruning import RETENTION
from geolens.report.document import Finding, Section


def params(ctx) -> PruningParams:
    ref, evaluation = ctx.tokens, ctx.heldout
    desc = (
        f"mean-ablation of hook_z; references (taxonomy, entropy, mean z) on the {counted(ref.shape[0], 'corpus-pass window')}, "
        f"ΔPPL on {counted(evaluation.shape[0], 'held-out window')} × {counted(evaluation.shape[1], 'token')}"
    )
    grid = (
        {"retention": (0.8, 0.5), "seeds": (0,)} if ctx.config.quick else {"retention": RETENTION, "seeds": (0, 1, 2)}
    )
    return PruningParams(mode="mean", batch_size=ctx.config.batch_size, description=desc, **grid)


def quick_sample(ctx) -> str:
    """What quick mode samples down here, in a few words (the report's quick-mode line)."""
    return "pruning at 80 % and 50 % retention, one seed"


def analyses(ctx) -> dict:
    return pruning_analyses(ctx.model, ctx.tokens, params(ctx))


def build(ctx, analyses: dict) -> Section:
    p = params(ctx)
    run = run_pruning(ctx.model, ctx.tokens, ctx.heldout, p, analyses=analyses, progress=ctx.progress)
    df = run.curves
    wide = run.tables["pruning_wide"].reset_index()
    wide.columns = [str(c) for c in wide.columns]
    claims = run.claims(windows="held-out windows")
    numbers = claims[0].numbers
    finding = Finding(
        title="Pruning heads in regime order vs random orders",
        what=f"the rise in perplexity (mean ΔPPL over retention levels {', '.join(f'{r:g}' for r in p.retention)}) when "
        f"heads are pruned in regime order ({numbers['regime']:.3g}) minus its mean over random orders "
        f"({numbers['random']:.3g}); below 0, pruning in regime order costs less perplexity than random orders",
        value=numbers["regime"] - numbers["random"],
        low=None,
        high=None,
        n=int(ctx.heldout.shape[0]),
        units="held-out windows",
        fmt="+.3g",
        figure=0,
    )
    intro = (
        "Head pruning by regime (Mudarisov et al. 2026). "
        "Heads are mean-ablated at hook_z in a fixed order down to each retention level. Orders: "
        "<b>regime</b> (Reset heads first, then Mixer, Retrievers last; ties by ascending current-token "
        "share), <b>weight</b> (ascending ‖W_V‖·‖W_O‖), <b>entropy</b> (most diffuse attention first) "
        f"and random permutations. {p.description}."
    )
    return Section(
        key="pruning",
        title="Pruning curves",
        intro=intro,
        figures=[run.figures["pruning"]()],
        tables=[
            (
                "ΔPPL per order (rows) and retention (columns)",
                wide,
                "ΔPPL: perplexity of the pruned model minus the unpruned one, on the held-out windows.",
            )
        ],
        numbers={
            "curves": df,
            "orders": {k: [list(h) for h in v] for k, v in run.orders.items()},
            "clean_ppl": float(np.asarray(df.clean_ppl)[0]),
        },
        claims=claims,
        findings=[finding],
        params={
            "mode": "mean",
            "retention": list(p.retention),
            "seeds": list(p.seeds),
            "eval_windows": int(ctx.heldout.shape[0]),
            "reference_windows": int(ctx.tokens.shape[0]),
        },
    )
