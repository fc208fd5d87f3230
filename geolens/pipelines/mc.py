"""The ``geolens mc`` run (docs/faithfulness/PROTOCOL.md §5): multiple choice scored clean and,
with masks, under the per-layer masks of the pre-registered protocol
(:func:`geolens.faithfulness.multiple_choice.run_multiple_choice`), labelled pre-registered or
exploratory against a protocol, and the files it writes (:func:`save_mc`). The command only
parses options and prints (:mod:`geolens.pipelines.mc_text`).

Files under ``out``: ``mc_questions.csv`` (one row per question: clean choice scores, prediction,
margin; margins under every (metric, layer, k) mask and the mean margin drop per metric),
``mc_summary.csv`` (accuracy [95% CI] and chance per task, eligibility), ``summary.json`` (the
protocol's SHA-256 and label, pre-registered or exploratory, eligible and excluded tasks, the
pairs with p, p_adj, interval and verdict, question counts per task) and ``mc_clean.png``;
``mc_checkpoint.json`` (every question's record, saved as it is computed: a resumed run continues
from it) is the :class:`~geolens.faithfulness.multiple_choice.MCCheckpoint`'s.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Sequence

from geolens.adapter import model_mode
from geolens.checkpoint import atomic_write_bytes, json_default, model_fingerprint
from geolens.faithfulness.multiple_choice import (
    MCCheckpoint,
    MCProtocol,
    MCResult,
    MCSettings,
    differences,
    labelled,
    run_multiple_choice,
)
from geolens.multiple_choice import Question, load_questions
from geolens.resume import versions_note


def mc_questions(tasks: Sequence[str], max_questions: int = 0) -> list[Question]:
    """The questions of ``tasks`` in order, the first ``max_questions`` of each (0: all): each a
    shipped or installed BIG-bench task by its name, or what
    :func:`geolens.multiple_choice.load_questions` reads (``bigbench:``, ``hf:``, a ``.jsonl`` file,
    whose questions are then of the task named after the file). ValueError in one line naming the
    task that does not load.

    >>> [len(mc_questions(["general_knowledge", "hindu_knowledge"], 3))]
    [6]
    """
    questions = []
    for t in tasks:
        try:
            qs = load_questions(
                t if ":" in t or t.endswith(".jsonl") else f"bigbench:{t}", max_questions=max_questions or None
            )
        except (FileNotFoundError, ModuleNotFoundError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"task {t!r}: {type(e).__name__}: {e}") from e
        questions += [q if q.task else dataclasses.replace(q, task=Path(t).stem) for q in qs]
    return questions


def _write(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def save_mc(
    model,
    questions: Sequence[Question],
    settings: MCSettings,
    out: Path,
    *,
    checkpoint: MCCheckpoint,
    protocol: MCProtocol | None,
    tasks: Sequence[str],
    max_questions: int,
    model_name: str,
    masks: bool,
    t0: float,
    chunk_size: int = 16,
    dpi: int = 90,
) -> tuple[MCResult, dict]:
    """Multiple choice on ``questions`` (``tasks``, the first ``max_questions`` of each; 0: all),
    its records kept in ``checkpoint`` (which records the model, or refuses another one:
    :class:`~geolens.resume.ResumeRefused`), written under ``out`` (module docstring). The summary
    is :func:`~geolens.faithfulness.multiple_choice.labelled` against ``protocol`` (its
    :func:`~geolens.faithfulness.multiple_choice.differences` from this run) with the model
    (``model_name``), its mode, ``masks``, the checkpoint's commands and the seconds since ``t0``.
    Returns (the result, the summary)."""
    from geolens.viz.faithfulness import mc_clean_plot

    checkpoint.check_model(model_fingerprint(model))
    checkpoint.check_writer(model)  # the weights fingerprint: other weights at the same --model are refused
    checkpoint.save()
    result = run_multiple_choice(
        model, questions, settings, masks=masks, checkpoint=checkpoint, chunk_size=chunk_size, progress=True
    )
    diff = (
        differences(
            protocol,
            tasks=tasks,
            max_questions=max_questions,
            settings=settings,
            model=model_name,
            model_mode=model_mode(model),
            dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
        )
        if protocol
        else []
    )
    info = labelled(result.summary(), protocol, diff)
    info.update(
        model=model_name,
        model_mode=model_mode(model),
        masks=masks,
        commands=checkpoint.commands,
        seconds=round(time.time() - t0, 1),
        **versions_note(checkpoint.writer),  # resumed under another geolens version: said here
    )
    _write(out / "mc_questions.csv", result.questions.to_csv(index=False, float_format="%.6g"))
    _write(out / "mc_summary.csv", result.tasks.to_csv(index=False, float_format="%.6g"))
    _write(out / "summary.json", json.dumps(info, indent=1, default=json_default))
    view = mc_clean_plot(result.tasks)
    view.save(out / "mc_clean.png", dpi=dpi)
    view.close()
    return result, info
