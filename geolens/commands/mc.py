"""``geolens mc``: multiple choice on the shipped BIG-bench tasks, clean and under the protocol's masks.

Scores every question by choice-normalised log-likelihood (each choice's mean per-token
log-probability given the prompt; ``--normalize sum`` for the summed BIG-bench score), decides
which tasks are above chance (clean accuracy's 95% bootstrap CI over questions entirely above
the mean of 1/#choices) and, with ``--masks``, masks the eligible tasks one layer at a time and
tests the metric pairs in one Holm family (:mod:`geolens.faithfulness.multiple_choice`,
docs/faithfulness/PROTOCOL.md §5). ``--protocol docs/faithfulness/protocol.json`` runs exactly the
pre-registered settings and refuses the options that would change them.

Writes under ``--out``: ``mc_questions.csv`` (one row per question: clean choice scores,
prediction, margin; margins under every (metric, layer, k) mask and the mean margin drop per
metric), ``mc_summary.csv`` (accuracy [95% CI] and chance per task, eligibility),
``summary.json`` (the protocol's SHA-256 and label, pre-registered or exploratory, eligible and excluded
tasks, the pairs with p, p_adj, interval and verdict, question counts per task), ``mc_clean.png``
and ``mc_checkpoint.json`` (every question's record, saved as it is computed: ``--resume``
continues an interrupted run).

Example (offline)::

    geolens mc --protocol docs/faithfulness/protocol.json --out runs/mc-smollm2
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

# options that --protocol fixes: (attribute, option, default without --protocol)
FIXED = (
    ("tasks", "--tasks", None),
    ("max_questions", "--max-questions", 0),
    ("normalize", "--normalize", "mean"),
    ("n_boot", "--n-boot", 2000),
    ("seed", "--seed", 0),
    ("layer_step", "--layer-step", 3),
    ("fractions", "--fractions", [0.05, 0.2]),
)


def _plot(summary):
    import numpy as np

    from geolens.viz.common import PlotView, new_figure

    fig = new_figure(figsize=(7, 3.4))
    ax = fig.subplots()
    x = np.arange(len(summary))
    acc = summary.accuracy.to_numpy()
    err = np.stack([acc - summary.ci_low.to_numpy(), summary.ci_high.to_numpy() - acc])
    ax.bar(
        x,
        acc,
        yerr=err,
        capsize=3,
        color=["tab:blue" if e else "tab:gray" for e in summary.eligible],
        label="accuracy [95% CI]",
    )
    ax.scatter(x, summary.chance, marker="_", s=400, color="k", zorder=3, label="chance (mean 1/n choices)")
    ax.set_xticks(
        x,
        [
            f"{t}\n(n={n}{'' if e else ', excluded'})"
            for t, n, e in zip(summary.task, summary.n_questions, summary.eligible)
        ],
        fontsize=7,
    )
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return PlotView(fig, title="multiple choice, clean (grey: at chance, excluded)", data={"summary": summary})


def _settings(args):
    """(protocol or None, tasks, max_questions, MCSettings) from the options; UsageError on conflicts."""
    from geolens.errors import UsageError
    from geolens.faithfulness.multiple_choice import DEFAULT_PAIRS, MCSettings, mc_protocol
    from geolens.multiple_choice import DEFAULT_TASKS

    if args.protocol:
        given = [option for attr, option, _ in FIXED if getattr(args, attr) is not None]
        if args.compat:
            given.append("--compat")
        if given:
            raise UsageError(
                f"--protocol fixes {', '.join(given)}: leave {'it' if len(given) == 1 else 'them'} out (or drop --protocol for an exploratory run)"
            )
        try:
            protocol = mc_protocol(args.protocol)
        except ValueError as err:
            raise UsageError(f"--protocol: {err}") from None
        return protocol, list(protocol.tasks), 0, protocol.settings
    for attr, _, default in FIXED:
        if getattr(args, attr) is None:
            setattr(args, attr, default)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()] if args.tasks is not None else list(DEFAULT_TASKS)
    if not tasks:
        raise UsageError("--tasks names no task")
    try:
        settings = MCSettings(
            normalize=args.normalize,
            layer_step=args.layer_step,
            fractions=tuple(args.fractions),
            pairs=DEFAULT_PAIRS,
            n_boot=args.n_boot,
            seed=args.seed,
        )
    except ValueError as err:
        raise UsageError(str(err)) from None
    return None, tasks, args.max_questions, settings


def _questions(tasks, max_questions):
    from geolens.errors import UsageError
    from geolens.multiple_choice import load_questions

    questions = []
    for t in tasks:
        try:
            qs = load_questions(
                t if ":" in t or t.endswith(".jsonl") else f"bigbench:{t}", max_questions=max_questions or None
            )
        except (FileNotFoundError, ModuleNotFoundError, ValueError, KeyError, TypeError) as e:
            raise UsageError(f"--tasks: task {t!r}: {type(e).__name__}: {e}") from e
        questions += [q if q.task else dataclasses.replace(q, task=Path(t).stem) for q in qs]
    return questions


def _write(path: Path, text: str) -> None:
    from geolens.checkpoint import atomic_write_bytes

    atomic_write_bytes(path, text.encode("utf-8"))


def run(args) -> int:
    import torch

    from geolens.adapter import model_mode
    from geolens.checkpoint import json_default, model_fingerprint
    from geolens.commands._options import check_model_name, out_folder
    from geolens.errors import UsageError
    from geolens.faithfulness.multiple_choice import (
        CHECKPOINT,
        MCCheckpoint,
        differences,
        labelled,
        run_multiple_choice,
        seed_from_records,
    )
    from geolens.models import load_model
    from geolens.resume import ResumeRefused as ResumeError

    protocol, tasks, max_questions, settings = _settings(args)
    masks = bool(args.masks or protocol)
    if args.resume and not args.out:
        raise UsageError("--resume needs --out, the folder of the run")
    model_name = check_model_name(args.model, tiny=True)
    questions = _questions(tasks, max_questions)
    command = " ".join(["geolens"] + sys.argv[1:])
    resume = args.resume
    if protocol is not None and protocol.records and args.out and not args.resume:
        try:  # protocol 3's re-analysis: the stored records become the run's checkpoint (hash checked)
            seeded = seed_from_records(protocol, model_name, Path(args.out))
        except ValueError as err:
            raise UsageError(f"--protocol: {err}") from None
        if seeded:
            print(f"re-analysis: the per-question records of {seeded} (SHA-256 checked) are this run's checkpoint")
            resume = True
    try:  # a resumed checkpoint must agree with these settings: refused before the model loads
        checkpoint = MCCheckpoint.open(Path(args.out or ".") / CHECKPOINT, settings, resume=resume)
    except ResumeError as err:
        raise UsageError(str(err)) from None
    if resume != args.resume:
        args.resume = True  # the folder now holds the seeded checkpoint
    out = out_folder(args, "mc", resumable=True)
    checkpoint.path = out / CHECKPOINT
    checkpoint.commands.append(command)
    if args.resume and (checkpoint.clean or checkpoint.masked):
        print(f"resuming: {len(checkpoint.clean)} questions scored and {len(checkpoint.masked)} masked in {out}")
    torch.set_grad_enabled(False)
    t0 = time.time()
    model = load_model(model_name, compatibility_mode=args.compat)
    try:
        checkpoint.check_model(model_fingerprint(model))
        checkpoint.save()
        result = run_multiple_choice(
            model, questions, settings, masks=masks, checkpoint=checkpoint, chunk_size=args.chunk_size, progress=True
        )
    except ResumeError as err:
        raise UsageError(str(err)) from None
    diff = (
        differences(
            protocol,
            tasks=tasks,
            max_questions=max_questions,
            settings=settings,
            model=args.model,
            model_mode=model_mode(model),
            dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
        )
        if protocol
        else []
    )
    info = labelled(result.summary(), protocol, diff)
    info.update(
        model=args.model,
        model_mode=model_mode(model),
        masks=masks,
        commands=checkpoint.commands,
        seconds=round(time.time() - t0, 1),
    )
    _write(out / "mc_questions.csv", result.questions.to_csv(index=False, float_format="%.6g"))
    _write(out / "mc_summary.csv", result.tasks.to_csv(index=False, float_format="%.6g"))
    _write(out / "summary.json", json.dumps(info, indent=1, default=json_default))
    view = _plot(result.tasks)
    view.save(out / "mc_clean.png", dpi=args.dpi)
    view.close()
    _report(info, result)
    print(f"wrote {out}/ in {info['seconds']} s ({info['label']})")
    return 0


def _report(info: dict, result) -> None:
    import pandas as pd

    with pd.option_context("display.width", 200):
        print(result.tasks.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
        for t in info["excluded_tasks"]:
            print(
                f"excluded (at chance): {t['task']}, accuracy {t['accuracy']:.3f} [{t['ci_low']:.3f}, {t['ci_high']:.3f}], chance {t['chance']:.3f}, n = {t['n_questions']}"
            )
        if len(result.pairs):
            cols = ["a", "b", "estimate", "ci_low", "ci_high", "p", "p_adj", "verdict"]
            pairs = pd.DataFrame(info["pairs"])[cols]
            print(f"pairs (mean margin drop of b − a, {info['n_questions_masked']} questions; Holm family):")
            print(pairs.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    if info["label"] == "exploratory":
        print("exploratory run, no verdicts: " + "; ".join(info["differences"]))


def register(subparsers) -> None:
    from geolens.commands._names import DEFAULT_TASKS
    from geolens.commands._options import add_out, add_run_options, float_list, non_negative_int, positive_int

    p = subparsers.add_parser(
        "mc",
        help="multiple choice on the shipped BIG-bench tasks: clean accuracy, eligibility, masked margins and paired verdicts",
    )
    add_run_options(p, tiny=True, model="smollm2-135m")
    p.add_argument(
        "--protocol",
        default=None,
        metavar="PATH",
        help="run exactly the pre-registered protocol of this protocol.json (docs/faithfulness/protocol.json); refuses the options it fixes",
    )
    p.add_argument(
        "--tasks",
        default=None,
        help=f"comma-separated BIG-bench tasks, hf:<name> or .jsonl files (default {','.join(DEFAULT_TASKS)})",
    )
    p.add_argument(
        "--max-questions", type=non_negative_int, default=None, help="first N questions of each task (default 0: all)"
    )
    p.add_argument(
        "--normalize",
        choices=("mean", "sum"),
        default=None,
        help="choice score: mean per-token log-prob (default, choice-normalised) or summed (BIG-bench)",
    )
    p.add_argument(
        "--masks",
        action="store_true",
        help="also mask the eligible tasks and test the metric pairs (always on with --protocol)",
    )
    p.add_argument(
        "--layer-step",
        type=positive_int,
        default=None,
        help="with --masks: mask layers 0, N, 2N, ... one at a time (default 3)",
    )
    p.add_argument(
        "--fractions",
        type=float_list(0.0, 1.0, low_open=True),
        default=None,
        help="with --masks: k, the share of each query's terms removed (default 0.05,0.2)",
    )
    p.add_argument(
        "--n-boot", type=positive_int, default=None, help="bootstrap resamples over questions (default 2000)"
    )
    p.add_argument("--seed", type=non_negative_int, default=None, help="seed of the bootstrap draws (default 0)")
    p.add_argument(
        "--chunk-size",
        type=positive_int,
        default=16,
        help="masks per forward pass (memory only; results do not change)",
    )
    p.add_argument(
        "--resume", action="store_true", help="continue the run in --out from its checkpoint (same settings)"
    )
    p.add_argument("--dpi", type=int, default=90)
    p.add_argument(
        "--compat",
        action="store_true",
        help="TransformerLens compatibility mode: HookedTransformer numerics (folded norms, centred W_O, b_V folded into b_O); off by default",
    )
    add_out(p, resumable=True)
    p.set_defaults(func=run)
