"""``geolens mc``: multiple choice on the shipped BIG-bench tasks, clean and under the protocol's masks.

Scores every question by choice-normalised log-likelihood (each choice's mean per-token
log-probability given the prompt; ``--normalize sum`` for the summed BIG-bench score), decides
which tasks are above chance (clean accuracy's 95% bootstrap CI over questions entirely above
the mean of 1/#choices) and, with ``--masks``, masks the eligible tasks one layer at a time and
tests the metric pairs in one Holm family (:mod:`geolens.faithfulness.multiple_choice`,
docs/faithfulness/PROTOCOL.md §5). ``--protocol docs/faithfulness/protocol.json`` runs exactly the
pre-registered settings and refuses the options that would change them. The run and its files
under ``--out`` (``--resume`` continues from its checkpoint) are :mod:`geolens.pipelines.mc`'s,
the printed text :mod:`geolens.pipelines.mc_text`'s.

Example (offline)::

    geolens mc --protocol docs/faithfulness/protocol.json --out runs/mc-smollm2
"""

from __future__ import annotations

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


def _settings(args):
    """(protocol or None, tasks, max_questions, MCSettings) from the options; UsageError on conflicts."""
    from geolens.errors import UsageError
    from geolens.faithfulness.multiple_choice import DEFAULT_PAIRS, MCSettings, mc_protocol
    from geolens.multiple_choice import DEFAULT_TASKS

    if args.protocol:
        given = [option for attr, option, _ in FIXED if getattr(args, attr) is not None]
        given += ["--compat"] if args.compat else []
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


def run(args) -> int:
    from geolens.commands._options import check_model_name, load_run_model, out_folder
    from geolens.errors import UsageError
    from geolens.faithfulness.multiple_choice import CHECKPOINT, MCCheckpoint, seed_from_records
    from geolens.pipelines.mc import mc_questions, save_mc
    from geolens.pipelines.mc_text import mc_text
    from geolens.resume import ResumeRefused as ResumeError

    protocol, tasks, max_questions, settings = _settings(args)
    masks = bool(args.masks or protocol)
    if args.resume and not args.out:
        raise UsageError("--resume needs --out, the folder of the run")
    model_name = check_model_name(args.model, tiny=True)
    try:
        questions = mc_questions(tasks, max_questions)
    except ValueError as err:
        raise UsageError(f"--tasks: {err}") from err
    command = " ".join(["geolens"] + sys.argv[1:])
    resume, seeded = args.resume, None
    if protocol is not None and protocol.records and args.out and not args.resume:
        try:  # protocol 3's re-analysis: the stored records become the run's checkpoint (hash checked)
            seeded = seed_from_records(protocol, model_name, Path(args.out))
        except ValueError as err:
            raise UsageError(f"--protocol: {err}") from None
        if seeded:
            print(f"re-analysis: the per-question records of {seeded} (SHA-256 checked) are this run's checkpoint")
            resume = True
    try:  # a resumed checkpoint must agree with these settings: refused before the model loads
        checkpoint = MCCheckpoint.open(
            Path(args.out or ".") / CHECKPOINT, settings, resume=resume, verified=bool(seeded)
        )
    except ResumeError as err:
        raise UsageError(str(err)) from None
    if resume != args.resume:
        args.resume = True  # the folder now holds the seeded checkpoint
    out = out_folder(args, "mc", resumable=True)
    checkpoint.path = out / CHECKPOINT
    checkpoint.commands.append(command)
    if args.resume and (checkpoint.clean or checkpoint.masked):
        print(f"resuming: {len(checkpoint.clean)} questions scored and {len(checkpoint.masked)} masked in {out}")
    t0 = time.time()
    model = load_run_model(args, model_name)
    run = dict(protocol=protocol, tasks=tasks, max_questions=max_questions, model_name=args.model, masks=masks)
    run.update(t0=t0, chunk_size=args.chunk_size, dpi=args.dpi)
    try:
        result, info = save_mc(model, questions, settings, out, checkpoint=checkpoint, **run)
    except ResumeError as err:
        raise UsageError(str(err)) from None
    print(mc_text(info, result))
    print(f"wrote {out}/ in {info['seconds']} s ({info['label']})")
    return 0


def register(subparsers) -> None:
    from geolens.commands._names import DEFAULT_TASKS
    from geolens.commands._options import (
        add_compat,
        add_out,
        add_run_options,
        float_list,
        non_negative_int,
        positive_int,
    )

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
    add_compat(p)
    add_out(p, resumable=True)
    p.set_defaults(func=run)
