"""CLI user errors: one line on stderr, exit code 2, no traceback, before the model loads.

Every test runs ``geolens.cli.main`` in-process with the model loaders replaced by a function that
raises: a test that reaches the model fails, so "before the model loads" is asserted without any
timing. Layer indices need the model's layer count: they are checked right after loading (a tiny
model), before any corpus work (``corpus_windows`` replaced by a function that raises).
"""

from __future__ import annotations

import pytest
from conftest import make_tiny

import geolens.data
import geolens.models
from geolens.cli import main

COMMANDS_WITH_CORPUS = ["sinks", "report", "pruning", "faithfulness"]  # --corpus
COMMANDS_WITH_CORPORA = ["taxonomy", "selection"]  # --corpora
ALL = COMMANDS_WITH_CORPUS + COMMANDS_WITH_CORPORA


class ModelLoaded(Exception):
    """Raised by the replaced model loaders: the command got past its validation."""


class CorpusWorkStarted(Exception):
    """Raised by the replaced ``corpus_windows``: the command started on the corpus."""


@pytest.fixture(autouse=True)
def no_model(monkeypatch):
    def refuse(*args, **kwargs):
        raise ModelLoaded(f"the model was loaded ({args}, {kwargs})")

    monkeypatch.setattr(geolens.models, "load_model", refuse)


@pytest.fixture
def tiny_model(monkeypatch):
    """The loaders return a tiny 2-layer model; corpus work raises."""
    model = make_tiny("gqa")

    def corpus(*args, **kwargs):
        raise CorpusWorkStarted

    monkeypatch.setattr(geolens.models, "load_model", lambda *a, **k: model)
    monkeypatch.setattr(geolens.data, "corpus_windows", corpus)
    return model


def usage_error(argv: list[str], capsys, *needles: str) -> str:
    """Run the CLI, expect exit code 2 and one line ``geolens <command>: error: ...``."""
    capsys.readouterr()
    rc = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2, (rc, err)
    assert len(lines) == 1, err
    assert lines[0].startswith(f"geolens {argv[0]}: error: "), lines[0]
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def corpus_args(command: str, corpus: str) -> list[str]:
    return ["--corpora", corpus] if command in COMMANDS_WITH_CORPORA else ["--corpus", corpus]


@pytest.fixture
def out(tmp_path):
    return str(tmp_path / "out")


@pytest.fixture
def docs(tmp_path):
    """A small local corpus file (the offline corpora need the gensim wheel, absent in .venvs/tl2)."""
    path = tmp_path / "docs.txt"
    path.write_text("The first document.\n\nThe second one, a bit longer.\n", encoding="utf-8")
    return str(path)


# --- corpora ------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ALL)
def test_missing_corpus_file(command, capsys, tmp_path, out):
    missing = str(tmp_path / "nowhere.txt")
    usage_error([command, *corpus_args(command, missing), "--out", out], capsys, "nowhere.txt")


@pytest.mark.parametrize("command", ALL)
def test_empty_corpus_file(command, capsys, tmp_path, out):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n", encoding="utf-8")
    usage_error([command, *corpus_args(command, str(empty)), "--out", out], capsys, "empty.txt", "no documents")


@pytest.mark.parametrize("command", ["sinks", "taxonomy"])
def test_binary_corpus_file(command, capsys, tmp_path, out):
    blob = tmp_path / "weights.bin"
    blob.write_bytes(bytes(range(256)) * 8)
    usage_error([command, *corpus_args(command, str(blob)), "--out", out], capsys, "weights.bin", "binary")
    latin = tmp_path / "latin.txt"
    latin.write_bytes("caf\xe9 au lait".encode("latin-1"))
    usage_error([command, *corpus_args(command, str(latin)), "--out", out], capsys, "latin.txt", "not UTF-8")


