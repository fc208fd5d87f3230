"""``geolens pruning`` end to end on the tiny GQA model (geolens.commands.pruning; the real run is the
README's): the evaluation windows are the first ``--n-sequences`` of the corpus and the references
the next ``--ref-sequences``, the files it writes hold what :func:`geolens.pipelines.pruning.run_pruning`
gives on that split, and bad options are refused before the model loads."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from conftest import make_tiny
from constructed import write_corpus

from geolens.cli import build_parser, main

ARGS = ["--n-sequences", "2", "--ref-sequences", "2", "--seq-len", "16", "--seeds", "0,1", "--retention", "0.75,0.5"]


@pytest.fixture()
def tiny(monkeypatch, tmp_path):
    """The tiny GQA model stands in for the shipped model; a small corpus file on disk."""
    import geolens.models

    model = make_tiny("gqa")
    monkeypatch.setattr(geolens.models, "load_model", lambda name, **kw: model)
    return model, write_corpus(tmp_path / "corpus.txt", 0)


def test_pruning_command_writes_the_pipelines_tables_for_its_split(tiny, tmp_path, capsys):
    from geolens.data import corpus_windows
    from geolens.pipelines.pruning import PruningParams, run_pruning

    model, corpus = tiny
    out = tmp_path / "pruning"
    assert main(["pruning", "--corpus", corpus, *ARGS, "--scan-sequences", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    for name in ("orders.json", "taxonomy.csv", "pruning.csv", "pruning.png", "sensitivity.csv", "critical_heads.csv"):
        assert (out / name).stat().st_size > 0, name
    run = json.loads((out / "run.json").read_text())
    n_heads = model.cfg.n_layers * model.cfg.n_heads
    assert run["n_heads_total"] == n_heads and run["retention"] == [0.75, 0.5] and run["seeds"] == [0, 1]
    sample = (run["n_sequences"], run["ref_sequences"], run["scan_sequences"], run["seq_len"], run["mode"])
    assert sample == (2, 2, 1, 16, "mean")
    assert (
        run["description"].startswith("smollm2-135m; mean-ablation of hook_z; references")
        and "2 other windows" in run["description"]
    )
    orders = json.loads((out / "orders.json").read_text())
    assert list(orders) == ["regime", "weight", "entropy", "random_0", "random_1"]  # one random order per seed
    every_head = sorted([layer, head] for layer in range(model.cfg.n_layers) for head in range(model.cfg.n_heads))
    assert all(sorted(order) == every_head for order in orders.values())  # each order: every head once
    # the same pipeline on the command's split (evaluation first, then references) gives the same tables
    tokens = corpus_windows(model, corpus, 16, 4)
    params = PruningParams(retention=(0.75, 0.5), seeds=(0, 1), scan_sequences=1, batch_size=8)
    expected = run_pruning(model, tokens[2:], tokens[:2], params, progress=False)
    assert {k: [list(h) for h in v] for k, v in expected.orders.items()} == orders
    pd.testing.assert_frame_equal(
        pd.read_csv(out / "pruning.csv"),
        expected.tables["pruning"].reset_index(drop=True),
        check_dtype=False,
        atol=1e-6,
    )
    assert len(pd.read_csv(out / "pruning.csv")) == len(orders) * 2  # every order at each retention level
    assert len(pd.read_csv(out / "sensitivity.csv")) == n_heads
    assert "regimes:" in printed and "single-head scan on 1 windows" in printed and f"results in {out}/" in printed


def test_pruning_command_zero_ablation_without_scan(tiny, tmp_path, capsys):
    _, corpus = tiny
    out = tmp_path / "zero"
    argv = ["pruning", "--corpus", corpus, *ARGS, "--mode", "zero", "--scan-sequences", "0", "--n-scored", "4"]
    assert main(argv + ["--out", str(out)]) == 0
    run = json.loads((out / "run.json").read_text())
    assert run["mode"] == "zero" and run["n_scored"] == 4 and "last 4 predictions scored" in run["description"]
    assert not (out / "sensitivity.csv").exists() and not (out / "critical_heads.csv").exists()
    assert "single-head scan" not in capsys.readouterr().out


def test_retention_option_parses_levels_in_the_unit_interval():
    parse = lambda *argv: build_parser().parse_args(["pruning", *argv])  # noqa: E731
    assert parse().retention == [] and parse("--retention", "").retention == []  # [] : the default levels
    assert parse("--retention", "0.9,0.5,1").retention == [0.9, 0.5, 1.0]
    assert parse().seeds == [0, 1, 2] and parse().mode == "mean" and parse().scan_sequences == 1


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--retention", "0,0.5"], "--retention"),  # 0 retains nothing
        (["--retention", "1.5"], "--retention"),
        (["--mode", "half"], "--mode"),
        (["--ref-sequences", "0"], "--ref-sequences"),
        (["--scan-sequences", "-1"], "--scan-sequences"),
        (["--corpus", "no/such/corpus.txt"], "no/such/corpus.txt"),
    ],
)
def test_bad_options_are_refused_before_the_model_loads(monkeypatch, tmp_path, capsys, argv, needle):
    import geolens.models

    monkeypatch.setattr(geolens.models, "load_model", lambda *a, **k: pytest.fail("the model must not load"))
    assert main(["pruning", *argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1 and err.startswith("geolens pruning: error:"), err
    assert not (tmp_path / "out").exists()
