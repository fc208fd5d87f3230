"""``geolens selection`` end to end on a tiny model, the selection figures, and slow SmolLM2 checks."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from constructed import write_corpus

from geolens.cli import main
from geolens.selection.effective_set import effective_set_size


def test_selection_command_writes_tables_and_figures(tmp_path):
    out = tmp_path / "sel"
    lee = write_corpus(tmp_path / "lee.txt", 0)
    rc = main(
        [
            "selection",
            "--model",
            "tiny-gqa",
            "--corpora",
            lee,
            "--nstar-corpus",
            lee,
            "--n-sequences",
            "3",
            "--seq-len",
            "16",
            "--n-random",
            "4",
            "--n-boot",
            "50",
            "--nstar-sequences",
            "2",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    cmp = pd.read_csv(out / "comparison_lee.csv")
    assert set(cmp.N) == {1, 2, 4, 8} and (cmp.n_docs == 3).all()
    viol = pd.read_csv(out / "violations_lee.csv")
    assert (viol[["precision_bound", "recall_bound", "equivalence"]] == 0).all().all()
    summary = json.loads((out / "summary.json").read_text())
    lee = summary["corpora"]["lee"]
    assert lee["n_documents"] == 3 and "f_top_by_sink_mode" in lee and "regime_medians" in lee
    assert {r["ranking"] for r in summary["n_star"]["table"]} == {"attention", "norm"}
    for name in ("f_vs_n_lee.png", "f_by_layer_lee.png", "similarity_decay_lee.png"):
        assert (out / name).stat().st_size > 1000
    lag = np.loadtxt(out / "similarity_by_lag_lee.csv", delimiter=",")
    assert lag.shape == (2, 14)


@pytest.mark.slow
def test_smollm2_effective_set_size_is_consistent(smollm2, smollm2_tokens):
    tokens = smollm2_tokens[:1, :32]
    res = effective_set_size(smollm2, tokens, sizes=[1, 32], rankings=("attention",), batch_size=1, progress=False)
    nll = res["nll"].set_index("N")
    assert nll.loc[32, "relative_increase"] == pytest.approx(0.0, abs=1e-6)  # N = window keeps everything
    assert nll.loc[1, "relative_increase"] > 0.1  # one source per head and query is far too few
    assert np.isfinite(nll.nll).all()
    assert (res["n_star"].n_star == 32).all()