def test_jsonl_corpus_without_text(capsys, tmp_path, out):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"text": "fine"}\n{"body": "no text field"}\n', encoding="utf-8")
    usage_error(["report", "--corpus", str(rows), "--out", out], capsys, "rows.jsonl", "line 2", '"text"')
    rows.write_text('{"text": "fine"}\nnot json\n', encoding="utf-8")
    usage_error(["sinks", "--corpus", str(rows), "--out", out], capsys, "line 2", "not JSON")


def test_corpus_folder(capsys, tmp_path, out):
    usage_error(["sinks", "--corpus", str(tmp_path), "--out", out], capsys, "is a folder")


# --- numbers ------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ALL)
def test_seq_len_below_two(command, capsys, out):
    usage_error([command, "--seq-len", "0", "--out", out], capsys, "--seq-len", "at least 2")


@pytest.mark.parametrize("command", ["sinks", "report", "pruning", "taxonomy", "selection"])
def test_batch_size_zero(command, capsys, out):
    usage_error([command, "--batch-size", "0", "--out", out], capsys, "--batch-size", "at least 1")


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["analyze", "some text", "--top", "-1"], "--top"),
        (["analyze", "some text", "--top", "0"], "--top"),
        (["report", "--n-sequences", "abc"], "--n-sequences"),
        (["report", "--n-heldout", "0"], "--n-heldout"),
        (["sinks", "--lambdas", "1,x"], "--lambdas"),
        (["sinks", "--eps", "1.5"], "--eps"),
        (["sinks", "--drift-layers", "1,a"], "--drift-layers"),
        (["faithfulness", "--fractions", "0.5,2"], "--fractions"),
        (["faithfulness", "--layers", "3x"], "--layers"),
        (["pruning", "--retention", "0,0.5"], "--retention"),
        (["pruning", "--seeds", "1.5"], "--seeds"),
        (["selection", "--nstar-sizes", "0,4"], "--nstar-sizes"),
        (["taxonomy", "--n-sequences", "0"], "--n-sequences"),
    ],
)
def test_bad_numbers_name_the_option(argv, needle, capsys):
    usage_error(argv, capsys, needle)


def test_unknown_option_and_empty_text(capsys):
    usage_error(["report", "--no-such-option"], capsys, "--no-such-option")
    usage_error(["analyze", "   "], capsys, "empty")


def test_unknown_faithfulness_metric(capsys, out):
    usage_error(["faithfulness", "--metrics", "contribution,bogus", "--out", out], capsys, "bogus", "contribution")


# --- report sections, models, output folders ------------------------------------------------------


def test_faithfulness_mc_task_names_geolens_mc(capsys, out):
    """Multiple choice has one command: the former ``faithfulness --mc-task`` is a one-line error naming it."""
    usage_error(["faithfulness", "--mc-task", "bigbench:general_knowledge", "--out", out], capsys, "geolens mc")


def test_unknown_report_section(capsys, out):
    usage_error(["report", "--sections", "sinks,bogus", "--out", out], capsys, "bogus", "sinks")


@pytest.mark.parametrize("command", ["analyze", *ALL])
@pytest.mark.parametrize("name", ["no-such-model", "someone/not-downloaded-model"])
def test_unknown_model_lists_the_choices_without_loading(command, name, capsys, out):
    argv = [command, "text"] if command == "analyze" else [command, "--out", out]
    line = usage_error([*argv, "--model", name], capsys, name, "smollm2-135m", "gemma3-270m", "folder")
    if command in COMMANDS_WITH_CORPORA:
        assert "tiny-gqa" in line


@pytest.mark.parametrize("command", ["analyze", "report"])
def test_unknown_backend_and_compat_with_hf(command, capsys, out):
    argv = [command, "text"] if command == "analyze" else [command, "--out", out]
    usage_error([*argv, "--backend", "hff"], capsys, "--backend", "'tl'", "'hf'", "did you mean 'hf'?")
    usage_error([*argv, "--backend", "hf", "--compat"], capsys, "--compat", "--backend hf")


