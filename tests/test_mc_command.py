"""``geolens mc`` end to end on a tiny model (the real run is in the README)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from conftest import make_tiny

from geolens.cli import build_parser, main


@pytest.fixture()
def tiny_mc(monkeypatch, tmp_path):
    import geolens.models

    model = make_tiny("gqa")
    monkeypatch.setattr(geolens.models, "load_model", lambda name, compatibility_mode=False: model)
    path = tmp_path / "q.jsonl"
    rows = [dict(prompt="the cat sat on the", choices=["mat", "dog"], answer=0), dict(prompt="one two", choices=["three", "a"], answer=0),
            dict(prompt="a dog ran", choices=["far", "cat", "b"], answer=2)]  # fmt: skip
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return model, path


@pytest.mark.bridge_only
def test_mc_command_writes_per_question_and_summary(tmp_path, tiny_mc):
    model, path = tiny_mc
    out = tmp_path / "mc"
    rc = main(["mc", "--tasks", f"{path},general_knowledge", "--max-questions", "3", "--n-boot", "100", "--out", str(out)])
    assert rc == 0
    per_q = pd.read_csv(out / "mc_questions.csv")
    summary = pd.read_csv(out / "mc_summary.csv").set_index("task")
    assert len(per_q) == 6 and (out / "mc_clean.png").stat().st_size > 0
    assert summary.loc["all", "n_questions"] == 6
    assert summary.loc["all", "accuracy"] == pytest.approx(per_q.correct.mean(), abs=1e-5)  # CSV keeps 6 digits
    info = json.loads((out / "mc_summary.json").read_text())
    assert info["n_questions"] == 6 and info["summary"][-1]["task"] == "all"


@pytest.mark.parametrize("argv, message", [(["--tasks", "no_such_task_xyz"], "no_such_task_xyz"), (["--max-questions", "-1"], "max-questions"), (["--tasks", ","], "no task")])
def test_mc_command_bad_input(tmp_path, tiny_mc, argv, message, capsys):
    assert main(["mc", "--out", str(tmp_path / "out")] + argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and err.startswith("geolens mc: error:")
    assert not (tmp_path / "out").exists()  # a usage error leaves nothing behind


def test_mc_command_defaults_are_the_shipped_tasks():
    args = build_parser().parse_args(["mc"])
    assert args.tasks.split(",") == ["general_knowledge", "hindu_knowledge", "disambiguation_qa", "causal_judgment"]
    assert args.out is None and args.normalize == "sum"  # geolens-runs/mc/<date-time>, never docs/


@pytest.mark.bridge_only
def test_mc_command_resume_scores_only_new_tasks(tmp_path, tiny_mc, monkeypatch):
    model, path = tiny_mc
    out = tmp_path / "mc"
    assert main(["mc", "--tasks", str(path), "--n-boot", "50", "--out", str(out)]) == 0
    first = pd.read_csv(out / "mc_questions.csv")
    import geolens.multiple_choice as mc

    scored = []
    orig = mc.score_questions
    monkeypatch.setattr(mc, "score_questions", lambda m, qs, **k: scored.append(len(qs)) or orig(m, qs, **k))
    assert main(["mc", "--tasks", f"{path},general_knowledge", "--max-questions", "2", "--resume", "--n-boot", "50", "--out", str(out)]) == 0
    assert scored == [2]  # only the new task
    both = pd.read_csv(out / "mc_questions.csv")
    assert len(both) == len(first) + 2
    pd.testing.assert_frame_equal(both.iloc[: len(first)], first)
    info = json.loads((out / "mc_summary.json").read_text())
    assert info["n_questions"] == len(first) + 2 and len(info["commands"]) == 2
