"""Resume that checks what it resumes (geolens.resume), on constructed stages and record files: a
resumed per-document stage measures only the documents not saved and gives the tables of an
uninterrupted run; every edit of saved work (a rows file, the settings, the documents named, a
record) is refused in one line naming the file; records files round-trip with their digest. Saved
work is bound to its content and its weights (issue #46): a record without digests is refused (read
only where git vouches for a finished published run), so is one of other weights or naming none,
and a resume under another geolens version goes on and says so."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import git, git_commit

from geolens.errors import ResumeRefused
from geolens.resume import (
    load_stage,
    read_json,
    read_records,
    records_digest,
    run_document_stage,
    sha256_bytes,
    write_records,
)

FINGERPRINT = {"model": "tiny-gqa", "protocol": "p1", "queries": [2, 6]}


def _measure(calls: list):
    def measure(d: int) -> dict:
        calls.append(d)
        return {"rows": pd.DataFrame(dict(document=[d, d], value=[d * 0.5, d * 0.25 + 1]))}

    return measure


def _run(out, n: int, calls: list, *, resume: bool, fingerprint=FINGERPRINT):
    return run_document_stage("demo", out, fingerprint, n, _measure(calls), resume=resume, progress=lambda line: None)


def test_a_resumed_stage_measures_only_what_was_not_saved(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    whole, calls = _run(tmp_path / "a", 4, [], resume=False), []
    _run(tmp_path / "b", 2, calls, resume=False)  # an interrupted run: two documents saved
    resumed = _run(tmp_path / "b", 4, calls, resume=True)
    assert calls == [0, 1, 2, 3]  # documents 0 and 1 were not measured again
    pd.testing.assert_frame_equal(resumed["rows"], whole["rows"])
    record = json.loads((tmp_path / "b" / "demo_progress.json").read_text())
    assert record["documents"] == [0, 1, 2, 3] and record["fingerprint"] == FINGERPRINT
    data = (tmp_path / "b" / "demo_rows.csv.gz").read_bytes()
    assert record["rows"]["rows"] == {"n_rows": 8, "sha256": sha256_bytes(data)}
    assert data == (tmp_path / "a" / "demo_rows.csv.gz").read_bytes()  # the same bytes as one run


def test_nothing_saved_is_an_empty_stage(tmp_path):
    assert load_stage("demo", tmp_path, FINGERPRINT) == ([], {}, 0.0)


@pytest.fixture
def saved(tmp_path):
    """A stage with documents 0 … 2 saved."""
    out = tmp_path / "run"
    out.mkdir()
    _run(out, 3, [], resume=False)
    return out


def test_other_settings_are_refused_naming_the_setting(saved):
    other = dict(FINGERPRINT, model="tiny-gemma")
    with pytest.raises(ResumeRefused, match=r"demo_progress\.json: it was written by a run with other settings.*model"):
        load_stage("demo", saved, other)


def test_an_edited_rows_file_is_refused(saved):
    path = saved / "demo_rows.csv.gz"
    frame = pd.read_csv(path)
    frame.loc[0, "value"] = 99.0
    frame.to_csv(path, index=False, compression={"method": "gzip", "mtime": 0})
    with pytest.raises(
        ResumeRefused, match=r"demo_rows\.csv\.gz: the rows file is not the one its progress record names"
    ):
        load_stage("demo", saved, FINGERPRINT)


def test_a_progress_record_naming_other_documents_is_refused(saved):
    path = saved / "demo_progress.json"
    record = json.loads(path.read_text())
    record["documents"] = [0, 2, 1]
    path.write_text(json.dumps(record))
    with pytest.raises(ResumeRefused, match="says 3 documents done but names documents 0, 2, 1"):
        load_stage("demo", saved, FINGERPRINT)


def test_rows_without_their_progress_record_are_refused(saved):
    (saved / "demo_progress.json").unlink()
    with pytest.raises(ResumeRefused, match="rows are saved but their progress record is missing"):
        load_stage("demo", saved, FINGERPRINT)


def test_a_damaged_or_foreign_json_record_is_refused(tmp_path):
    path = tmp_path / "p.json"
    path.write_text('{"documents_done": 2', encoding="utf-8")
    with pytest.raises(
        ResumeRefused, match=r"cannot resume from .*p\.json: its progress record is unreadable \(JSONDecodeError"
    ) as err:
        read_json(path)
    assert "\n" not in str(err.value) and "--overwrite" in str(err.value)
    path.write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(ResumeRefused, match="is not a JSON object"):
        read_json(path)


def test_records_digest_is_canonical():
    a = {"b": 1, "a": [1.5, None, "é"]}
    b = {"a": [np.float64(1.5), None, "é"], "b": np.int64(1)}
    text = json.dumps(a, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert records_digest(a) == records_digest(b) == sha256_bytes(text.encode("utf-8"))
    assert records_digest({"a": 1}) != records_digest({"a": 2})


def test_records_round_trip_and_every_edit_is_refused(tmp_path):
    path = tmp_path / "checkpoint.json"
    stores = {"questions": {"q1": {"score": 0.5}, "q2": {"score": 1.0}}, "tasks": {"t": [1, 2]}}
    write_records(path, {"version": 3}, stores)
    data = read_records(path, ("questions", "tasks"))
    assert data["version"] == 3 and data["questions"] == stores["questions"]
    assert data["records"]["counts"] == {"questions": 2, "tasks": 1}

    def edited(change) -> None:
        raw = json.loads(path.read_text())
        change(raw)
        path.write_text(json.dumps(raw))

    edited(lambda raw: raw["questions"]["q1"].update(score=0.75))
    with pytest.raises(ResumeRefused, match="a record was edited after it was saved"):
        read_records(path, ("questions", "tasks"))
    write_records(path, {"version": 3}, stores)
    edited(lambda raw: raw["questions"].update(q3={"score": 0.0}))
    with pytest.raises(ResumeRefused, match="it holds 3 questions records, its record says 2"):
        read_records(path, ("questions", "tasks"))
    write_records(path, {"version": 3}, stores)
    edited(lambda raw: raw.update(questions=[1, 2]))
    with pytest.raises(ResumeRefused, match="malformed \\(questions is not a set of records\\)"):
        read_records(path, ("questions", "tasks"))
    legacy = tmp_path / "legacy.json"  # from before digests were kept (or stripped of them): refused
    legacy.write_text(json.dumps({"questions": {"q1": {"score": 0.5}}}))
    with pytest.raises(ResumeRefused, match="legacy.json: its checkpoint has no digests of its records") as err:
        read_records(legacy, ("questions",))
    assert "\n" not in str(err.value) and "--overwrite" in str(err.value)


# ---------------------------------------------------------------------------------------------
# Bound to content (issue #46): no digests, other weights, another geolens version


def _model(seed: int = 0) -> torch.nn.Module:
    """A model of its own weights (what the weights fingerprint reads)."""
    torch.manual_seed(seed)
    return torch.nn.Linear(3, 2)


def _stage(out, n: int, *, resume: bool, model, calls=None):
    calls = [] if calls is None else calls
    return run_document_stage(
        "demo", out, FINGERPRINT, n, _measure(calls), resume=resume, progress=lambda line: None, model=model
    )


def _strip(path, *keys) -> dict:
    record = json.loads(path.read_text())
    for key in keys:
        record.pop(key)
    path.write_text(json.dumps(record))
    return record


def test_the_progress_record_names_its_weights_and_version(tmp_path):
    import geolens
    from geolens.validation import weights_fingerprint

    model = _model()
    _stage(tmp_path, 2, resume=False, model=model)
    writer = json.loads((tmp_path / "demo_progress.json").read_text())["writer"]
    assert writer == {"geolens_version": geolens.__version__, "weights_fingerprint": weights_fingerprint(model)}


def test_a_progress_record_without_digests_is_refused_even_when_its_rows_add_up(tmp_path):
    """The edit the issue found: digests dropped, numbers changed; no record is trusted as legacy."""
    model = _model()
    _stage(tmp_path, 3, resume=False, model=model)
    rows = tmp_path / "demo_rows.csv.gz"
    frame = pd.read_csv(rows)
    frame.loc[0, "value"] = 0.691  # an edited number
    frame.to_csv(rows, index=False, compression={"method": "gzip", "mtime": 0})
    _strip(tmp_path / "demo_progress.json", "rows", "documents")
    calls = []
    with pytest.raises(
        ResumeRefused, match="demo_progress.json: its progress record has no digests of its rows"
    ) as err:
        _stage(tmp_path, 4, resume=True, model=model, calls=calls)
    assert "\n" not in str(err.value) and "--overwrite" in str(err.value) and calls == []
    with pytest.raises(ResumeRefused, match="has no digests"):  # finished, but no git vouches for it
        load_stage("demo", tmp_path, FINGERPRINT, model=model)


def test_a_finished_record_without_digests_is_read_only_where_git_vouches_for_it(tmp_path):
    """A published run (docs/, committed): re-summarising it reads its record as it is; once a
    file changes, it is refused like any other."""
    model = _model()
    _stage(tmp_path, 3, resume=False, model=model)
    _strip(tmp_path / "demo_progress.json", "rows", "documents", "writer")
    git_commit(tmp_path, "a published run")
    documents, tables, _ = load_stage("demo", tmp_path, FINGERPRINT, model=model)
    assert documents == [0, 1, 2] and len(tables["rows"]) == 6
    rows = tmp_path / "demo_rows.csv.gz"
    frame = pd.read_csv(rows)
    frame.loc[0, "value"] = 0.691
    frame.to_csv(rows, index=False, compression={"method": "gzip", "mtime": 0})
    assert git(tmp_path, "status", "--porcelain") == "M demo_rows.csv.gz"
    with pytest.raises(ResumeRefused, match="has no digests of its rows"):
        load_stage("demo", tmp_path, FINGERPRINT, model=model)


def test_a_record_of_other_weights_is_refused_and_one_naming_none_too(tmp_path):
    _stage(tmp_path, 2, resume=False, model=_model(0))
    calls = []
    with pytest.raises(ResumeRefused, match="it was written by a model with other weights") as err:
        _stage(tmp_path, 4, resume=True, model=_model(1), calls=calls)
    assert "\n" not in str(err.value) and "--overwrite" in str(err.value) and calls == []
    _strip(tmp_path / "demo_progress.json", "writer")  # a record from before geolens kept its weights
    with pytest.raises(ResumeRefused, match="does not record the weights of the model that wrote it"):
        _stage(tmp_path, 4, resume=True, model=_model(0), calls=calls)
    assert calls == []


def test_a_resume_under_another_geolens_version_goes_on_and_says_so(tmp_path):
    import geolens
    from geolens.resume import versions_note

    model = _model()
    _stage(tmp_path, 2, resume=False, model=model)
    path = tmp_path / "demo_progress.json"
    record = json.loads(path.read_text())
    record["writer"]["geolens_version"] = "0.0.1"
    path.write_text(json.dumps(record))
    calls = []
    _stage(tmp_path, 3, resume=True, model=model, calls=calls)
    writer = json.loads(path.read_text())["writer"]
    step = f"0.0.1 → {geolens.__version__}"
    assert calls == [2] and writer["geolens_version"] == geolens.__version__
    assert writer["resumed_across_versions"] == [step]
    assert versions_note(writer) == {"resumed_across_versions": [step]}  # what the run's summary says
    _stage(tmp_path, 4, resume=True, model=model, calls=calls)  # again under this version: no new step
    assert json.loads(path.read_text())["writer"]["resumed_across_versions"] == [step]


DOCS = Path(__file__).resolve().parents[1] / "docs"


@pytest.mark.parametrize(
    "folder, stage",
    [
        ("faithfulness/smollm2-135m", "masking"),
        ("flow/v3/smollm2-135m", "erasure"),
        ("flow/v2/smollm2-135m", "erasure"),
    ],
)
def test_the_published_runs_are_read_for_re_summarising_and_an_unfinished_one_is_not_continued(folder, stage):
    """docs/ holds finished runs whose records predate the digests (protocol 2) or the writer (flow
    version 3): git vouches for them, so ``--resume`` re-summarises them (scripts/regenerate_check.py).
    The unfinished flow version 2 run (42 of 100 documents) is not continued: its record names no weights."""
    from geolens.preregistration import committed_unchanged

    out = DOCS / folder
    record = json.loads((out / f"{stage}_progress.json").read_text())
    files = [out / f"{stage}_progress.json"] + [out / f"{stage}_{t}.csv.gz" for t in record["tables"]]
    if not committed_unchanged(files):
        pytest.skip(f"{folder} is not the committed run here (not a git checkout, or edited)")
    assert "writer" not in record
    if record["documents_done"] < record["n_documents"]:
        with pytest.raises(ResumeRefused, match="does not record the weights of the model that wrote it"):
            load_stage(stage, out, record["fingerprint"], model=_model())
        return
    documents, tables, _ = load_stage(stage, out, record["fingerprint"], model=_model())
    assert documents == list(range(record["n_documents"])) and sorted(tables) == sorted(record["tables"])
