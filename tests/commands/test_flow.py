"""``geolens flow "prompt"``: the top tokens per method, flow.html/flow.json with --out (a
complete run folder), nothing written without it, one-line usage errors (exit 2) before the model
loads. ``geolens flow --erasure --protocol …`` on a tiny model under a small test protocol: the run
folder and its summary, the pre-registered / exploratory label, resuming after an interrupt (per
document, same tables as an uninterrupted run), and its usage errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import register_in_git

from geolens.cli import main
from geolens.run_folder import require_complete
from geolens.stats import VERDICTS

ROOT = Path(__file__).resolve().parents[2]

TEXT = "the cat sat on the mat"


def run_cli(argv, capsys):
    capsys.readouterr()
    rc = main([str(a) for a in argv])
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
    rc, out, err = run_cli(
        [
            "flow",
            TEXT,
            "--model",
            "tiny-gqa",
            "--out",
            str(out_dir),
            "--threshold",
            "0.02",
            "--method",
            "alti",
            "--value-zeroing",
            "--top-k",
            "2",
        ],
        capsys,
    )
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


# --- geolens flow --erasure ---------------------------------------------------------------------


@pytest.fixture
def protocol(tmp_path) -> Path:
    """docs/flow/protocol.json cut down for a tiny model (2 documents of 12 tokens from a local
    corpus, 2 predictions, 4 methods, 2 fractions, 200 resamples), beside its own text and hash."""
    p = json.loads((ROOT / "docs" / "flow" / "protocol.json").read_text(encoding="utf-8"))
    corpus = tmp_path / "docs.txt"  # a local corpus: the TL 2.x environment has no gensim (offline corpora)
    corpus.write_text(
        "the river rose overnight and the bridge was closed.\n\na new library opened in the town centre today.\n\n"
        "farmers expect a late harvest after weeks of rain.\n",
        encoding="utf-8",
    )
    p["data"].update(
        corpus=str(corpus), n_documents=2, min_documents=2, min_document_tokens=12, seq_len=12, models=["tiny-gqa"]
    )
    p["predictions"]["positions"] = [6, 11]
    p["methods"] = ["random", "attention_rollout", "contribution", "grad_x_input"]
    p["fractions"] = [0.1, 0.5]
    p["statistics"]["n_boot"] = 200
    p["induction_check"]["n_tokens"] = 6
    folder = tmp_path / "protocol"
    folder.mkdir()
    (folder / "protocol.json").write_text(json.dumps(p), encoding="utf-8")
    (folder / "PROTOCOL.md").write_text("# A test protocol, version 1\n", encoding="utf-8")
    register_in_git(folder / "protocol.json")  # committed, then REGISTERED.json: both hashes and that commit
    return folder / "protocol.json"


def test_a_run_writes_a_complete_folder_under_its_protocol(capsys, tmp_path, protocol):
    from geolens.adapter import model_mode
    from geolens.models import load_model
    from geolens.pipelines.flow import FlowRun

    out = tmp_path / "run"
    rc, text, err = run_cli(["flow", "--erasure", "--protocol", protocol, "--model", "tiny-gqa", "--out", out], capsys)
    assert rc == 0, err
    assert require_complete(out) == out
    for name in (
        "summary.json",
        "naopc.csv",
        "pairs.csv",
        "curves.csv",
        "induction.csv",
        "erasure_conditions.csv.gz",
        "erasure_progress.json",
    ):
        assert (out / name).is_file(), name
    s = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    mode = model_mode(load_model("tiny-gqa"))
    registered = json.loads((protocol.parent / "REGISTERED.json").read_text())
    assert s["protocol_sha256"] == registered["text_sha256"]
    assert s["preregistration"]["json_sha256"] == registered["json_sha256"]
    assert s["status"] == ("pre-registered" if mode == "bridge" else "exploratory") and "input-token erasure" in text
    assert s["n_documents"] == 2 and s["n_predictions"] == 4 and s["multiple_comparison"] == "holm"
    moved = s["replacement_differences"]  # each method's nAOPC difference between the replacements, no verdict
    assert (moved["primary"], moved["robustness"]) == ("space", "unigram") and all(
        "verdict" not in t for t in moved["tests"]
    )
    assert (out / "replacements.csv").is_file() == bool(moved["tests"])
    assert s["erasure_seconds"] == json.loads((out / "erasure_progress.json").read_text())["seconds"]
    assert s["settings"]["positions"] == [6, 11] and s["settings"]["n_boot"] == 200
    for family in ("primary", "robustness"):
        assert {m["method"] for m in s["families"][family]["methods"]} == {
            "random",
            "attention_rollout",
            "contribution",
            "grad_x_input",
        }
        decided = VERDICTS if s["status"] == "pre-registered" else ("not decided (exploratory)", "not testable")
        for p in s["families"][family]["pairs"]:
            assert p["verdict"] in decided and "p_adj" in p
    assert set(s["induction_check"]) == {"contribution", "alti", "attention_rollout", "value_zeroing_rollout"}
    assert len(s["curves"]) == 2 * 4 * 2 * 2 and {"fraction", "kl", "kl_low", "kl_high", "delta_p"} <= set(
        s["curves"][0]
    )
    assert "most faithful (comprehensiveness" in text
    conditions = pd.read_csv(out / "erasure_conditions.csv.gz")
    assert len(conditions) == 2 * 2 * 2 * (
        1 + 4 * 2 * 2
    )  # documents × predictions × replacements × (full + methods × directions × fractions)
    loaded = FlowRun.load(out)
    assert (
        loaded.status == s["status"]
        and loaded.summary["families"]["primary"]["n_predictions"] == s["families"]["primary"]["n_predictions"]
    )
    assert [p["verdict"] for p in loaded.summary["families"]["primary"]["pairs"]] == [
        p["verdict"] for p in s["families"]["primary"]["pairs"]
    ]
    readme = (out / "README.md").read_text(encoding="utf-8")  # the tables of summary.json, in words
    assert (
        readme.startswith("# Input-token erasure: tiny-gqa")
        and f"--protocol {protocol} --model tiny-gqa --out {out}" in readme
    )
    assert "Sample: 2 documents, 4 predictions" in readme and readme.count("\n| comprehensiveness |") == sum(
        p["direction"] == "comprehensiveness" for p in s["families"]["primary"]["pairs"]
    )
    first = s["families"]["primary"]["pairs"][0]
    assert (
        f"{first['delta']:+.4f} [{first['ci_low']:+.4f}, {first['ci_high']:+.4f}]" in readme
        and first["verdict"] in readme
    )
    for m in s["families"]["primary"]["methods"]:
        assert f"{m['naopc']:.3f} [{m['ci_low']:.3f}, {m['ci_high']:.3f}]" in readme


def test_a_version_3_run_writes_the_local_grids_line(capsys, tmp_path, protocol):
    """docs/flow/v3's integrated gradients (prefix-mean baseline, local grid) through the command: the
    folder is complete and its README states the gradients and forward passes."""
    p = json.loads(protocol.read_text(encoding="utf-8"))
    p["methods"] = ["random", "contribution", "integrated_gradients"]
    p["integrated_gradients"] = json.loads((ROOT / "docs/flow/v3/protocol.json").read_text(encoding="utf-8"))[
        "integrated_gradients"
    ]
    p["integrated_gradients"].update(steps=2)
    p["integrated_gradients"]["adaptive"].update(tolerance=1e-4, max_steps=40)
    protocol.write_text(json.dumps(p), encoding="utf-8")
    register_in_git(protocol)
    out = tmp_path / "run3"
    rc, text, err = run_cli(["flow", "--erasure", "--protocol", protocol, "--model", "tiny-gqa", "--out", out], capsys)
    assert rc == 0, err
    assert require_complete(out) == out
    ic = json.loads((out / "summary.json").read_text(encoding="utf-8"))["ig_completeness"]
    assert ic["grid"] == "local" and ic["max_steps_used"] <= 40 and ic["total_forward"] >= 0
    assert "Integrated gradients on the local grid (2 even steps" in (out / "README.md").read_text(encoding="utf-8")


def test_fewer_documents_make_an_exploratory_run(capsys, tmp_path, protocol):
    out = tmp_path / "small"
    rc, _, err = run_cli(
        ["flow", "--erasure", "--protocol", protocol, "--model", "tiny-gqa", "--out", out, "--n-documents", "1"], capsys
    )
    assert rc == 0, err
    s = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert s["status"] == "exploratory" and any("1 documents" in d for d in s["differences"])
    # a text that no longer matches its recorded hash is exploratory too
    (protocol.parent / "PROTOCOL.md").write_text("# A test protocol, version 1, edited\n", encoding="utf-8")
    rc, _, err = run_cli(
        ["flow", "--erasure", "--protocol", protocol, "--model", "tiny-gqa", "--out", tmp_path / "edited"], capsys
    )
    assert rc == 0, err
    s = json.loads((tmp_path / "edited" / "summary.json").read_text(encoding="utf-8"))
    assert s["status"] == "exploratory" and any("PROTOCOL.md was edited" in d for d in s["differences"])
    assert not any(p["verdict"] in ("holds", "reversed") for p in s["families"]["primary"]["pairs"])


def test_resume_continues_after_the_last_saved_document(capsys, tmp_path, protocol, monkeypatch):
    import geolens.flow.erasure as fe

    straight = tmp_path / "straight"
    rc, _, err = run_cli(
        ["flow", "--erasure", "--protocol", protocol, "--model", "tiny-gqa", "--out", straight], capsys
    )
    assert rc == 0, err
    real = fe.measure_document
    calls = []

    def interrupted(model, window, document, *args, **kwargs):
        calls.append(document)
        if document == 1:
            raise KeyboardInterrupt
        return real(model, window, document, *args, **kwargs)

    monkeypatch.setattr(fe, "measure_document", interrupted)
    out = tmp_path / "run"
    rc, _, err = run_cli(["flow", "--erasure", "--protocol", protocol, "--model", "tiny-gqa", "--out", out], capsys)
    assert rc == 130 and (out / "INCOMPLETE").exists() and not (out / "summary.json").exists()
    assert json.loads((out / "erasure_progress.json").read_text())["documents_done"] == 1
    first_seconds = json.loads((out / "erasure_progress.json").read_text())["seconds"]
    calls.clear()
    monkeypatch.setattr(fe, "measure_document", lambda *a, **k: (calls.append(a[2]), real(*a, **k))[1])
    rc, text, err = run_cli(
        ["flow", "--erasure", "--protocol", protocol, "--model", "tiny-gqa", "--out", out, "--resume"], capsys
    )
    assert rc == 0, err
    assert calls == [1] and "resuming after 1 documents" in text
    assert (
        json.loads((out / "summary.json").read_text())["erasure_seconds"] >= first_seconds
    )  # both invocations' compute time
    assert require_complete(out) == out
    pd.testing.assert_frame_equal(
        pd.read_csv(out / "erasure_conditions.csv.gz"), pd.read_csv(straight / "erasure_conditions.csv.gz")
    )
    a, b = (json.loads((f / "summary.json").read_text()) for f in (out, straight))
    for family in ("primary", "robustness"):  # the saved tables round-trip through CSV text: equal up to its last digit
        fa, fb = a["families"][family], b["families"][family]
        assert [p["verdict"] for p in fa["pairs"]] == [p["verdict"] for p in fb["pairs"]]
        assert [p["delta"] for p in fa["pairs"]] == pytest.approx(
            [p["delta"] for p in fb["pairs"]], rel=1e-9, abs=1e-12
        )
        assert [m["naopc"] for m in fa["methods"]] == pytest.approx(
            [m["naopc"] for m in fb["methods"]], rel=1e-9, abs=1e-12
        )
    # the same folder under other settings is refused, in one line
    rc, _, err = run_cli(
        [
            "flow",
            "--erasure",
            "--protocol",
            protocol,
            "--model",
            "tiny-gqa",
            "--out",
            out,
            "--resume",
            "--n-documents",
            "1",
        ],
        capsys,
    )
    assert rc == 2 and len(err) == 1 and "other settings" in err[0]


@pytest.mark.parametrize(
    "argv, words",
    [
        (["flow"], ["--erasure"]),
        (["flow", "--erasure"], ["--protocol"]),
        (["flow", "--erasure", "--protocol", "no/such/protocol.json"], ["no/such/protocol.json", "no such file"]),
        (
            ["flow", "--erasure", "--protocol", "docs/faithfulness/protocol.json"],
            ["not an input-token erasure protocol"],
        ),
        (["flow", "the cat", "--erasure", "--protocol", "docs/flow/protocol.json"], ["no prompt"]),
        (["flow", "--erasure", "--protocol", "docs/flow/protocol.json", "--resume"], ["--resume needs --out"]),
        (["flow", "--erasure", "--protocol", "docs/flow/protocol.json", "--n-documents", "0"], ["--n-documents"]),
        (["flow", "--erasure", "--protocol", "docs/flow/protocol.json", "--model", "no-such-model"], ["no-such-model"]),
        (["flow", "the cat", "--n-documents", "3"], ["--erasure"]),
        (["flow", "the cat", "--resume"], ["--erasure"]),
    ],
)
def test_erasure_bad_input_is_one_line_exit_2_before_the_model_loads(
    argv, words, capsys, no_model_load, tmp_path, monkeypatch
):
    monkeypatch.chdir(ROOT if any("docs/" in a for a in argv) else tmp_path)
    rc, _, err = run_cli(argv, capsys)
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("geolens flow: error:") or err[0].startswith("geolens: error:"), err
    for word in words:
        assert word in err[0], (word, err[0])
    assert not (tmp_path / "geolens-runs").exists()


def test_a_malformed_protocol_is_one_line(capsys, tmp_path, protocol, no_model_load):
    p = json.loads(protocol.read_text())
    del p["fractions"]
    protocol.write_text(json.dumps(p))
    rc, _, err = run_cli(["flow", "--erasure", "--protocol", protocol, "--out", tmp_path / "x"], capsys)
    assert rc == 2 and len(err) == 1 and "fractions" in err[0]
    assert not (tmp_path / "x").exists()
