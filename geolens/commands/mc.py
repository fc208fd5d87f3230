"""``geolens mc``: clean multiple-choice accuracy on the shipped BIG-bench tasks, with CIs.

Scores every question of each task by log-likelihood (:func:`geolens.multiple_choice.score_questions`)
and writes under ``--out``: ``mc_questions.csv`` (one row per question: prediction, correct,
log p(correct)), ``mc_summary.csv`` and ``mc_summary.json`` (accuracy and mean log-prob of the
correct answer per task and over all, 95% bootstrap CIs over questions; the command line, model,
sizes and seconds) and ``mc_clean.png``. ``--resume`` keeps the tasks already scored in ``--out`` and
scores only the others (so a long run can be split by task). Masked multiple choice runs in ``geolens faithfulness``.

Example (offline)::

    geolens mc --out docs/mc --overwrite
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path


def _plot(summary):
    import numpy as np

    from geolens.viz.common import PlotView, new_figure

    fig = new_figure(figsize=(7, 3.4))
    ax = fig.subplots()
    x = np.arange(len(summary))
    acc = summary.accuracy.to_numpy()
    err = np.stack([acc - summary.accuracy_lo.to_numpy(), summary.accuracy_hi.to_numpy() - acc])
    ax.bar(x, acc, yerr=err, capsize=3, color="tab:blue", label="accuracy [95% CI]")
    ax.scatter(x, summary.chance, marker="_", s=400, color="k", zorder=3, label="chance (mean 1/n choices)")
    ax.set_xticks(x, [f"{t}\n(n={n})" for t, n in zip(summary.task, summary.n_questions)], fontsize=7)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return PlotView(fig, title="multiple choice, clean", data={"summary": summary})


def run(args) -> int:
    import pandas as pd
    import torch

    from geolens.commands._options import UsageError, check_model_name, out_folder
    from geolens.models import load_model
    from geolens.multiple_choice import load_questions, mc_summary, score_questions

    if args.max_questions < 0:
        raise UsageError("--max-questions must be ≥ 0 (0: all)")
    if args.n_boot < 1:
        raise UsageError("--n-boot must be ≥ 1")
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not tasks:
        raise UsageError("--tasks names no task")
    if args.resume and not args.out:
        raise UsageError("--resume needs --out, the folder of the run")
    model_name = check_model_name(args.model)
    questions = []
    for t in tasks:
        try:
            qs = load_questions(t if ":" in t or t.endswith(".jsonl") else f"bigbench:{t}", max_questions=args.max_questions or None)
        except (FileNotFoundError, ModuleNotFoundError, ValueError) as e:
            raise UsageError(f"--tasks: task {t!r}: {e}") from e
        questions += [q if q.task else dataclasses.replace(q, task=Path(t).stem) for q in qs]
    if args.resume and (Path(args.out) / "mc_summary.json").exists():
        old = json.loads((Path(args.out) / "mc_summary.json").read_text())
        if old.get("normalize", args.normalize) != args.normalize:
            raise UsageError(f"--resume with --normalize {args.normalize} but {args.out} was scored with {old['normalize']}")
    out = out_folder(args, "mc", resumable=True)
    torch.set_grad_enabled(False)
    t0 = time.time()
    model = load_model(model_name, compatibility_mode=args.compat)
    prev, commands = None, []
    if args.resume and (out / "mc_questions.csv").exists():
        prev = pd.read_csv(out / "mc_questions.csv", keep_default_na=False)
        done = set(prev.task)
        questions = [q for q in questions if q.task not in done]
        if (out / "mc_summary.json").exists():
            old = json.loads((out / "mc_summary.json").read_text())
            commands = old.get("commands", [old.get("command")])
        print(f"resuming: {len(prev)} questions of {sorted(done)} already scored in {out}")
    per_q = score_questions(model, questions, normalize=args.normalize, progress=True) if questions else pd.DataFrame()
    if prev is not None:
        per_q = pd.concat([prev, per_q], ignore_index=True)
    summary = mc_summary(per_q, n_boot=args.n_boot, seed=args.seed)
    per_q.to_csv(out / "mc_questions.csv", index=False, float_format="%.6g")
    summary.to_csv(out / "mc_summary.csv", index=False, float_format="%.6g")
    view = _plot(summary)
    view.save(out / "mc_clean.png", dpi=args.dpi)
    view.close()
    info = {
        "command": " ".join(["geolens"] + sys.argv[1:]),
        "commands": commands + [" ".join(["geolens"] + sys.argv[1:])],
        "model": args.model,
        "tasks": list(dict.fromkeys(per_q.task)),
        "normalize": args.normalize,
        "n_boot": args.n_boot,
        "n_questions": int(len(per_q)),
        "seconds": round(time.time() - t0, 1),
        "summary": summary.to_dict(orient="records"),
    }
    (out / "mc_summary.json").write_text(json.dumps(info, indent=1, default=lambda x: x.item() if hasattr(x, "item") else str(x)), encoding="utf-8")
    with pd.option_context("display.width", 200):
        print(summary.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print(f"wrote {out}/ in {info['seconds']} s")
    return 0


def register(subparsers) -> None:
    from geolens.commands._options import add_out, add_run_options
    from geolens.multiple_choice import DEFAULT_TASKS

    p = subparsers.add_parser("mc", help="clean multiple-choice accuracy on the shipped BIG-bench tasks, with CIs")
    add_run_options(p, model="smollm2-135m", own={"model": {"help": "smollm2-135m (default), gemma3-270m, a folder or HF name"}})
    p.add_argument("--tasks", default=",".join(DEFAULT_TASKS), help=f"comma-separated BIG-bench tasks, hf:<name> or .jsonl files (default {','.join(DEFAULT_TASKS)})")
    p.add_argument("--max-questions", type=int, default=0, help="first N questions of each task (0: all)")
    p.add_argument("--normalize", choices=("sum", "mean"), default="sum", help="choice score: summed log-prob (BIG-bench) or per token")
    p.add_argument("--n-boot", type=int, default=2000, help="bootstrap resamples over questions")
    p.add_argument("--resume", action="store_true", help="keep the tasks already in --out/mc_questions.csv, score only the others")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dpi", type=int, default=90)
    p.add_argument("--compat", action="store_true", help="TransformerLens compatibility mode: HookedTransformer numerics (folded norms, centred W_O, b_V folded into b_O); off by default")
    add_out(p, resumable=True)
    p.set_defaults(func=run)
