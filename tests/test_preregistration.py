"""Pre-registered studies (geolens.preregistration) and resume that checks what it resumes (geolens.resume).

A run is "pre-registered" only when the protocol's text and JSON twin are the registered ones
(REGISTERED.json) and the run follows the protocol; otherwise it is "exploratory", names why, and
decides no pair. Every resumable run refuses, in one line and without a traceback, a progress
record or saved rows that do not add up (an edited count, a damaged gzip, another model).
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import make_tiny, random_corpus

from geolens.cli import main
from geolens.preregistration import NOT_DECIDED, load_protocol, preregistration, register, withhold_verdicts

ROOT = Path(__file__).resolve().parents[1]
FAITHFULNESS = ROOT / "docs" / "faithfulness"
FLOW = ROOT / "docs" / "flow"
DECIDING = ("holds", "reversed")


def copy_protocol(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for name in ("PROTOCOL.md", "protocol.json", "REGISTERED.json"):
        shutil.copy(src / name, dst / name)
    return dst / "protocol.json"


def edit_json(path: Path, change) -> None:
    spec = json.loads(path.read_text(encoding="utf-8"))
    change(spec)
    path.write_text(json.dumps(spec, indent=2), encoding="utf-8")


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


# ---------------------------------------------------------------------------------------------
# Registration: both hashes, and the run's own settings


REGISTERED = sorted(p.parent for p in (ROOT / "docs").rglob("REGISTERED.json"))


def test_every_registered_protocol_in_docs_is_checked():
    names = {str(f.relative_to(ROOT / "docs")) for f in REGISTERED}
    assert {"faithfulness", "faithfulness/v3", "faithfulness/v3/masking", "flow", "flow/v2", "flow/v3"} <= names


@pytest.mark.parametrize("folder", REGISTERED, ids=lambda f: str(f.relative_to(ROOT / "docs")))
def test_the_protocols_in_docs_are_registered_and_intact_copies_stay_pre_registered(folder, tmp_path):
    registered = json.loads((folder / "REGISTERED.json").read_text())
    if (folder / "PROTOCOL.sha256").exists():  # the first versions also froze the text in a file of its own
        assert registered["text_sha256"] == (folder / "PROTOCOL.sha256").read_text().strip()
    protocol = load_protocol(folder / "protocol.json")
    assert protocol.json_sha256 == registered["json_sha256"] and protocol.hash_reasons() == []
    copy = load_protocol(copy_protocol(folder, tmp_path / "copy"))
    record = preregistration(copy, [])
    assert record == dict(
        status="pre-registered", text_sha256=protocol.sha256, json_sha256=protocol.json_sha256, reasons=[]
    )


@pytest.mark.parametrize(
    "edit, words",
    [
        ("text", "PROTOCOL.md was edited after registration"),
        ("json whitespace", "protocol.json was edited after registration"),
        ("added model", "protocol.json was edited after registration"),
        ("n_documents", "protocol.json was edited after registration"),
        ("unregistered", "not registered"),
    ],
)
@pytest.mark.parametrize("folder", [FAITHFULNESS, FLOW])
def test_an_edited_protocol_is_exploratory_and_names_the_edit(folder, edit, words, tmp_path):
    path = copy_protocol(folder, tmp_path / "copy")
    if edit == "text":
        (path.parent / "PROTOCOL.md").write_text(
            (path.parent / "PROTOCOL.md").read_text() + "\nEdited.\n", encoding="utf-8"
        )
    elif edit == "json whitespace":  # the same settings, another file: the JSON alone is hashed too
        path.write_text(path.read_text() + "\n", encoding="utf-8")
    elif edit == "added model":
        edit_json(path, lambda s: s["data"]["models"].append("tiny-gqa"))
    elif edit == "n_documents":
        edit_json(path, lambda s: s["data"].update(n_documents=1))
    else:
        (path.parent / "REGISTERED.json").unlink()
    record = preregistration(load_protocol(path), ["model tiny-gqa is not one of the protocol's models"])
    assert record["status"] == "exploratory" and any(words in r for r in record["reasons"]), record
    assert record["reasons"][-1].startswith("model tiny-gqa")  # the run's own differences are named too
    assert len(record["text_sha256"]) == len(record["json_sha256"]) == 64


def test_withheld_verdicts_are_a_word_never_none():
    pairs = [dict(verdict=v, estimate=0.1) for v in ("holds", "reversed", "tie", None, "not testable")]
    out = withhold_verdicts(pairs)
    assert [p["verdict"] for p in out] == [NOT_DECIDED] * 4 + ["not testable"]
    assert all(p["estimate"] == 0.1 for p in out) and pairs[0]["verdict"] == "holds"  # a copy


def test_register_writes_both_hashes(tmp_path):
    path = copy_protocol(FLOW, tmp_path / "p")
    (path.parent / "REGISTERED.json").unlink()
    record = register(path, registered_at="2026-12-06", commit="abc")
    assert json.loads((path.parent / "REGISTERED.json").read_text()) == record
    assert preregistration(load_protocol(path), [])["status"] == "pre-registered"


# ---------------------------------------------------------------------------------------------
# The fault probe: a copy of the faithfulness protocol, text and JSON edited, run as a study


@pytest.fixture
def corpus(tmp_path):
    """A local corpus of two long documents (the TL 2.x environment has no gensim, hence no Lee)."""
    words = "the quick brown fox jumps over the lazy dog while seven wizards quietly judge boxing matches".split()
    docs = [" ".join(words[(k * d) % len(words)] for k in range(400)) for d in (1, 2)]
    path = tmp_path / "docs.txt"
    path.write_text("\n\n".join(docs))
    return str(path)


def faithfulness_args(protocol, corpus, out, *extra) -> list[str]:
    return [
        "faithfulness",
        "--protocol",
        str(protocol),
        "--model",
        "tiny-gqa",
        "--corpus",
        corpus,
        "--stage",
        "per_term",
        "--out",
        str(out),
        *extra,
    ]


def test_an_edited_faithfulness_protocol_runs_exploratory_with_no_verdicts(tmp_path, corpus, capsys):
    path = copy_protocol(FAITHFULNESS, tmp_path / "protocol")
    (path.parent / "PROTOCOL.md").write_text("# An edited protocol, version 2\n", encoding="utf-8")

    def shrink(spec):
        spec["data"].update(n_documents=1, models=spec["data"]["models"] + ["tiny-gqa"])
        spec["data"]["corpus"] = corpus

    edit_json(path, shrink)
    out = tmp_path / "run"
    assert main(faithfulness_args(path, corpus, out)) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    pre = summary["preregistration"]
    assert summary["label"] == pre["status"] == "exploratory"
    assert any("PROTOCOL.md was edited" in r for r in pre["reasons"])
    assert any("protocol.json was edited" in r for r in pre["reasons"])
    assert pre["text_sha256"] == summary["protocol_sha256"] and len(pre["json_sha256"]) == 64
    verdicts = [p["verdict"] for p in summary["pairs"] + summary["per_term_effects"].get("exploratory_pairs", [])]
    assert verdicts and not any(v in DECIDING or v is None for v in verdicts)
    assert "→ None" not in printed and f"→ {NOT_DECIDED}" in printed and "exploratory (" in printed
    readme = (out / "README.md").read_text()
    assert "(exploratory)" in readme and "Exploratory run, no verdicts" in readme and "| None |" not in readme


# ---------------------------------------------------------------------------------------------
# Resume refuses what does not add up: faithfulness stages


def _interrupt_at(monkeypatch, module, name: str, document: int, position: int = 2):
    """Patch ``module.name`` to raise KeyboardInterrupt when called for ``document`` (argument ``position``)."""
    real = getattr(module, name)

    def patched(*args, **kwargs):
        if args[position] == document:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, patched)
    return real


@pytest.fixture(scope="module")
def stage_template(tmp_path_factory):
    """A faithfulness per-term stage over 2 documents, killed after document 0 (run once, copied per test)."""
    import geolens.faithfulness.ground_truth as gt

    root = tmp_path_factory.mktemp("stage")
    words = "the quick brown fox jumps over the lazy dog while seven wizards quietly judge boxing matches".split()
    corpus = root / "docs.txt"
    corpus.write_text("\n\n".join(" ".join(words[(k * d) % len(words)] for k in range(400)) for d in (1, 2)))
    out = root / "run"
    args = faithfulness_args(FAITHFULNESS / "protocol.json", str(corpus), out, "--max-documents", "2")
    with pytest.MonkeyPatch.context() as patch:
        _interrupt_at(patch, gt, "ground_truth_document", 1)
        assert main(args) == 130
    progress = json.loads((out / "per_term_progress.json").read_text())
    assert (
        progress["documents_done"] == 1
        and progress["documents"] == [0]
        and set(progress["rows"])
        == {
            "rows",
            "positions",
        }
    )
    return out, args


@pytest.fixture
def interrupted_stage(stage_template, tmp_path, capsys):
    template, args = stage_template
    out = tmp_path / "run"
    shutil.copytree(template, out)
    capsys.readouterr()
    return out, [str(out) if a == str(template) else a for a in args]


def test_faithfulness_resume_refuses_an_edited_progress_record(interrupted_stage, capsys):
    out, args = interrupted_stage
    path = out / "per_term_progress.json"
    progress = json.loads(path.read_text())
    progress.update(documents_done=2, documents=[0, 1])  # "2 documents done", one document's rows
    path.write_text(json.dumps(progress))
    assert main(args + ["--resume"]) == 2
    err = one_line_error(capsys)
    assert "per_term" in err and "documents 1" in err and "--overwrite" in err
    progress.update(documents_done=2, documents=[0])  # the count alone edited
    path.write_text(json.dumps(progress))
    assert main(args + ["--resume"]) == 2
    assert "says 2 documents done" in one_line_error(capsys)
    assert not (out / "summary.json").exists()


def test_faithfulness_resume_refuses_a_legacy_record_that_does_not_match_its_rows(interrupted_stage, capsys):
    out, args = interrupted_stage
    path = out / "per_term_progress.json"
    progress = json.loads(path.read_text())
    for key in ("documents", "rows"):  # the format of the completed runs in docs/: no digests
        progress.pop(key)
    progress["documents_done"] = 2
    path.write_text(json.dumps(progress))
    assert main(args + ["--resume"]) == 2
    assert "the rows hold none of documents 1" in one_line_error(capsys)


@pytest.mark.parametrize("damage", ["truncated progress", "truncated rows", "edited rows", "missing rows"])
def test_faithfulness_resume_refuses_damaged_files(interrupted_stage, capsys, damage):
    out, args = interrupted_stage
    progress, rows = out / "per_term_progress.json", out / "per_term_rows.csv.gz"
    if damage == "truncated progress":
        progress.write_text(progress.read_text()[:40])
        word = "unreadable"
    elif damage == "truncated rows":
        rows.write_bytes(rows.read_bytes()[:100])
        word = "SHA-256 differs"
    elif damage == "edited rows":  # a valid gzip with other rows
        text = gzip.decompress(rows.read_bytes()).decode().splitlines()
        rows.write_bytes(gzip.compress(("\n".join(text[:-1]) + "\n").encode()))
        word = "SHA-256 differs"
    else:
        rows.unlink()
        word = "missing"
    assert main(args + ["--resume"]) == 2
    err = one_line_error(capsys)
    assert word in err and ("per_term_progress.json" in err or "per_term_rows.csv.gz" in err)


def test_faithfulness_resume_with_another_model_is_one_line(interrupted_stage, capsys):
    out, args = interrupted_stage
    other = [a if a != "tiny-gqa" else "tiny-mha" for a in args]
    assert main(other + ["--resume"]) == 2
    err = one_line_error(capsys)
    assert "other settings" in err and "model tiny-mha, not tiny-gqa" in err


def test_a_legacy_progress_record_that_matches_its_rows_still_resumes(interrupted_stage, capsys):
    out, args = interrupted_stage
    path = out / "per_term_progress.json"
    progress = json.loads(path.read_text())
    for key in ("documents", "rows"):
        progress.pop(key)
    path.write_text(json.dumps(progress))
    assert main(args + ["--resume"]) == 0
    assert "resuming after 1 documents" in capsys.readouterr().out
    assert json.loads(path.read_text())["documents"] == [0, 1]


# ---------------------------------------------------------------------------------------------
# Flow erasure


@pytest.fixture
def flow_protocol(tmp_path) -> Path:
    """docs/flow/protocol.json cut down for a tiny model, registered as such."""
    corpus = tmp_path / "docs.txt"
    corpus.write_text(
        "the river rose overnight and the bridge was closed.\n\na new library opened in the town centre today.\n\n"
        "farmers expect a late harvest after weeks of rain.\n",
        encoding="utf-8",
    )
    path = copy_protocol(FLOW, tmp_path / "flow")

    def small(p):
        p["data"].update(
            corpus=str(corpus), n_documents=2, min_documents=2, min_document_tokens=12, seq_len=12, models=["tiny-gqa"]
        )
        p["predictions"]["positions"] = [6, 11]
        p["methods"] = ["random", "contribution", "grad_x_input"]
        p["fractions"] = [0.1, 0.5]
        p["statistics"]["n_boot"] = 100
        p["induction_check"]["n_tokens"] = 6

    edit_json(path, small)
    return path


def test_flow_erasure_json_edit_alone_is_exploratory_and_resume_checks_its_rows(
    tmp_path, flow_protocol, monkeypatch, capsys
):
    import geolens.flow.erasure as fe

    out = tmp_path / "run"
    args = ["flow", "--erasure", "--protocol", str(flow_protocol), "--model", "tiny-gqa", "--out", str(out)]
    with monkeypatch.context() as patch:
        _interrupt_at(patch, fe, "measure_document", 1)
        assert main(args) == 130
    capsys.readouterr()
    path = out / "erasure_progress.json"
    progress = json.loads(path.read_text())
    path.write_text(json.dumps(dict(progress, documents_done=2, documents=[0, 1])))
    assert main(args + ["--resume"]) == 2
    err = one_line_error(capsys)
    assert "erasure" in err and "--overwrite" in err
    path.write_text(json.dumps(progress)[:-30])
    assert main(args + ["--resume"]) == 2
    assert "unreadable" in one_line_error(capsys)
    path.write_text(json.dumps(progress))
    assert main(args + ["--resume"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "exploratory" and any("protocol.json was edited" in r for r in s["differences"])
    assert s["preregistration"]["json_sha256"] and s["most_faithful"] == {
        "comprehensiveness": None,
        "sufficiency": None,
    }
    pairs = s["families"]["primary"]["pairs"]
    assert pairs and all(p["verdict"] in (NOT_DECIDED, "not testable") for p in pairs)
    printed = capsys.readouterr().out
    assert "exploratory (" in printed and NOT_DECIDED in printed
    # registered as it is now, the same run is pre-registered and decides its pairs
    register(flow_protocol, registered_at="2026-12-06")
    out2 = tmp_path / "registered"
    assert main(args[:-1] + [str(out2)]) == 0
    s2 = json.loads((out2 / "summary.json").read_text())
    mode = s2["model_mode"]
    assert s2["status"] == ("pre-registered" if mode == "bridge" else "exploratory")


# ---------------------------------------------------------------------------------------------
# Multiple choice


@pytest.fixture
def mc_run(tmp_path, capsys):
    rows = [
        dict(prompt="the cat sat on the", choices=["mat", "dog"]),
        dict(prompt="one two", choices=["three", "a"]),
        dict(prompt="we go", choices=["home", "now"]),
    ]
    tasks = []
    for name, answer in (("first", 0), ("second", 1)):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("\n".join(json.dumps(dict(r, answer=answer)) for r in rows))
        tasks.append(str(path))
    out = tmp_path / "mc"
    args = ["mc", "--model", "tiny-gqa", "--tasks", ",".join(tasks), "--n-boot", "50", "--out", str(out)]
    assert main(args) == 0
    capsys.readouterr()
    return out, args


@pytest.mark.parametrize("damage", ["record removed", "record edited", "truncated"])
def test_mc_resume_refuses_an_edited_or_damaged_checkpoint(mc_run, capsys, damage):
    out, args = mc_run
    path = out / "mc_checkpoint.json"
    data = json.loads(path.read_text())
    assert data["records"]["counts"]["clean"] == 6
    if damage == "record removed":
        data["clean"].pop(next(iter(data["clean"])))
        path.write_text(json.dumps(data))
    elif damage == "record edited":
        key = next(iter(data["clean"]))
        data["clean"][key]["margin"] = 99.0
        path.write_text(json.dumps(data))
    else:
        path.write_text(path.read_text()[:200])
    assert main(args + ["--resume"]) == 2
    err = one_line_error(capsys)
    assert "mc_checkpoint.json" in err and "--overwrite" in err


def test_mc_resume_with_another_model_is_one_line(mc_run, capsys):
    out, args = mc_run
    other = [a if a != "tiny-gqa" else "tiny-mha" for a in args]
    assert main(other + ["--resume"]) == 2
    assert "another model" in one_line_error(capsys)


# ---------------------------------------------------------------------------------------------
# Sink controls (the protocol's dose-matched controls, a 7-layer tiny model behind --model)

PARAGRAPHS = [
    "the cat sat on the mat and looked at the birds in the old tree by the river, then it slept in the sun until the evening came and the light went down.",
    "a dog ran far away over the hills, past the farms and the quiet roads, and came back at noon with a stick that was far too big for it to carry home!",
]


@pytest.fixture
def controls_run(tmp_path, monkeypatch, capsys):
    import geolens.models
    import geolens.sinks.controls_dose as controls

    model = make_tiny("gqa", n_layers=7)
    monkeypatch.setattr(geolens.models, "load_model", lambda name, compatibility_mode=False: model)
    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n\n".join(PARAGRAPHS), encoding="utf-8")
    out = tmp_path / "controls"
    args = ["sinks", "--controls-protocol", str(FAITHFULNESS / "protocol.json"), "--corpus", str(corpus)]
    args += ["--controls-documents", "1", "--n-boot", "50", "--out", str(out)]
    real, calls = controls.clean_log_probs, []

    def interrupt_at_second_window(model, window):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(model, window)

    with monkeypatch.context() as patch:
        patch.setattr(controls, "clean_log_probs", interrupt_at_second_window)
        assert main(args) == 130
    capsys.readouterr()
    return out, args


@pytest.mark.parametrize("damage", ["window added", "truncated"])
def test_sink_controls_resume_refuses_an_edited_or_damaged_checkpoint(controls_run, capsys, damage):
    out, args = controls_run
    path = out / "controls_checkpoint.json"
    data = json.loads(path.read_text())
    assert list(data["windows"]) == ["0"] and data["records"]["counts"] == {"windows": 1}
    if damage == "window added":  # as if two windows were done, with one window's numbers
        data["windows"]["1"] = data["windows"]["0"]
        path.write_text(json.dumps(data))
    else:
        path.write_text(path.read_text()[:100])
    assert main(args + ["--resume"]) == 2
    err = one_line_error(capsys)
    assert "controls_checkpoint.json" in err and "--overwrite" in err


# ---------------------------------------------------------------------------------------------
# Corpus checkpoints (run_corpus)


def test_corpus_checkpoint_refuses_an_edited_batch_index_or_a_damaged_file(tmp_path):
    from geolens.checkpoint import atomic_torch_save
    from geolens.errors import ResumeRefused
    from geolens.runner import run_corpus
    from geolens.sinks.norm_curve import NormCurve

    model = make_tiny("gqa")
    tokens = random_corpus(n=8, seq=10, seed=1)
    path = tmp_path / "ck.pt"
    analysis = lambda: NormCurve(model.cfg.n_layers, model.cfg.n_heads)  # noqa: E731
    run_corpus(model, tokens, [analysis()], batch_size=2, progress=False, checkpoint=path)
    saved = torch.load(path, weights_only=True)
    assert saved["next_batch"] == 4 and len(saved["digest"]) == 64
    atomic_torch_save(dict(saved, next_batch=2), path)  # "2 batches done" with 4 batches' states
    with pytest.raises(ResumeRefused, match="changed after it was saved"):
        run_corpus(model, tokens, [analysis()], batch_size=2, progress=False, checkpoint=path)
    path.write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(ResumeRefused, match="not a readable geolens checkpoint"):
        run_corpus(model, tokens, [analysis()], batch_size=2, progress=False, checkpoint=path)
    legacy = {k: v for k, v in saved.items() if k != "digest"}  # a checkpoint from before digests
    atomic_torch_save(legacy, path)
    run_corpus(model, tokens, [analysis()], batch_size=2, progress=False, checkpoint=path)
