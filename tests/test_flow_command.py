"""``geolens flow "prompt"`` (issue #24 item 5): the top tokens per method, flow.html/flow.json
with --out (a complete run folder), nothing written without it, one-line usage errors (exit 2)
before the model loads."""

from __future__ import annotations

import json
import re

import pytest
import torch

from geolens.cli import main
from geolens.run_folder import require_complete

TEXT = "the cat sat on the mat"


def run_cli(argv, capsys):
    capsys.readouterr()
    rc = main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    return rc, out, [line for line in err.splitlines() if line.strip() and "%|" not in line and "it/s]" not in line]


@pytest.fixture
def no_model_load(monkeypatch):
    """Fails the test if the command tries to load a model (usage errors come first)."""
    import geolens.models

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the usage error")

    monkeypatch.setattr(geolens.models, "load_model", refuse)


def test_prints_the_top_tokens_of_each_method(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, out, err = run_cli(["flow", TEXT, "--model", "tiny-gqa", "--top-k", "3"], capsys)
    assert rc == 0, err
    for method in ("contribution", "alti", "attention_rollout"):
        assert f"  by {method}:" in out
    assert "by value_zeroing_rollout" not in out and "--value-zeroing" in out
    rows = re.findall(r"^    pos\s+(\d+) (.+?)\s+([0-9.]+)$", out, re.M)
    assert len(rows) == 9
    assert not (tmp_path / "geolens-runs").exists()  # nothing written without --out / --name

    # the listed shares are the flow row of the last position, largest first
    import geolens
    from geolens.flow import flow_names_filter

    model = geolens.load_model("tiny-gqa")
    tokens = model.to_tokens(TEXT, prepend_bos=True)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=flow_names_filter(model))
        R = geolens.contribution_flow(model, cache, "contribution")[0, -1]
    expected = torch.argsort(R, descending=True, stable=True)[:3].tolist()
    assert [int(p) for p, _, _ in rows[:3]] == expected
    assert [float(s) for _, _, s in rows[:3]] == pytest.approx([float(R[j]) for j in expected], abs=1e-4)


def test_out_writes_html_and_json_in_a_complete_folder(capsys, tmp_path):
    out_dir = tmp_path / "run"
    rc, out, err = run_cli(["flow", TEXT, "--model", "tiny-gqa", "--out", str(out_dir), "--threshold", "0.02",
                            "--method", "alti", "--value-zeroing", "--top-k", "2"], capsys)  # fmt: skip
    assert rc == 0, err
    assert "by value_zeroing_rollout" in out
    assert require_complete(out_dir) == out_dir
    record = json.loads((out_dir / "flow.json").read_text(encoding="utf-8"))
    assert record["parameters"] == {"top_k": 2, "threshold": 0.02, "method": "alti", "value_zeroing": True}
    assert set(record["flow"]) == {"contribution", "alti", "attention_rollout", "value_zeroing_rollout"}
    n = len(record["tokens"])
    assert all(len(row) == n and sum(row) == pytest.approx(1, abs=1e-4) for row in record["flow"].values())
    routes = record["routes"]
    assert routes["method"] == "alti" and routes["threshold"] == 0.02 and routes["position"] == n - 1
    page = (out_dir / "flow.html").read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and not re.search(r"https?://", page)
    assert len(re.findall(r'<circle class="gl-flow-node', page)) == len(routes["nodes"])


def test_name_uses_the_default_root(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, _, err = run_cli(["flow", TEXT, "--model", "tiny-mha", "--name", "first"], capsys)
    assert rc == 0, err
    folder = tmp_path / "geolens-runs" / "flow" / "first"
    assert require_complete(folder) == folder and (folder / "flow.html").is_file() and (folder / "flow.json").is_file()
    rc, _, err = run_cli(["flow", TEXT, "--model", "tiny-mha", "--name", "first"], capsys)  # already holds results
    assert rc == 2 and len(err) == 1 and "--overwrite" in err[0]


@pytest.mark.parametrize(
    "argv, words",
    [
        (["flow", "   "], ["empty"]),
        (["flow", TEXT, "--model", "no-such-model"], ["no-such-model", "tiny-gqa"]),
        (["flow", TEXT, "--top-k", "0"], ["--top-k"]),
        (["flow", TEXT, "--threshold", "1"], ["--threshold", "[0, 1)"]),
        (["flow", TEXT, "--threshold", "nan"], ["--threshold"]),
        (["flow", TEXT, "--method", "rollout"], ["--method", "attention_rollout"]),
        (["flow", TEXT, "--out", "x", "--name", "y"], ["--out or --name"]),
        (["flow", TEXT, "--bogus"], ["--bogus"]),
    ],
)
def test_bad_input_is_one_line_exit_2_before_the_model_loads(argv, words, capsys, no_model_load, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, _, err = run_cli(argv, capsys)
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("geolens flow: error:") or err[0].startswith("geolens: error:"), err
    for word in words:
        assert word in err[0], (word, err[0])
    assert not (tmp_path / "geolens-runs").exists() and not (tmp_path / "x").exists()


def test_out_on_a_file_is_one_line(capsys, tmp_path, no_model_load):
    path = tmp_path / "file"
    path.write_text("x")
    rc, _, err = run_cli(["flow", TEXT, "--out", str(path)], capsys)
    assert rc == 2 and len(err) == 1 and "not a folder" in err[0]

