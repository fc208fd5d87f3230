"""geolens.files.read_json and the loaders that read JSON through it (a protocol's twin, a report)."""

from __future__ import annotations

import json

import pytest

from geolens.faithfulness.preregistered import load_protocol
from geolens.files import read_json
from geolens.report.compare import load_report


def test_read_json_returns_the_parsed_value(tmp_path):
    value = {"a": [1, 2.5, None], "b": {"c": "é"}}
    (tmp_path / "v.json").write_text(json.dumps(value, ensure_ascii=False), encoding="utf-8")
    assert read_json(tmp_path / "v.json", "value") == value
    (tmp_path / "list.json").write_text("[3, 4]")
    assert read_json(str(tmp_path / "list.json"), "value") == [3, 4]


def test_read_json_error_is_one_line_naming_the_file_and_the_line(tmp_path):
    (tmp_path / "bad.json").write_text('{\n  "a": 1,\n  "b": \n}\n')
    with pytest.raises(ValueError) as err:
        read_json(tmp_path / "bad.json", "the settings")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("the settings: not valid JSON (")
    assert message.endswith(", line 4)")  # the parser stops at the closing brace after "b":
    assert err.value.__cause__ is None and err.value.__suppress_context__


def test_read_json_leaves_a_missing_file_to_the_caller(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_json(tmp_path / "missing.json", "x")


def test_load_protocol_reads_its_twin_and_refuses_a_broken_one(tmp_path):
    (tmp_path / "PROTOCOL.md").write_text("# a protocol\n")
    twin = tmp_path / "protocol.json"
    twin.write_text('{"version": 3}')
    assert load_protocol(twin).version == 3
    twin.write_text('{"version": 3,}')
    with pytest.raises(ValueError, match=r"^protocol .*protocol\.json: not valid JSON \(.*, line 1\)$"):
        load_protocol(twin)


def test_load_report_refuses_a_file_that_is_not_json(tmp_path):
    (tmp_path / "report.json").write_text("{\n nope")
    with pytest.raises(ValueError, match=r"report\.json: not valid JSON \(.*, line 2\)$"):
        load_report(tmp_path)


def test_file_sha256_is_the_hash_of_the_bytes_read_in_chunks(tmp_path):
    import hashlib

    from geolens.files import file_sha256

    data = bytes(range(256)) * 5000  # over 1 MiB: more than one chunk
    (tmp_path / "f").write_bytes(data)
    (tmp_path / "empty").write_bytes(b"")
    assert file_sha256(tmp_path / "f") == hashlib.sha256(data).hexdigest()
    assert file_sha256(str(tmp_path / "empty")) == hashlib.sha256(b"").hexdigest()
