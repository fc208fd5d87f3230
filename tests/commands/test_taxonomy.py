"""``geolens taxonomy`` end to end on a tiny model (offline corpora), and the regime grid views."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import torch
from constructed import write_corpus

from geolens import taxonomy
from geolens.cli import main
from geolens.viz.taxonomy import regime_grid_html, regime_grid_plot


def test_taxonomy_command_writes_tables_and_figures(tmp_path):
    out = tmp_path / "tax"
    lee, enwiki = write_corpus(tmp_path / "lee.txt", 0), write_corpus(tmp_path / "enwiki.txt", 1)
    rc = main(
        [
            "taxonomy",
            "--model",
            "tiny-gqa",
            "--corpora",
            lee,
            enwiki,
            "--n-sequences",
            "4",
            "--seq-len",
            "16",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    heads = pd.read_csv(out / "heads_lee.csv")
    assert len(heads) == 2 * 4 and (heads.n_queries == 4 * 15).all()
    np.testing.assert_allclose(heads[["share_sink", "share_current", "share_other"]].sum(1), 1.0, atol=1e-5)  # %.6g CSV
    summary = json.loads((out / "summary.json").read_text())
    assert 0 <= summary["stability"]["agreement"] <= 1
    assert summary["distribution"]["lee"].keys() == {"Mixer", "Retriever", "Reset"}
    side = pd.read_csv(out / "distribution_side_by_side.csv", index_col=0)
    assert list(side.columns) == ["lee", "enwiki"]
    assert (out / "regime_grid.png").stat().st_size > 1000
    # the offset statistic and the window-length dependence
    assert {"top_offset", "top_offset_share", "top_offset_share_of_other", "offset_dominant", "label"} <= set(
        heads.columns
    )
    offsets = pd.read_csv(out / "offsets_lee.csv")
    assert list(offsets.columns) == ["layer", "head", "offset", "count", "share"] and (offsets.offset < 0).all()
    by_len = pd.read_csv(out / "by_length_lee.csv")
    assert by_len.prefix_length.tolist() == [16]  # 32, 64, 128 are longer than the windows
    assert summary["queries"] == "all" and summary["n_windows"] == {"lee": 4, "enwiki": 4}
    assert "<table>" in (out / "regime_grid.html").read_text()


def test_regime_grid_views_show_the_regimes():
    counts = torch.tensor([[[5.0, 1, 1], [1, 5, 1], [1, 1, 5]], [[2, 1, 1], [1, 1, 3], [1, 4, 1]]])
    tax = taxonomy.taxonomy_from_counts(counts)
    view = regime_grid_plot({"a": tax, "b": tax})
    assert view.data["a"]["regimes"] == [["Mixer", "Retriever", "Reset"], ["Mixer", "Reset", "Retriever"]]
    assert len(view.to_png_bytes()) > 1000
    view.close()
    page = regime_grid_html({"a": tax})
    assert page.count("<td") == 6 and "layer 1 head 2: Retriever (sink 0.17, current 0.67, other 0.17)" in page


def test_taxonomy_command_final_query_mode(tmp_path):
    out = tmp_path / "tax"
    lee = write_corpus(tmp_path / "lee.txt", 0)
    rc = main(
        [
            "taxonomy",
            "--model",
            "tiny-gqa",
            "--corpora",
            lee,
            "--n-sequences",
            "4",
            "--seq-len",
            "16",
            "--queries",
            "final",
            "--prefix-lengths",
            "8",
            "16",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    heads = pd.read_csv(out / "heads_lee.csv")
    assert (heads.n_queries == 4).all()
    by_len = pd.read_csv(out / "by_length_lee.csv")
    assert by_len.prefix_length.tolist() == [8, 16] and (by_len.n_queries_per_head == 4).all()
    # the 16-token prefix is the whole window: same regimes
    assert by_len.changed_vs_full.iloc[-1] == 0
