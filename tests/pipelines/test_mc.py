"""The ``geolens mc`` run's pipeline (geolens.pipelines.mc) on the tiny GQA model: the questions it
reads (:func:`mc_questions`) and the files :func:`save_mc` writes, checked against a plain scoring
of the same questions (:func:`geolens.multiple_choice.score_questions`)."""

from __future__ import annotations

import json
import time

import numpy as np
import pandas as pd
import pytest
from conftest import make_tiny

from geolens.faithfulness.multiple_choice import CHECKPOINT, MCCheckpoint, MCSettings
from geolens.multiple_choice import Question, score_questions
from geolens.pipelines.mc import mc_questions, save_mc
from geolens.resume import ResumeRefused

QUESTIONS = [
    Question("the cat sat on the", ("mat", "dog"), 0, task="a"),
    Question("one two", ("three", "a"), 1, task="a"),
    Question("a dog ran", ("far", "cat", "b"), 2, task="b"),
    Question("we go", ("home", "now"), 0, task="b"),
    Question("it is", ("red", "blue", "old"), 1, task="b"),
]


def _jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def test_mc_questions_names_a_file_task_after_its_file_and_keeps_the_first_of_each(tmp_path):
    rows = [dict(prompt=f"q{i}", choices=["x", "y"], answer=i % 2) for i in range(3)]
    first, second = _jsonl(tmp_path / "first.jsonl", rows), _jsonl(tmp_path / "second.jsonl", rows[:1])
    qs = mc_questions([str(first), str(second)], max_questions=2)
    assert [(q.task, q.prompt, q.answer) for q in qs] == [("first", "q0", 0), ("first", "q1", 1), ("second", "q0", 0)]
    assert len(mc_questions([str(first)])) == 3  # 0: every question
    with pytest.raises(ValueError, match="task 'no_such_task_xyz'") as err:
        mc_questions(["no_such_task_xyz"])
    assert "\n" not in str(err.value)


def _run(model, out, *, resume: bool = False, model_name: str = "tiny-gqa"):
    settings = MCSettings(normalize="mean", n_boot=50, seed=0)
    checkpoint = MCCheckpoint.open(out / CHECKPOINT, settings, resume=resume)
    checkpoint.commands.append("geolens mc (test)")
    return save_mc(
        model,
        QUESTIONS,
        settings,
        out,
        checkpoint=checkpoint,
        protocol=None,
        tasks=["a", "b"],
        max_questions=0,
        model_name=model_name,
        masks=False,
        t0=time.time(),
        dpi=30,
    )


def test_save_mc_writes_the_plain_scores_and_an_exploratory_summary(tmp_path):
    model = make_tiny("gqa")
    result, info = _run(model, tmp_path)
    plain = score_questions(model, QUESTIONS, normalize="mean")
    per_q = pd.read_csv(tmp_path / "mc_questions.csv")
    assert list(per_q.task) == ["a", "a", "b", "b", "b"] and list(per_q.predicted) == list(plain.predicted)
    np.testing.assert_allclose(per_q.margin, plain.margin, rtol=1e-5, atol=1e-6)  # written at 6 significant digits
    tasks = pd.read_csv(tmp_path / "mc_summary.csv").set_index("task")
    for task, rows in plain.groupby("task"):
        assert tasks.loc[task, "accuracy"] == pytest.approx(rows.correct.mean())
        assert tasks.loc[task, "n_questions"] == len(rows)
    assert tasks.loc["b", "chance"] == pytest.approx((1 / 3 + 1 / 2 + 1 / 3) / 3, rel=1e-5)
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved == json.loads(json.dumps(info))  # what it returns is what it wrote
    assert info["label"] == "exploratory" and info["protocol_sha256"] is None and info["pairs"] == []
    assert info["model"] == "tiny-gqa" and info["masks"] is False and info["commands"] == ["geolens mc (test)"]
    assert info["n_questions_by_task"] == {"a": 2, "b": 3} and info["seconds"] >= 0
    assert (tmp_path / "mc_clean.png").stat().st_size > 0
    assert len(result.questions) == 5 and result.n_masked == 0


def test_save_mc_resumes_its_checkpoint_and_refuses_another_model(tmp_path):
    model = make_tiny("gqa")
    _, first = _run(model, tmp_path)
    checkpoint = json.loads((tmp_path / CHECKPOINT).read_text())
    assert checkpoint["model"]["name"] and len(checkpoint["clean"]) == len(QUESTIONS)
    _, again = _run(model, tmp_path, resume=True)  # every question from the checkpoint: the same summary
    assert {k: v for k, v in again.items() if k not in ("seconds", "commands")} == {
        k: v for k, v in first.items() if k not in ("seconds", "commands")
    }
    with pytest.raises(ResumeRefused, match="another model"):
        _run(make_tiny("gqa", seed=1), tmp_path, resume=True)
