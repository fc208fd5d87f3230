"""Resume that checks what it resumes (geolens.resume), on constructed stages and record files: a
resumed per-document stage measures only the documents not saved and gives the tables of an
uninterrupted run; every edit of saved work (a rows file, the settings, the documents named, a
record) is refused in one line naming the file; records files round-trip with their digest."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

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
    legacy = tmp_path / "legacy.json"  # from before digests were kept: read as it is
    legacy.write_text(json.dumps({"questions": {"q1": {"score": 0.5}}}))
    assert read_records(legacy, ("questions",)) == {"questions": {"q1": {"score": 0.5}}}
