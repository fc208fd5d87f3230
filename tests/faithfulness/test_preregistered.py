"""The pre-registered faithfulness protocol's data and run folder (geolens.faithfulness.preregistered):
PROTOCOL.md §1's windows built by hand on the character-level tiny tokenizer, the tables and JSON
written byte for byte the same twice, the earlier summary a stage run keeps, the not-testable pairs,
and run_stages: a stage the protocol does not register is refused before anything runs, and the
summary of the stages it runs (or kept from an earlier run) is assembled as documented."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

import geolens.faithfulness.preregistered as prereg
from geolens.errors import UsageError
from geolens.faithfulness.preregistered import (
    Preregistered,
    not_testable_pairs,
    previous_summary,
    protocol_windows,
    run_stages,
    write_json,
    write_table,
)
from geolens.resume import ResumeRefused
from geolens.testing import ALPHABET, SPECIALS, tiny_tokenizer

SHA = "ab" * 32


def _protocol(version: int = 2, **settings) -> Preregistered:
    data = dict(seq_len=5, min_document_tokens=4, n_documents=2)
    return Preregistered(dict(version=version, data=data) | settings, Path("protocol/protocol.json"), SHA)


def _ids(text: str) -> list[int]:
    """The tiny tokenizer by hand: one id per character, after the four special tokens."""
    return [len(SPECIALS) + ALPHABET.index(c) for c in text]


def test_protocol_windows_take_bos_and_the_first_tokens_of_each_long_enough_document():
    model = SimpleNamespace(tokenizer=tiny_tokenizer())
    texts = ["abc", "hello world", "xy", "wxyz", "later one"]  # 3, 11, 2, 4 (exactly enough), 9 tokens
    windows, sources = protocol_windows(model, _protocol(), texts)
    assert sources == [1, 3]  # corpus positions of the eligible documents, in corpus order
    assert windows.dtype == torch.long and windows.tolist() == [[0] + _ids("hell"), [0] + _ids("wxyz")]
    fewer, first = protocol_windows(model, _protocol(), texts, n_documents=1)
    assert first == [1] and fewer.tolist() == windows[:1].tolist()
    with pytest.raises(ValueError, match="the corpus has 3 documents of at least 4 tokens, fewer than the 4"):
        protocol_windows(model, _protocol(), texts, n_documents=4)


def test_write_table_gzips_without_a_timestamp_and_reads_back(tmp_path):
    frame = pd.DataFrame(dict(document=[0, 0, 1], metric=["raw", "contribution", "raw"], kl=[0.5, 1e-7, 2.25]))
    write_table(frame, tmp_path / "a.csv.gz")
    first = (tmp_path / "a.csv.gz").read_bytes()
    assert first[:2] == b"\x1f\x8b" and first[4:8] == b"\x00\x00\x00\x00"  # gzip, mtime 0
    write_table(frame, tmp_path / "a.csv.gz")
    assert (tmp_path / "a.csv.gz").read_bytes() == first  # the same table, the same bytes
    pd.testing.assert_frame_equal(pd.read_csv(io.BytesIO(gzip.decompress(first))), frame)
    write_table(frame, tmp_path / "a.csv")
    assert (tmp_path / "a.csv").read_text().splitlines() == [
        "document,metric,kl",
        "0,raw,0.5",
        "0,contribution,1e-07",
        "1,raw,2.25",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.csv", "a.csv.gz"]  # no temporary file left


def test_write_json_keeps_numpy_numbers_and_text_as_they_are(tmp_path):
    write_json(dict(n=np.int64(3), rho=np.float32(0.5), name="ρ ≥ 0"), tmp_path / "s.json")
    text = (tmp_path / "s.json").read_text(encoding="utf-8")
    assert json.loads(text) == dict(n=3, rho=0.5, name="ρ ≥ 0") and text.endswith("}\n") and "ρ ≥ 0" in text


def test_previous_summary_only_under_the_same_protocol_and_model(tmp_path):
    assert previous_summary(tmp_path, SHA, "tiny-gqa") == {}  # none yet
    saved = dict(protocol_sha256=SHA, model="tiny-gqa", masking=dict(pairs=[]))
    write_json(saved, tmp_path / "summary.json")
    assert previous_summary(tmp_path, SHA, "tiny-gqa") == saved
    assert previous_summary(tmp_path, "cd" * 32, "tiny-gqa") == {}  # another protocol text
    assert previous_summary(tmp_path, SHA, "tiny-mha") == {}  # another model
    (tmp_path / "summary.json").write_text("{truncated")
    with pytest.raises(ResumeRefused, match="unreadable"):
        previous_summary(tmp_path, SHA, "tiny-gqa")


def test_not_testable_pairs_carry_their_reason_and_scope():
    entries = [
        dict(pair=["value_weighted", "output_normalized_inter"], why="the same ranking", ranking_scope="query"),
        dict(pair=["a", "b"], why="identical masks"),
    ]
    assert not_testable_pairs(_protocol(not_testable_by_construction=entries)) == [
        dict(
            a="value_weighted",
            b="output_normalized_inter",
            ranking_scope="query",
            verdict="not testable",
            why="the same ranking",
        ),
        dict(a="a", b="b", ranking_scope="any", verdict="not testable", why="identical masks"),
    ]
    assert not_testable_pairs(_protocol()) == []


@pytest.fixture()
def stages(monkeypatch):
    """Stand-ins for the two endpoints: each returns its own pairs and records that it ran."""
    ran = []

    def stage(name):
        def run(model, windows, protocol, out, **options):
            ran.append(name)
            (out / f"{name}_progress.json").write_text(json.dumps(dict(seconds=1.5 if name == "per_term" else 2.5)))
            part = dict(pairs=[dict(a=name, b="x", verdict="holds")])
            return part | (dict(ceiling_check=dict(passed=True)) if name == "masking" else {})

        return run

    monkeypatch.setattr(prereg, "per_term_stage", stage("per_term"))
    monkeypatch.setattr(prereg, "masking_stage", stage("masking"))
    return ran


def _run(protocol, out, stage_names, *, resume=False):
    return run_stages(
        None,
        torch.zeros(2, 5, dtype=torch.long),
        protocol,
        out,
        stage_names,
        corpus="lee",
        model_name="tiny-gqa",
        resume=resume,
    )


@pytest.mark.parametrize(
    "settings, asked, registered",
    [
        (dict(version=3, stages=["masking"]), ["per_term"], "--stage masking"),  # protocol 3's masking addendum
        (dict(version=3), ["masking"], "--stage per_term"),  # protocol 3 registers its per-term endpoint only
        (dict(version=2, stages=["per_term"]), ["per_term", "masking"], "--stage per_term"),
    ],
)
def test_run_stages_refuses_a_stage_the_protocol_does_not_register(tmp_path, stages, settings, asked, registered):
    with pytest.raises(UsageError, match=f"use {registered}$") as err:
        _run(_protocol(**settings), tmp_path, asked)
    assert "\n" not in str(err.value) and stages == []  # refused before any stage ran


def test_run_stages_assembles_its_stages_and_keeps_an_earlier_one_on_resume(tmp_path, stages):
    protocol = _protocol(version=2, not_testable_by_construction=[dict(pair=["a", "b"], why="same")])
    first = _run(protocol, tmp_path, ["per_term"])
    assert stages == ["per_term"] and first["stages"] == dict(per_term="complete", masking="not run")
    assert [p["a"] for p in first["pairs"]] == ["per_term"] and "masking" not in first
    assert first["not_testable"][0]["verdict"] == "not testable" and first["stage_seconds"] == dict(per_term=1.5)
    write_json(dict(protocol_sha256=SHA, model="tiny-gqa", **first), tmp_path / "summary.json")
    second = _run(protocol, tmp_path, ["masking"], resume=True)  # the per-term endpoint kept from the first run
    assert stages == ["per_term", "masking"] and second["stages"] == dict(per_term="complete", masking="complete")
    assert second["per_term_effects"] == first["per_term_effects"] and second["ceiling_check"] == dict(passed=True)
    assert [p["a"] for p in second["pairs"]] == ["per_term", "masking"]
    assert second["stage_seconds"] == dict(per_term=1.5, masking=2.5)
    alone = _run(protocol, tmp_path, ["masking"])  # without --resume nothing earlier is kept
    assert alone["stages"]["per_term"] == "not run" and [p["a"] for p in alone["pairs"]] == ["masking"]
