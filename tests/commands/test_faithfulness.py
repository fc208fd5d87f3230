"""Helpers of the faithfulness/pruning commands and their figures."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from constructed import synthetic_result

from geolens.commands.faithfulness import parse_fractions, parse_layers
from geolens.viz.faithfulness import (
    faithfulness_curves_plot,
)


def test_parse_layers():
    assert parse_layers("all", 30) is None
    assert parse_layers("-1", 30) == (29,)
    assert parse_layers("-2,-1", 30) == (28, 29)
    assert parse_layers("20-23", 30) == (20, 21, 22, 23)
    assert parse_layers("3,1,3", 30) == (1, 3)
    assert parse_layers("early", 30) == tuple(range(10)) and parse_layers("late", 30) == tuple(range(20, 30))
    with pytest.raises(ValueError, match="--layers 30 is out of range: the model has 30 layers"):
        parse_layers("30", 30)
    with pytest.raises(ValueError, match="expected 'all' or layers like"):
        parse_layers("top", 30)


def test_parse_fractions_and_bad_input_exit_2(capsys):
    assert parse_fractions("0.5,0.01") == (0.01, 0.5)
    for bad in ("0,0.5", "0.5,1", "1.5", "x"):
        with pytest.raises(ValueError, match="--fractions"):
            parse_fractions(bad)
    from geolens.cli import main

    assert main(["faithfulness", "--fractions", "0.2,1.2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "geolens faithfulness: error: --fractions must lie in (0, 1), got [1.2]"
    assert main(["faithfulness", "--fractions", "0.5", "--metrics", "attention,random"]) == 2
    err = capsys.readouterr().err.strip()
    assert "unknown metric 'attention'" in err and "\n" not in err


def test_coinciding_faithfulness_curves_are_named_with_the_reason(tmp_path):
    rows = []
    for metric, scale in [
        ("raw_attention", 1.0),
        ("value_weighted", 2.0),
        ("output_normalized", 2.0),
        ("contribution", 3.0),
        ("random", 0.5),
    ]:
        for d in ("comprehensiveness", "sufficiency"):
            for k in (0.1, 0.5, 0.9):
                rows.append(
                    dict(
                        metric=metric,
                        direction=d,
                        fraction=k,
                        delta_ppl=scale * k,
                        delta_ppl_lo=scale * k - 0.01,
                        delta_ppl_hi=scale * k + 0.01,
                        delta_logprob=-k,
                        delta_logprob_lo=-k - 0.01,
                        delta_logprob_hi=-k + 0.01,
                    )
                )
    view = faithfulness_curves_plot(pd.DataFrame(rows), "delta_ppl")
    pairs = {(p["direction"], p["a"], p["b"]) for p in view.data["coincide"]}
    assert pairs == {
        ("comprehensiveness", "value_weighted", "output_normalized"),
        ("sufficiency", "value_weighted", "output_normalized"),
    }
    assert all(p["identical"] and "constant within a ranking group" in p["reason"] for p in view.data["coincide"])
    styles = {(line.get_marker(), str(line.get_linestyle())) for line in view.figure.axes[0].get_lines()}
    assert len(styles) == 5  # every metric has its own marker and line style
    texts = " ".join(t.get_text() for t in view.figure.texts)
    assert "value-weighted α‖ṽ‖ and output-normalised α‖ṽ‖/‖o‖ coincide (identical)" in texts
    view.close()
    distinct = faithfulness_curves_plot(
        pd.DataFrame([r for r in rows if r["metric"] != "output_normalized"]), "delta_ppl"
    )
    assert distinct.data["coincide"] == [] and not distinct.figure.texts
    distinct.close()


def test_replot_rewrites_tables_and_figures_from_saved_results(tmp_path, capsys):
    """--replot reads what FaithfulnessResult.save wrote (summary.json, per_sequence.csv.gz, clean.csv)."""
    from geolens.cli import main

    res = synthetic_result(
        dict(random=0.3, raw_attention=0.5, value_weighted=1.0, output_normalized=1.5, contribution=2.0)
    )
    res.meta = dict(model="toy", seq_len=128, corpus="lee", command="geolens faithfulness", complete=True)
    res.save(tmp_path)
    assert main(["faithfulness", "--replot", "--out", str(tmp_path)]) == 0
    for name in ("pairs.csv", "auc.csv", "curves_delta_logprob.png", "README.md"):
        assert (tmp_path / name).is_file(), name
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["faithfulness", "--replot", "--out", str(empty)]) == 2
    assert "missing summary.json, per_sequence.csv.gz, clean.csv" in capsys.readouterr().err


def test_per_sequence_saved_gzipped_deterministic_and_old_csv_still_read(tmp_path):
    from geolens.faithfulness import FaithfulnessResult
    from geolens.faithfulness.result import resume_state

    res = synthetic_result(
        dict(random=0.3, raw_attention=0.5, value_weighted=1.0, output_normalized=1.5, contribution=2.0)
    )
    res.save(tmp_path / "a")
    res.save(tmp_path / "b")
    a, b = (tmp_path / d / "per_sequence.csv.gz" for d in "ab")
    assert a.read_bytes() == b.read_bytes()  # no gzip timestamp
    assert not (tmp_path / "a" / "per_sequence.csv").exists()
    old = tmp_path / "old"
    res.save(old)
    res.per_sequence.to_csv(old / "per_sequence.csv", index=False)  # a folder written by an older version
    (old / "per_sequence.csv.gz").unlink()
    back = FaithfulnessResult.load(old)
    assert len(back.per_sequence) == len(res.per_sequence)
    per, _ = resume_state(old, dict(res.protocol))
    assert len(per) == len(res.per_sequence)
    res.save(old)  # rewriting converts it
    assert (old / "per_sequence.csv.gz").exists() and not (old / "per_sequence.csv").exists()


def test_write_json_and_fingerprints_share_one_converter(tmp_path):
    """numpy and torch numbers as Python numbers, anything else JSON cannot write as its str."""
    import doctest
    import json
    from pathlib import Path

    import torch

    import geolens.checkpoint as checkpoint
    from geolens.faithfulness.preregistered import write_json

    data = {
        "n": np.int64(3),
        "x": np.float32(0.25),
        "ok": np.bool_(True),
        "t": torch.tensor(1.5),
        "where": Path("a/b"),
        "k": (1, 2),
    }
    write_json(data, tmp_path / "s.json")
    back = json.loads((tmp_path / "s.json").read_text(encoding="utf-8"))
    assert back == {"n": 3, "x": 0.25, "ok": True, "t": 1.5, "where": "a/b", "k": [1, 2]}
    assert type(back["n"]) is int and type(back["ok"]) is bool
    assert checkpoint.plain_json(data) == back
    finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner()
    for test in finder.find(checkpoint.json_default, globs=dict(vars(checkpoint))):
        runner.run(test)
    assert runner.summarize(verbose=False).attempted > 0 and runner.summarize(verbose=False).failed == 0