@pytest.mark.parametrize("command", ["analyze", "report"])
def test_the_backend_reaches_load_model(command, monkeypatch, tmp_path, docs):
    """--backend tl (the default) and hf are load_model's backends "transformer_lens" and "hf"."""
    seen = []

    def record(*args, **kwargs):
        seen.append(kwargs.get("backend"))
        raise ModelLoaded

    monkeypatch.setattr(geolens.models, "load_model", record)
    for extra in ([], ["--backend", "tl"], ["--backend", "hf"]):
        argv = (
            [command, "text"]
            if command == "analyze"
            else [command, "--corpus", docs, "--out", str(tmp_path / f"out{len(seen)}")]
        )
        with pytest.raises(ModelLoaded):
            main([*argv, *extra])
    assert seen == ["transformer_lens", "transformer_lens", "hf"]


@pytest.mark.parametrize("hub_id", ["org/cached", "gpt2"])
def test_cached_hub_name_loads_from_its_snapshot_folder(monkeypatch, tmp_path, hub_id):
    """A hub id in the local HF cache (with or without a slash) is accepted, and loaded from disk
    (never the network)."""
    import huggingface_hub

    snapshot = tmp_path / "hub" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (snapshot / "model.safetensors").write_bytes(b"")
    monkeypatch.setattr(
        huggingface_hub,
        "try_to_load_from_cache",
        lambda repo, name, **kwargs: str(snapshot / name) if repo == hub_id else None,
    )
    seen = []

    def record(name, *args, **kwargs):
        seen.append(name)
        raise ModelLoaded

    monkeypatch.setattr(geolens.models, "load_model", record)
    with pytest.raises(ModelLoaded):
        main(["analyze", "some text", "--model", hub_id])
    assert seen == [str(snapshot)]


def test_model_folder_without_config(capsys, tmp_path, out):
    usage_error(["sinks", "--model", str(tmp_path), "--out", out], capsys, "config.json")


@pytest.mark.parametrize("command", ALL)
def test_out_is_an_existing_file(command, capsys, tmp_path):
    existing = tmp_path / "results.txt"
    existing.write_text("keep me")
    usage_error([command, "--out", str(existing)], capsys, "results.txt", "existing file")
    assert existing.read_text() == "keep me"


