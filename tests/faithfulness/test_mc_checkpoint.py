"""The checkpoint of a multiple-choice run (geolens.faithfulness.mc_checkpoint): question keys and
text digests, records kept once and refused when the question changed, a saved checkpoint reopened
with its records, and resuming refused under other settings, another model or an edited record."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from geolens.errors import ResumeRefused
from geolens.faithfulness.mc_checkpoint import MCCheckpoint, keep_record, question_key, question_sha
from geolens.multiple_choice import Question

Q = Question("the cat sat on the", ("mat", "sky"), 0, task="t1")


def _settings(**fingerprint):
    return SimpleNamespace(fingerprint=lambda: dict({"metrics": ["contribution"], "seed": 0}, **fingerprint))


def test_keys_and_digests_of_a_question():
    assert question_key(Q, 3) == "t1/3"
    sha = question_sha(Q)
    assert len(sha) == 16 and sha == question_sha(Question(Q.prompt, Q.choices, Q.answer, task="other"))
    assert sha != question_sha(Question(Q.prompt, Q.choices, 1, task="t1"))  # the answer is part of it
    assert sha != question_sha(Question(Q.prompt, ("mat", "dog"), 0, task="t1"))


def test_a_record_is_computed_once_and_refused_when_its_question_changed():
    store, calls = {}, []
    compute = lambda: calls.append(1) or {"margin": 0.5}
    record, new = keep_record(store, "t1/0", "abc", compute)
    assert new and record == {"margin": 0.5, "sha": "abc"} and store["t1/0"] is record
    again, new = keep_record(store, "t1/0", "abc", compute)
    assert not new and again is record and calls == [1]
    with pytest.raises(ResumeRefused, match="question t1/0 of the checkpoint is another question"):
        keep_record(store, "t1/0", "xyz", compute)


def test_a_saved_checkpoint_reopens_with_its_records(tmp_path):
    path = tmp_path / "mc_checkpoint.json"
    fresh = MCCheckpoint.open(path, _settings(), resume=False)
    assert fresh.clean == {} and fresh.settings == {"metrics": ["contribution"], "seed": 0}
    fresh.check_model({"name": "tiny-gqa", "weights_sha256": "1"})
    fresh.clean["t1/0"] = {"correct": 1, "sha": question_sha(Q)}
    fresh.masked["t1/0"] = {"scores": [0.1, 0.2], "sha": question_sha(Q)}
    fresh.save()
    back = MCCheckpoint.open(path, _settings(), resume=True)
    assert back.clean == fresh.clean and back.masked == fresh.masked and back.model == fresh.model
    assert MCCheckpoint.open(path, _settings(), resume=False).clean == {}  # without resume: a new run
    back.check_model({"name": "tiny-gqa", "weights_sha256": "1"})  # the same model: accepted
    with pytest.raises(ResumeRefused, match=r"another model \(tiny-gqa, weights 1\), not tiny-gemma"):
        back.check_model({"name": "tiny-gemma", "weights_sha256": "2"})


def test_resuming_under_other_settings_or_from_an_edited_record_is_refused(tmp_path):
    path = tmp_path / "mc_checkpoint.json"
    saved = MCCheckpoint.open(path, _settings(), resume=False)
    saved.clean["t1/0"] = {"correct": 1, "sha": "s"}
    saved.save()
    with pytest.raises(ResumeRefused, match="it was run with seed = 0, not 1"):
        MCCheckpoint.open(path, _settings(seed=1), resume=True)
    data = json.loads(path.read_text())
    data["clean"]["t1/0"]["correct"] = 0
    path.write_text(json.dumps(data))
    with pytest.raises(ResumeRefused, match="a record was edited"):
        MCCheckpoint.open(path, _settings(), resume=True)
    saved.save()  # intact records, another format
    data = json.loads(path.read_text())
    data["format"] = 99
    path.write_text(json.dumps(data))
    with pytest.raises(ResumeRefused, match="not a multiple-choice checkpoint"):
        MCCheckpoint.open(path, _settings(), resume=True)


def _weights(seed: int):
    import torch

    torch.manual_seed(seed)
    return torch.nn.Linear(3, 2)


def test_a_checkpoint_is_bound_to_its_weights_and_its_digests(tmp_path):
    """Other weights under the same model name, a record stripped of its digests: refused in one line."""
    path = tmp_path / "mc_checkpoint.json"
    saved = MCCheckpoint.open(path, _settings(), resume=False)
    saved.check_writer(_weights(0))
    saved.clean["t1/0"] = {"correct": 0, "sha": "s"}
    saved.save()
    back = MCCheckpoint.open(path, _settings(), resume=True)
    back.check_writer(_weights(0))  # the same weights: accepted
    with pytest.raises(ResumeRefused, match="mc_checkpoint.json: it was written by a model with other weights") as err:
        MCCheckpoint.open(path, _settings(), resume=True).check_writer(_weights(1))
    assert "\n" not in str(err.value) and "--overwrite" in str(err.value)
    data = json.loads(path.read_text())
    data["clean"]["t1/0"]["correct"] = 1  # accuracy 0.000 → 1.000, the digests and the writer dropped
    del data["records"], data["writer"]
    path.write_text(json.dumps(data))
    with pytest.raises(ResumeRefused, match="has no digests of its records"):
        MCCheckpoint.open(path, _settings(), resume=True)
    # records checked whole by a registered protocol's SHA-256 (protocol 3's re-analysis of records
    # saved before digests and writers were kept) are read; their model is checked by check_model
    seeded = MCCheckpoint.open(path, _settings(), resume=True, verified=True)
    seeded.check_writer(_weights(1))
    assert seeded.clean["t1/0"]["correct"] == 1 and seeded.writer["weights_fingerprint"]


def test_a_resume_under_another_geolens_version_is_carried_to_the_summary(tmp_path):
    import geolens
    from geolens.resume import versions_note

    path = tmp_path / "mc_checkpoint.json"
    saved = MCCheckpoint.open(path, _settings(), resume=False)
    saved.check_writer(_weights(0))
    saved.save()
    data = json.loads(path.read_text())
    data["writer"]["geolens_version"] = "0.0.1"
    path.write_text(json.dumps(data))
    back = MCCheckpoint.open(path, _settings(), resume=True)
    back.check_writer(_weights(0))
    back.save()
    step = f"0.0.1 → {geolens.__version__}"
    assert json.loads(path.read_text())["writer"]["resumed_across_versions"] == [step]
    assert versions_note(back.writer) == {"resumed_across_versions": [step]}
