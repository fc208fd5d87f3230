"""``geolens sinks`` end to end on a tiny model (the real run is documented in the README)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from conftest import make_tiny

from geolens.cli import main
from geolens.testing import tiny_tokens


@pytest.mark.bridge_only
def test_sinks_command_writes_tables_and_figures(tmp_path, monkeypatch):
    import geolens.data
    import geolens.models

    model = make_tiny("gqa")
    texts = ("the cat sat on the mat.", "a dog ran far away!!", "it is 42, or 7? no.", "one two three four")
    monkeypatch.setattr(geolens.models, "load_model", lambda name, compatibility_mode=False: model)
    monkeypatch.setattr(
        geolens.data, "corpus_windows", lambda m, corpus, seq_len, n: tiny_tokens(m, texts[:n], length=seq_len)
    )
    out = tmp_path / "sinks"
    rc = main(
        [
            "sinks",
            "--n-sequences",
            "4",
            "--seq-len",
            "12",
            "--batch-size",
            "2",
            "--drift-sequences",
            "2",
            "--lambdas",
            "0,2",
            "--min-count",
            "1",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    for name in (
        "geometry_heads.csv",
        "geometry_layers.csv",
        "decomposition_layers.csv",
        "norm_fits.csv",
        "drift_summary.csv",
        "sink_layers.png",
        "decomposition.png",
        "norm_curve_layers.png",
        "drift.png",
    ):
        assert (out / name).stat().st_size > 0, name
    heads = pd.read_csv(out / "geometry_heads.csv")
    assert len(heads) == model.cfg.n_layers * model.cfg.n_heads
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_sequences"] == 4 and summary["drift_n_sequences"] == 2
    assert [r["lambda"] for r in summary["drift"]] == [0.0, 1.0, 2.0]
    assert summary["gu_sink_rate"] == pytest.approx(heads.gu_sink_share.mean())


def test_sinks_command_is_registered():
    from geolens.cli import build_parser

    args = build_parser().parse_args(["sinks"])
    assert args.n_sequences == 200 and args.seq_len == 128 and args.out is None and args.corpus == "lee"
