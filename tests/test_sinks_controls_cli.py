"""``geolens sinks --controls-only`` end to end on a tiny model (the real run is in the README)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from conftest import make_tiny

from geolens.cli import main
from geolens.testing import tiny_tokens

TEXTS = ("the cat sat on the mat.", "a dog ran far away!!", "it is 42, or 7? no.", "one two three four")


@pytest.fixture()
def patched(monkeypatch):
    import geolens.data
    import geolens.models

    model = make_tiny("gqa")
    monkeypatch.setattr(geolens.models, "load_model", lambda name, compatibility_mode=False: model)
    monkeypatch.setattr(geolens.data, "corpus_windows", lambda m, corpus, seq_len, n: tiny_tokens(m, TEXTS[:n], length=seq_len))
    return model


@pytest.mark.bridge_only
def test_controls_only_writes_tables_figure_and_summary(tmp_path, patched):
    out = tmp_path / "sinks"
    rc = main(["sinks", "--controls-only", "--controls-sequences", "3", "--seq-len", "10", "--controls-layers", "all",
               "--controls-seeds", "0,1", "--n-boot", "200", "--out", str(out)])  # fmt: skip
    assert rc == 0
    for name in ("controls_conditions.csv", "controls_pairs.csv", "controls_scopes.csv", "controls_windows.csv", "controls.png"):
        assert (out / name).stat().st_size > 0, name
    assert not (out / "geometry_heads.csv").exists()  # --controls-only skips the corpus pass
    cond = pd.read_csv(out / "controls_conditions.csv")
    assert set(cond.scope.astype(str)) == {"all", "0", "1"}
    assert (cond.n_windows == 3).all()
    s = json.loads((out / "controls_summary.json").read_text())
    assert s["n_windows"] == 3 and s["seq_len"] == 10 and s["layers"] == [0, 1]
    a = cond[cond.scope.astype(str) == "all"].set_index("edit")
    for row in s["all_layers"]:
        assert row["delta_ppl"] == pytest.approx(a.loc[row["edit"], "delta_ppl"], rel=1e-5)
    scopes = pd.read_csv(out / "controls_scopes.csv")
    assert s["claim_by_scope"] == dict(zip(scopes.scope.astype(str), scopes.claim))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--controls-layers", "7"], "out of range"),
        (["--controls-layers", "every:0"], "every:K"),
        (["--controls-layers", "x"], "--controls-layers"),
        (["--controls-sequences", "0"], "--controls-sequences"),
    ],
)
def test_bad_controls_arguments_are_one_line_errors(tmp_path, patched, argv, message, capsys):
    corpus = tmp_path / "docs.txt"  # a local corpus: the TL 2.x environment has no gensim (offline corpora)
    corpus.write_text("the cat sat on the mat. " * 50, encoding="utf-8")
    base = ["sinks", "--controls-only", "--controls-sequences", "2", "--seq-len", "10", "--corpus", str(corpus), "--out", str(tmp_path / "o")]
    assert main(base + argv) == 2  # the CLI convention: exit code 2, one line on stderr
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err