def test_out_cannot_be_created(capsys, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    usage_error(["report", "--out", str(blocker / "report")], capsys, "cannot write")


def test_report_out_with_a_folder_where_the_html_goes(capsys, tmp_path):
    (tmp_path / "report" / "report.html").mkdir(parents=True)
    usage_error(["report", "--out", str(tmp_path / "report")], capsys, "report.html")


def test_valid_arguments_reach_the_model(tmp_path, docs):
    """The validators do not refuse good input: these calls get as far as loading the model."""
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text('{"text": "one document"}\n{"text": "another one"}\n', encoding="utf-8")
    for argv in (
        ["report", "--corpus", str(corpus), "--sections", "sinks,contributions", "--example-layer", "-1"],
        ["sinks", "--corpus", docs, "--drift-layers", "0,1", "--lambdas", "0,2"],
        ["taxonomy", "--model", "tiny-gqa", "--corpora", docs, str(corpus)],
        ["analyze", "some text", "--layer", "-1", "--top", "3"],
    ):
        with pytest.raises(ModelLoaded):
            main([*argv, "--out", str(tmp_path / "out")] if argv[0] != "analyze" else argv)


# --- layer indices: checked right after loading, never wrapped ---------------------------------------


def test_report_example_layer_out_of_range(tiny_model, capsys, out, docs):
    usage_error(
        ["report", "--corpus", docs, "--example-layer", "99", "--out", out], capsys, "--example-layer 99", "2 layers"
    )
    usage_error(["report", "--corpus", docs, "--example-layer", "-3", "--out", out], capsys, "--example-layer -3")


def test_analyze_layer_out_of_range(tiny_model, capsys):
    usage_error(["analyze", "some text", "--layer", "2"], capsys, "--layer 2", "2 layers")


def test_faithfulness_layers_out_of_range(tiny_model, capsys, out, docs):
    usage_error(
        ["faithfulness", "--corpus", docs, "--layers", "0-5", "--out", out],
        capsys,
        "--layers 5",
        "2 layers",
    )
    usage_error(["faithfulness", "--corpus", docs, "--layers=-3", "--out", out], capsys, "--layers -3")


def test_sinks_drift_layers_and_kv_heads_out_of_range(tiny_model, capsys, out, docs):
    usage_error(
        ["sinks", "--corpus", docs, "--drift-layers", "7", "--out", out], capsys, "--drift-layers 7", "2 layers"
    )
    usage_error(
        ["sinks", "--corpus", docs, "--drift-kv-heads", "0,5", "--out", out], capsys, "--drift-kv-heads 5", "kv heads"
    )


def test_layers_in_range_reach_the_corpus(tiny_model, out, docs):
    with pytest.raises(CorpusWorkStarted):
        main(["report", "--corpus", docs, "--example-layer", "-2", "--out", out])
    with pytest.raises(CorpusWorkStarted):
        main(["faithfulness", "--corpus", docs, "--layers=-2,-1", "--out", out])


def test_too_few_windows_is_a_usage_error(monkeypatch, capsys, tmp_path):
    """The window count needs the tokenizer: after loading, still one line and exit code 2."""
    model = make_tiny("gqa")
    monkeypatch.setattr(geolens.models, "load_model", lambda *a, **k: model)
    corpus = tmp_path / "short.txt"
    corpus.write_text("only a few words here", encoding="utf-8")
    usage_error(
        ["sinks", "--corpus", str(corpus), "--n-sequences", "5", "--seq-len", "64", "--out", str(tmp_path / "o")],
        capsys,
        "short.txt",
        "window",
    )


def test_build_report_refuses_an_example_layer_out_of_range_before_the_corpus_pass(monkeypatch):
    import geolens.report.build as build
    from geolens.report import ReportConfig
    from geolens.testing import tiny_tokens

    model = make_tiny("gqa")

    def no_pass(*args, **kwargs):
        raise CorpusWorkStarted

    monkeypatch.setattr(build, "run_corpus", no_pass)
    tokens = tiny_tokens(model, length=12)
    with pytest.raises(IndexError, match="example_layer=99 is out of range: the model has 2 layers"):
        build.build_report(model, tokens, ReportConfig(n_heldout=1, example_layer=99), progress=False)


def test_commands_restore_the_callers_autograd_mode(monkeypatch):
    """A command run in-process (notebook, test) turns autograd off for itself only, also on error."""
    import argparse

    import torch

    import geolens.cli as cli

    def fake_parser(fail):
        def func(args):
            torch.set_grad_enabled(False)  # what the model-running commands do
            if fail:
                raise cli.UsageError("bad")
            return 0

        p = argparse.ArgumentParser()
        p.set_defaults(func=func, command="fake")
        return p

    for fail in (False, True):
        monkeypatch.setattr(cli, "build_parser", lambda: fake_parser(fail))
        assert torch.is_grad_enabled()
        assert cli.main([]) == (2 if fail else 0)
        assert torch.is_grad_enabled()


@pytest.mark.parametrize(
    "argv, hint",
    [
        (["reprot"], "did you mean 'report'?"),
        (["taxonomy", "--model", "smollm2"], "did you mean 'smollm2-135m'?"),
        (["taxonomy", "--model", "gemma3-207m"], "did you mean 'gemma3-270m'?"),
        (["faithfulness", "--ranking", "quey"], "did you mean 'query'?"),
        (["report", "--sections", "sinkz"], "did you mean 'sinks'?"),
    ],
)
def test_misspelt_command_model_or_choice_suggests_the_closest(argv, hint, capsys):
    assert main(argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and hint in err[0], err


def test_no_suggestion_for_a_name_close_to_nothing(capsys):
    assert main(["taxonomy", "--model", "xyzzy-frobnicate"]) == 2
    assert "did you mean" not in capsys.readouterr().err
