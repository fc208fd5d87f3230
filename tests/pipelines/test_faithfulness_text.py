"""The faithfulness run's text (geolens.pipelines.faithfulness_text): the AUC and pair tables in
Markdown with the figures, and the results README with its verdicts (and the saved result resuming)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from constructed import synthetic_result

from geolens.pipelines.faithfulness_text import auc_markdown, pairs_markdown
from geolens.viz.faithfulness import (
    faithfulness_curves_plot,
    mc_accuracy_plot,
    pruning_curves_plot,
    sensitivity_map_plot,
)


def test_auc_markdown_and_figures(tmp_path):
    curves = pd.DataFrame(
        [
            dict(
                metric=m,
                direction=d,
                fraction=k,
                delta_ppl=k * (i + 1),
                delta_ppl_lo=k * (i + 1) - 0.1,
                delta_ppl_hi=k * (i + 1) + 0.1,
                delta_logprob=-k,
                delta_logprob_lo=-k - 0.01,
                delta_logprob_hi=-k + 0.01,
            )
            for i, m in enumerate(["raw_attention", "contribution", "random"])
            for d in ("comprehensiveness", "sufficiency")
            for k in (0.1, 0.5, 0.9)
        ]
    )
    view = faithfulness_curves_plot(curves, "delta_ppl", subtitle="protocol: test")
    assert np.allclose(view.data["comprehensiveness/contribution"]["value"], [0.2, 1.0, 1.8])
    pairs = pd.DataFrame(
        [
            dict(
                a="raw_attention",
                b="contribution",
                direction="sufficiency",
                quantity="delta_ppl",
                auc_diff=0.5,
                ci_low=0.1,
                ci_high=0.9,
                verdict="holds",
                claimed=False,
            )
        ]
    )
    assert "| raw_attention → contribution | sufficiency | delta_ppl | +0.5 | [+0.1, +0.9] | holds |" in pairs_markdown(
        pairs
    )
    assert view.save(tmp_path / "c.png").stat().st_size > 1000
    auc = pd.DataFrame(
        [dict(metric="random", direction="sufficiency", quantity="delta_ppl", auc=1.23456, ci_low=1.0, ci_high=1.5)]
    )
    assert "| random | sufficiency | delta_ppl | 1.2346 | [1.0000, 1.5000] |" in auc_markdown(auc)
    mc = pd.DataFrame(
        [dict(metric="clean", direction="none", fraction=0.0, accuracy=0.5)]
        + [
            dict(metric="random", direction=d, fraction=k, accuracy=0.4)
            for d in ("comprehensiveness", "sufficiency")
            for k in (0.1, 0.9)
        ]
    )
    assert mc_accuracy_plot(mc).data["clean"] == 0.5
    pr = pd.DataFrame(
        [dict(order=o, retention=r, delta_ppl=r) for o in ("regime", "random_0", "random_1") for r in (0.9, 0.5)]
    )
    assert set(pruning_curves_plot(pr).data) == {"regime", "random_0", "random_1"}
    crit = pd.DataFrame(dict(layer=[1], head=[2]))
    assert sensitivity_map_plot(np.zeros((3, 4)), crit).data["delta_ppl"].shape == (3, 4)


def test_results_readme_and_resume(tmp_path):
    from geolens.faithfulness.result import ResumeError, resume_state
    from geolens.pipelines.faithfulness_text import results_markdown

    gaps = dict(random=0.3, raw_attention=0.5, value_weighted=1.0, output_normalized=1.5, contribution=2.0)
    res = synthetic_result(gaps)
    res.meta = dict(
        model="toy", seq_len=128, corpus="lee", command="geolens faithfulness --n-sequences 40", complete=True
    )
    text = results_markdown(res)
    assert "| ranking scope | query |" in text and "40 × 128 (lee); 4000 scored predictions" in text
    pairs = res.pairs()
    step = pairs[
        (pairs.a == "output_normalized")
        & (pairs.direction == "comprehensiveness")
        & (pairs.quantity == "delta_logprob")
    ].iloc[0]
    assert f"{step.auc_diff:+.3g} [{step.ci_low:+.3g}, {step.ci_high:+.3g}] **holds**" in text
    res.save(tmp_path)
    per, clean = resume_state(tmp_path, dict(res.protocol))
    assert len(clean) == 40 and len(per) == len(res.per_sequence)
    pd.testing.assert_frame_equal(clean, res.clean)
    with pytest.raises(ResumeError, match="another protocol"):
        resume_state(tmp_path, dict(res.protocol, ranking="row"))
    assert resume_state(tmp_path / "nothing here", dict(res.protocol)) == (None, None)
