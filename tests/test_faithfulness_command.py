"""Helpers of the faithfulness/pruning commands and their figures."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from geolens.commands.faithfulness import auc_markdown, parse_layers
from geolens.viz.faithfulness import faithfulness_curves_plot, mc_accuracy_plot, pruning_curves_plot, sensitivity_map_plot


def test_parse_layers():
    assert parse_layers("all", 30) is None
    assert parse_layers("-1", 30) == (29,)
    assert parse_layers("-2,-1", 30) == (28, 29)
    assert parse_layers("20-23", 30) == (20, 21, 22, 23)
    assert parse_layers("3,1,3", 30) == (1, 3)


def test_auc_markdown_and_figures(tmp_path):
    curves = pd.DataFrame(
        [dict(metric=m, direction=d, fraction=k, delta_ppl_mean=k * (i + 1), delta_ppl_sem=0.1, delta_logprob_mean=-k, delta_logprob_sem=0.01)
         for i, m in enumerate(["raw_attention", "contribution", "random"]) for d in ("comprehensiveness", "sufficiency") for k in (0.1, 0.5, 0.9)]
    )  # fmt: skip
    view = faithfulness_curves_plot(curves, "delta_ppl", subtitle="protocol: test")
    assert np.allclose(view.data["comprehensiveness/contribution"]["mean"], [0.2, 1.0, 1.8])
    assert view.save(tmp_path / "c.png").stat().st_size > 1000
    auc = pd.DataFrame([dict(metric="random", direction="sufficiency", quantity="delta_ppl", auc=1.23456, ci_low=1.0, ci_high=1.5)])
    assert "| random | sufficiency | delta_ppl | 1.2346 | [1.0000, 1.5000] |" in auc_markdown(auc)
    mc = pd.DataFrame([dict(metric="clean", direction="none", fraction=0.0, accuracy=0.5)] +
                      [dict(metric="random", direction=d, fraction=k, accuracy=0.4) for d in ("comprehensiveness", "sufficiency") for k in (0.1, 0.9)])  # fmt: skip
    assert mc_accuracy_plot(mc).data["clean"] == 0.5
    pr = pd.DataFrame([dict(order=o, retention=r, delta_ppl=r) for o in ("regime", "random_0", "random_1") for r in (0.9, 0.5)])
    assert set(pruning_curves_plot(pr).data) == {"regime", "random_0", "random_1"}
    crit = pd.DataFrame(dict(layer=[1], head=[2]))
    assert sensitivity_map_plot(np.zeros((3, 4)), crit).data["delta_ppl"].shape == (3, 4)


def test_coinciding_faithfulness_curves_are_named_with_the_reason(tmp_path):
    rows = []
    for metric, scale in [("raw_attention", 1.0), ("value_weighted", 2.0), ("output_normalized", 2.0), ("contribution", 3.0), ("random", 0.5)]:
        for d in ("comprehensiveness", "sufficiency"):
            for k in (0.1, 0.5, 0.9):
                rows.append(dict(metric=metric, direction=d, fraction=k, delta_ppl_mean=scale * k, delta_ppl_sem=0.01,
                                 delta_logprob_mean=-k, delta_logprob_sem=0.01))
    view = faithfulness_curves_plot(pd.DataFrame(rows), "delta_ppl")
    pairs = {(p["direction"], p["a"], p["b"]) for p in view.data["coincide"]}
    assert pairs == {("comprehensiveness", "value_weighted", "output_normalized"), ("sufficiency", "value_weighted", "output_normalized")}
    assert all(p["identical"] and "constant within a (head, query) row" in p["reason"] for p in view.data["coincide"])
    styles = {(line.get_marker(), str(line.get_linestyle())) for line in view.figure.axes[0].get_lines()}
    assert len(styles) == 5  # every metric has its own marker and line style
    texts = " ".join(t.get_text() for t in view.figure.texts)
    assert "value-weighted α‖ṽ‖ and output-normalised α‖ṽ‖/‖o‖ coincide (identical)" in texts
    view.close()
    distinct = faithfulness_curves_plot(pd.DataFrame([r for r in rows if r["metric"] != "output_normalized"]), "delta_ppl")
    assert distinct.data["coincide"] == [] and not distinct.figure.texts
    distinct.close()
