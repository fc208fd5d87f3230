"""The report's faithfulness section (geolens.report.sections.faithfulness): the per-term numbers are
the pipeline's own."""

from __future__ import annotations

import json

import pytest

from report.conftest import report_section, tiny_context


def test_faithfulness_section_per_term_numbers_are_the_pipelines_own(tiny_report):
    """The per-term endpoint of the section: run_per_term on the same corpus windows gives the
    same summary, which is ground_truth_summary of ground_truth_document per window (document
    index = window index), with the single-term medians over the positions."""
    import numpy as np
    import pandas as pd

    from geolens.faithfulness.ground_truth import ground_truth_document, ground_truth_summary
    from geolens.pipelines.faithfulness import PER_TERM_PAIRS, run_per_term
    from geolens.report.sections import faithfulness as section_module

    model, report, paths = tiny_report
    sec = report_section(report, "faithfulness")
    ctx = tiny_context(model)
    params = section_module.per_term_params(ctx)
    assert params.n_positions == 1 and params.query_range(16) == (8, 14)
    run = run_per_term(model, section_module.per_term_windows(ctx), params, progress=False)
    summary = sec.numbers["per_term"]
    assert json.dumps(summary, sort_keys=True, default=str) == json.dumps(run.summary, sort_keys=True, default=str)
    parts = [
        ground_truth_document(model, ctx.tokens[d : d + 1], d, n_positions=1, queries=(8, 14))
        for d in range(ctx.tokens.shape[0])
    ]
    rows = pd.concat([r for r, _ in parts], ignore_index=True)
    positions = pd.concat([p for _, p in parts], ignore_index=True)
    expected = ground_truth_summary(rows, PER_TERM_PAIRS, n_boot=params.n_boot, seed=params.seed, alpha=params.alpha)
    for key in ("metrics", "pairs", "n_positions", "n_documents"):
        assert json.dumps(summary[key], default=str) == json.dumps(expected[key], default=str), key
    effects = summary["single_term_effects"]
    assert effects["n_positions"] == len(positions) == 2
    assert effects["median_kl_of_largest_term"] == pytest.approx(float(np.median(positions.kl_term_max.to_numpy())))
    assert effects["median_kl_of_all_terms_summed"] == pytest.approx(float(np.median(positions.kl_term_sum.to_numpy())))
    # report.json: the endpoint's numbers, and its tables with verdicts under the claims rule
    data = json.loads(paths["json"].read_text())["sections"]["faithfulness"]
    assert set(data["numbers"]) == {"per_term", "per_term_sample"}  # protocol 1 is not in the quick report
    assert (
        data["numbers"]["per_term_sample"]["minimum"] == 100
        and data["params"]["per_term"]["n_positions_per_document"] == 1
    )
    [table] = [
        rows
        for caption, rows in data["tables"].items()
        if caption.startswith("per-term endpoint: pre-registered pairs")
    ]
    assert table["rows"] and all(
        r["verdict"] in ("indicative (n = 2 corpus windows)", "not testable") for r in table["rows"]
    )
    [means] = [
        rows for caption, rows in data["tables"].items() if caption.startswith("per-term endpoint: mean Spearman")
    ]
    kl = [m for m in summary["metrics"] if m["outcome"] == "kl"]
    assert [(r["scope"], r["metric"], r["spearman"]) for r in means["rows"]] == [
        (m["scope"], m["metric"], pytest.approx(m["spearman"])) for m in kl
    ]
    assert all(caption.startswith("per-term endpoint") for caption in data["tables"]) and not data["figures"]
