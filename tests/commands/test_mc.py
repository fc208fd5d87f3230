"""``geolens mc`` end to end on tiny models (the real run is the lead's: docs/faithfulness/PROTOCOL.md §5)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from geolens.cli import build_parser, main

PROTOCOL = Path(__file__).resolve().parents[2] / "docs" / "faithfulness" / "protocol.json"
ROWS = [
    dict(prompt="the cat sat on the", choices=["mat", "dog"], answer=0),
    dict(prompt="one two", choices=["three", "a"], answer=0),
    dict(prompt="a dog ran", choices=["far", "cat", "b"], answer=2),
    dict(prompt="we go", choices=["home", "now"], answer=1),
]


def _jsonl(path: Path, rows) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


@pytest.fixture()
def tasks(tmp_path):
    """Two .jsonl tasks: ``sure`` (answers = tiny-gqa's own arg-max choice, accuracy 1: eligible) and
    ``wrong`` (every answer another choice, accuracy 0: excluded)."""
    from geolens.models import load_model
    from geolens.multiple_choice import load_questions, score_questions

    plain = _jsonl(tmp_path / "plain.jsonl", ROWS)
    predicted = score_questions(load_model("tiny-gqa"), load_questions(str(plain)), normalize="mean").predicted.tolist()
    sure = _jsonl(tmp_path / "sure.jsonl", [dict(r, answer=int(p)) for r, p in zip(ROWS, predicted)])
    wrong = _jsonl(
        tmp_path / "wrong.jsonl", [dict(r, answer=(int(p) + 1) % len(r["choices"])) for r, p in zip(ROWS, predicted)]
    )
    return sure, wrong


def test_mc_command_clean_scores_eligibility_and_summary(tmp_path, tasks):
    sure, wrong = tasks
    out = tmp_path / "mc"
    assert main(["mc", "--model", "tiny-gqa", "--tasks", f"{sure},{wrong}", "--n-boot", "200", "--out", str(out)]) == 0
    per_q = pd.read_csv(out / "mc_questions.csv")
    summary = pd.read_csv(out / "mc_summary.csv").set_index("task")
    assert len(per_q) == 8 and (out / "mc_clean.png").stat().st_size > 0 and (out / "mc_checkpoint.json").is_file()
    assert (
        list(summary.index) == ["sure", "wrong"]
        and summary.loc["sure", "eligible"]
        and not summary.loc["wrong", "eligible"]
    )
    assert summary.loc["sure", "accuracy"] == 1.0 and summary.loc["wrong", "accuracy"] == 0.0
    assert (per_q.margin > 0).eq(per_q.correct).all() and not any(
        c.startswith("margin:") for c in per_q
    )  # no --masks: clean only
    info = json.loads((out / "summary.json").read_text())
    assert (
        info["scoring"] == "choice_normalized_mean_logprob"
        and info["label"] == "exploratory"
        and info["protocol_sha256"] is None
    )
    assert info["n_questions_by_task"] == {"sure": 4, "wrong": 4} and info["pairs"] == []
    assert [
        (t["task"], t["n_questions"], t["accuracy"], t["ci_low"], t["ci_high"]) for t in info["excluded_tasks"]
    ] == [("wrong", 4, 0.0, 0.0, 0.0)]
    assert info["excluded_tasks"][0]["chance"] == pytest.approx((1 / 2 + 1 / 2 + 1 / 3 + 1 / 2) / 4)


def test_mc_command_masks_eligible_tasks_and_tests_the_pairs(tmp_path, tasks):
    sure, wrong = tasks
    out = tmp_path / "mc"
    argv = [
        "mc",
        "--model",
        "tiny-gqa",
        "--tasks",
        f"{sure},{wrong}",
        "--masks",
        "--layer-step",
        "1",
        "--fractions",
        "0.2,0.5",
        "--n-boot",
        "200",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    per_q = pd.read_csv(out / "mc_questions.csv")
    info = json.loads((out / "summary.json").read_text())
    assert info["layers"] == [0, 1] and info["fractions"] == [0.2, 0.5] and info["n_questions_masked"] == 4
    masked = [c for c in per_q if c.startswith("margin:")]
    assert len(masked) == 6 * 2 * 2 and per_q.loc[per_q.task == "wrong", masked].isna().all().all()
    assert per_q.loc[per_q.task == "sure", masked].notna().all().all()
    assert [(p["a"], p["b"]) for p in info["pairs"]] == [
        ("raw_attention", "value_weighted"),
        ("value_weighted", "output_normalized_intra"),
        ("output_normalized_inter", "contribution"),
        ("raw_attention", "contribution"),
        ("contribution", "contribution_abs"),
    ]
    for p in info["pairs"]:
        assert {"estimate", "ci_low", "ci_high", "level", "p", "p_adj", "holm_stopped_at"} <= set(p) and p[
            "n_questions_by_task"
        ] == {"sure": 4}
        assert p["verdict"] == "not decided (exploratory)"  # exploratory: no verdicts
    drop = per_q.loc[per_q.task == "sure", "margin_drop:contribution"]
    assert info["metric_drops"][4]["metric"] == "contribution" and info["metric_drops"][4][
        "margin_drop"
    ] == pytest.approx(drop.mean(), abs=1e-5)


def test_mc_command_protocol_runs_its_settings_and_records_the_hash(tmp_path, tasks):
    """--protocol takes every setting from protocol.json (here a copy whose task list is the two
    .jsonl tasks) and records the SHA-256 of the text next to it; a tiny model is a deviation."""
    import hashlib

    sure, wrong = tasks
    folder = tmp_path / "protocol"
    folder.mkdir()
    spec = json.loads(PROTOCOL.read_text())
    spec["multiple_choice"]["tasks"] = [str(sure), str(wrong)]
    spec["multiple_choice"]["n_boot"] = 200
    (folder / "protocol.json").write_text(json.dumps(spec))
    shutil.copy(PROTOCOL.parent / "PROTOCOL.md", folder / "PROTOCOL.md")
    shutil.copy(PROTOCOL.parent / "REGISTERED.json", folder / "REGISTERED.json")
    out = tmp_path / "mc"
    assert main(["mc", "--model", "tiny-gqa", "--protocol", str(folder / "protocol.json"), "--out", str(out)]) == 0
    info = json.loads((out / "summary.json").read_text())
    assert info["protocol_sha256"] == hashlib.sha256((PROTOCOL.parent / "PROTOCOL.md").read_bytes()).hexdigest()
    mode = (
        [] if info["model_mode"] == "bridge" else [f"model mode {info['model_mode']}, not bridge"]
    )  # TransformerLens 2: hooked
    edited = f"{folder / 'protocol.json'} was edited after registration"  # its task list differs
    assert info["differences"][0].startswith(edited) and info["differences"][1:] == sorted(
        ["model tiny-gqa is not one of the protocol's ['smollm2-135m', 'gemma3-270m']"] + mode
    )
    assert info["preregistration"]["status"] == "exploratory"
    assert info["preregistration"]["json_sha256"] == hashlib.sha256((folder / "protocol.json").read_bytes()).hexdigest()
    assert info["label"] == "exploratory" and info["pairs"][0]["verdict"] == "not decided (exploratory)"
    assert info["layers"] == [0] and info["fractions"] == [0.05, 0.2] and info["masks"] and info["n_boot"] == 200
    assert len(info["pairs"]) == 5 and [t["task"] for t in info["eligible_tasks"]] == ["sure"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--tasks", "no_such_task_xyz"], "no_such_task_xyz"),
        (["--max-questions", "-1"], "max-questions"),
        (["--tasks", ","], "no task"),
        (["--fractions", "0.1,0"], "fractions"),
        (["--fractions", "0.2,0.1"], "increasing"),
        (["--layer-step", "0"], "layer-step"),
        (["--protocol", str(PROTOCOL), "--seed", "3"], "--protocol fixes --seed"),
        (["--protocol", str(PROTOCOL), "--tasks", "general_knowledge", "--n-boot", "10"], "--tasks, --n-boot"),
        (["--protocol", str(PROTOCOL), "--compat"], "--compat"),
        (["--protocol", "no/such/protocol.json"], "no such file"),
        (["--resume"], "resume"),
        (["--model", "no-such-model"], "unknown model"),
    ],
)
def test_mc_command_bad_input(tmp_path, argv, message, capsys, monkeypatch):
    import geolens.models

    monkeypatch.setattr(
        geolens.models, "load_model", lambda *a, **k: pytest.fail("the model must not load on bad input")
    )
    out = [] if "--resume" in argv else ["--out", str(tmp_path / "out")]
    assert main(["mc"] + out + argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and err.startswith("geolens mc: error:"), err
    assert not (tmp_path / "out").exists()  # a usage error leaves nothing behind


def test_mc_command_defaults_are_the_protocol_settings():
    from geolens.commands.mc import _settings
    from geolens.faithfulness.multiple_choice import mc_protocol

    args = build_parser().parse_args(["mc"])
    protocol, tasks, max_questions, settings = _settings(args)
    assert protocol is None and tasks == [
        "general_knowledge",
        "hindu_knowledge",
        "disambiguation_qa",
        "causal_judgment",
    ]
    assert args.out is None and max_questions == 0  # geolens-runs/mc/<date-time>, never docs/
    p = mc_protocol(PROTOCOL)
    assert settings == p.settings and tasks == list(p.tasks) and not args.masks


def test_mc_command_resume_continues_from_the_checkpoint(tmp_path, tasks, monkeypatch, capsys):
    import geolens.faithfulness.multiple_choice as fmc

    sure, wrong = tasks
    out = tmp_path / "mc"
    argv = ["mc", "--model", "tiny-gqa", "--tasks", f"{sure},{wrong}", "--masks", "--n-boot", "100", "--out", str(out)]
    assert main(argv) == 0
    first = pd.read_csv(out / "mc_questions.csv")
    calls = []
    monkeypatch.setattr(fmc, "masked_scores", lambda *a, **k: calls.append(1))
    monkeypatch.setattr(fmc, "choice_logliks", lambda *a, **k: calls.append(1))
    assert main(argv + ["--resume"]) == 0
    assert calls == []  # every question came from the checkpoint
    pd.testing.assert_frame_equal(pd.read_csv(out / "mc_questions.csv"), first)
    assert len(json.loads((out / "summary.json").read_text())["commands"]) == 2
    capsys.readouterr()
    assert (
        main(argv[:-2] + ["--fractions", "0.5", "--out", str(out), "--resume"]) == 2
    )  # other settings: refused, in one line
    err = capsys.readouterr().err.strip()
    assert "fractions" in err and len(err.splitlines()) == 1
    monkeypatch.undo()
    other = ["--model", "tiny-mha" if argv[2] == "tiny-gqa" else "tiny-gqa"]
    assert main(argv[:1] + other + argv[3:] + ["--resume"]) == 2  # another model: refused once it is loaded
    err = capsys.readouterr().err.strip()
    assert "another model" in err and len(err.splitlines()) == 1
    pd.testing.assert_frame_equal(pd.read_csv(out / "mc_questions.csv"), first)  # the run's files are kept
