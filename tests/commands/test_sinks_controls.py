"""``geolens sinks --controls-only`` end to end on a tiny model (the real run is in the README)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from conftest import make_tiny

from geolens.cli import main
from geolens.testing import tiny_tokens

TEXTS = ("the cat sat on the mat.", "a dog ran far away!!", "it is 42, or 7? no.", "one two three four")


@pytest.fixture()
def patched(monkeypatch):
    import geolens.data
    import geolens.models

    model = make_tiny("gqa")
    monkeypatch.setattr(geolens.models, "load_model", lambda name, compatibility_mode=False: model)
    monkeypatch.setattr(
        geolens.data, "corpus_windows", lambda m, corpus, seq_len, n: tiny_tokens(m, TEXTS[:n], length=seq_len)
    )
    return model


@pytest.mark.bridge_only
def test_controls_only_writes_tables_figure_and_summary(tmp_path, patched):
    out = tmp_path / "sinks"
    rc = main(
        [
            "sinks",
            "--controls-only",
            "--controls-sequences",
            "3",
            "--seq-len",
            "10",
            "--controls-layers",
            "all",
            "--controls-seeds",
            "0,1",
            "--n-boot",
            "200",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    for name in (
        "controls_conditions.csv",
        "controls_pairs.csv",
        "controls_scopes.csv",
        "controls_windows.csv",
        "controls.png",
    ):
        assert (out / name).stat().st_size > 0, name
    assert not (out / "geometry_heads.csv").exists()  # --controls-only skips the corpus pass
    cond = pd.read_csv(out / "controls_conditions.csv")
    assert set(cond.scope.astype(str)) == {"all", "0", "1"}
    assert (cond.n_windows == 3).all()
    s = json.loads((out / "controls_summary.json").read_text())
    assert s["n_windows"] == 3 and s["seq_len"] == 10 and s["layers"] == [0, 1]
    a = cond[cond.scope.astype(str) == "all"].set_index("edit")
    for row in s["all_layers"]:
        assert row["delta_ppl"] == pytest.approx(a.loc[row["edit"], "delta_ppl"], rel=1e-5)
    scopes = pd.read_csv(out / "controls_scopes.csv")
    assert s["claim_by_scope"] == dict(zip(scopes.scope.astype(str), scopes.claim))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--controls-layers", "7"], "out of range"),
        (["--controls-layers", "every:0"], "every:K"),
        (["--controls-layers", "x"], "--controls-layers"),
        (["--controls-sequences", "0"], "--controls-sequences"),
    ],
)
def test_bad_controls_arguments_are_one_line_errors(tmp_path, patched, argv, message, capsys):
    corpus = tmp_path / "docs.txt"  # a local corpus: the TL 2.x environment has no gensim (offline corpora)
    corpus.write_text("the cat sat on the mat. " * 50, encoding="utf-8")
    base = [
        "sinks",
        "--controls-only",
        "--controls-sequences",
        "2",
        "--seq-len",
        "10",
        "--corpus",
        str(corpus),
        "--out",
        str(tmp_path / "o"),
    ]
    assert main(base + argv) == 2  # the CLI convention: exit code 2, one line on stderr
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err


# ---------------------------------------------------------------------------------------------
# geolens sinks --controls-protocol: the dose-matched controls of PROTOCOL.md §6 on a tiny model

import hashlib  # noqa: E402
from pathlib import Path  # noqa: E402

PROTOCOL = Path(__file__).resolve().parents[2] / "docs" / "faithfulness" / "protocol.json"
PARAGRAPHS = [
    "the cat sat on the mat and looked at the birds in the old tree by the river, then it slept in the sun until the evening came and the light went down.",
    "too short.",
    "a dog ran far away over the hills, past the farms and the quiet roads, and came back at noon with a stick that was far too big for it to carry home!",
    "one two three four five six seven eight nine ten, eleven twelve thirteen fourteen fifteen sixteen, and then the counting stopped for a long while.",
    "big red boxes fly high over the town while the children laugh below, and the wind takes them further east, towards the sea and the grey boats there.",
]


@pytest.fixture()
def protocol_run(tmp_path, monkeypatch):
    """A local corpus, a 7-layer tiny model (edited layers 0 and 6) behind --model smollm2-135m, and a load counter."""
    import geolens.models

    model = make_tiny("gqa", n_layers=7)
    loads = []
    monkeypatch.setattr(
        geolens.models, "load_model", lambda name, compatibility_mode=False: loads.append(name) or model
    )
    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n\n".join(PARAGRAPHS), encoding="utf-8")
    base = [
        "sinks",
        "--controls-protocol",
        str(PROTOCOL),
        "--corpus",
        str(corpus),
        "--controls-documents",
        "1",
        "--n-boot",
        "200",
    ]
    return model, base, loads


def test_controls_protocol_writes_a_summary_that_recomputes_from_its_windows(tmp_path, protocol_run):
    from geolens.sinks.controls_dose import read_windows
    from geolens.sinks.controls_protocol import DoseProtocol
    from geolens.sinks.controls_summary import dose_summary

    model, base, _ = protocol_run
    out = tmp_path / "run"
    assert main(base + ["--out", str(out)]) == 0
    for name in (
        "controls_summary.json",
        "controls_windows.csv",
        "controls_dose_response.csv",
        "controls_verdicts.csv",
        "controls_sink_heads.csv",
    ):
        assert (out / name).stat().st_size > 0, name
    assert not (out / "controls_checkpoint.json").exists() and not (out / "geometry_heads.csv").exists()
    s = json.loads((out / "controls_summary.json").read_text())
    assert s["protocol_sha256"] == hashlib.sha256((PROTOCOL.parent / "PROTOCOL.md").read_bytes()).hexdigest()
    assert s["label"] == "exploratory" and s["verdicts"] is False and s["pre_registered_text"] is True
    assert any("n_documents 1 instead of 50" in r for r in s["differences"]) and any(
        "corpus" in r for r in s["differences"]
    )
    assert s["n_windows"] == 2 and s["n_documents"] == 1 and s["layers"] == [0, 6] and s["settings"]["seq_len"] == 64
    assert s["seeds"] == {"30": [0, 1, 2, 3, 4], "60": list(range(20)), "90": [0, 1, 2, 3, 4], "180": [0, 1, 2, 3, 4]}
    assert all(
        p["verdict"] in ("not decided (exploratory)", "not testable") for p in s["pairs"] + s["exploratory_pairs"]
    )
    for p in s["pairs"]:
        assert set(p) >= {"p", "p_adj", "ci_low", "ci_high", "level", "verdict", "n_windows", "n_documents", "n_seeds"}
    windows = read_windows(out / "controls_windows.csv")
    scopes = [x for x in ("all_heads", "sink_heads") if x not in s["not_testable"]]
    assert len(windows) == 2 * 39 * len(scopes) and sorted(set(windows.scope)) == scopes
    again = dose_summary(
        windows, DoseProtocol.from_dict(s["settings"]), verdicts=s["verdicts"], not_testable=s["not_testable"]
    )
    for key in ("dose_response", "pairs", "exploratory_pairs", "n_windows", "n_documents", "seeds"):
        assert again[key] == s[key], key  # exactly, from the saved table
    for row in s["dose_response"]:
        assert (
            row["n_windows"] == 2
            and row["n_documents"] == 1
            and row["n_seeds"] == (0 if row["edit"] == "scale" else len(s["seeds"][f"{row['degrees']:g}"]))
        )


def _interrupted(argv, monkeypatch) -> None:
    """Run ``argv`` with an interrupt (as Ctrl-C) when the second window starts; the patch is undone after."""
    import geolens.sinks.controls_dose as controls

    real, calls = controls.clean_log_probs, []

    def interrupt_at_second_window(model, window):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(model, window)

    with monkeypatch.context() as patch:
        patch.setattr(controls, "clean_log_probs", interrupt_at_second_window)
        assert main(argv) == 130


def test_controls_protocol_resumes_an_interrupted_run(tmp_path, protocol_run, monkeypatch):
    import geolens.sinks.controls_dose as controls

    model, base, _ = protocol_run
    assert main(base + ["--out", str(tmp_path / "whole")]) == 0
    part = tmp_path / "part"
    _interrupted(base + ["--out", str(part)], monkeypatch)
    assert (
        list(json.loads((part / "controls_checkpoint.json").read_text())["windows"]) == ["0"]
        and (part / "INCOMPLETE").exists()
    )
    real, calls = controls.clean_log_probs, []
    monkeypatch.setattr(controls, "clean_log_probs", lambda model, window: calls.append(1) or real(model, window))
    assert main(base + ["--out", str(part), "--resume"]) == 0
    assert len(calls) == 1  # only the window left
    whole, resumed = (
        pd.read_csv(tmp_path / "whole" / "controls_windows.csv"),
        pd.read_csv(part / "controls_windows.csv"),
    )
    pd.testing.assert_frame_equal(resumed, whole)
    s1, s2 = (json.loads((f / "controls_summary.json").read_text()) for f in (tmp_path / "whole", part))
    assert s1["dose_response"] == s2["dose_response"] and s1["pairs"] == s2["pairs"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--controls-protocol", "missing.json"], "no such file"),
        (["--controls-only", "--controls-sequences", "2"], "leave out --controls-only"),
        (["--seq-len", "64"], "--seq-len sets the corpus pass"),
        (["--resume"], "--resume needs --out"),
        (["--controls-documents", "0"], "must be at least 1"),
    ],
)
def test_bad_controls_protocol_arguments_are_one_line_errors_before_the_model_loads(
    protocol_run, argv, message, capsys
):
    _, base, loads = protocol_run
    if argv[0] == "--controls-protocol":
        base = [a for a in base if a != str(PROTOCOL)]
        base.remove("--controls-protocol")
    assert main(base + argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert loads == []


def test_bad_protocol_files_and_options_without_a_protocol(tmp_path, protocol_run, capsys):
    _, base, loads = protocol_run
    bad = tmp_path / "protocol.json"
    (tmp_path / "PROTOCOL.md").write_text("a protocol text")
    for text, message in (("{", "not valid JSON"), ('{"version": 2}', 'no "sink_controls" block')):
        bad.write_text(text)
        assert main(["sinks", "--controls-protocol", str(bad)]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1
    for argv in (["--resume"], ["--controls-documents", "3"], ["--controls-rows", "4"]):
        assert main(["sinks", "--controls-only", "--controls-sequences", "2"] + argv) == 2
        err = capsys.readouterr().err.strip()
        assert "only apply to --controls-protocol" in err and len(err.splitlines()) == 1
    assert loads == []
    # after the model loads: too few long documents, still one line and exit 2
    too_many = [a if a != "1" else "9" for a in base]
    assert main(too_many + ["--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "only 4 of 5 documents have at least 126 tokens; 9 are needed" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "o").exists()  # nothing written


def test_resume_refuses_a_checkpoint_of_another_run(tmp_path, protocol_run, monkeypatch, capsys):
    _, base, _ = protocol_run
    out = tmp_path / "part"
    _interrupted(base + ["--out", str(out)], monkeypatch)
    capsys.readouterr()
    other = [a if a != "200" else "300" for a in base]  # another --n-boot: another protocol
    assert main(other + ["--out", str(out), "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot resume from" in err and "was made with another protocol" in err and len(err.splitlines()) == 1
    assert "--overwrite" in err and "Traceback" not in err
