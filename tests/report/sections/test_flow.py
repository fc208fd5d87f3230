"""The report's contribution-flow section (geolens.report.sections.flow): the pipeline's own numbers in
the section, report.json and the page, and the quick sizes on SmolLM2's windows."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from geolens.report import (
    ReportConfig,
)
from report.conftest import report_section, tiny_context


def test_flow_section_shows_the_pipelines_own_numbers(tiny_report):
    """Same windows and settings through the pipeline ``geolens flow`` runs: the same tables, claims
    and prompt attribution; the prompt's rows equal geolens.contribution_flow on a fresh cache."""
    import pandas as pd

    import geolens
    from geolens.flow import flow_names_filter
    from geolens.pipelines.flow import LISTED, run_flow
    from geolens.report.sections import flow as section_module

    model, report, paths = tiny_report
    sec = report_section(report, "flow")
    ctx = tiny_context(model)
    params = section_module.params(ctx)
    assert params.erasure.positions == (15,) and params.erasure.replacements == (
        "space",
    )  # the quick size on 16-token windows
    assert not set(section_module.QUICK_LEFT_OUT) & set(params.erasure.methods)
    run = run_flow(model, ctx.tokens[: section_module.n_windows(ctx)], params, progress=False)
    assert sec.params["n_windows"] == ctx.tokens.shape[0] == run.summary["n_documents"] == 2
    for name in ("naopc", "pairs", "curves"):
        pd.testing.assert_frame_equal(sec.numbers[name], run.tables[name])
    assert [(c.claim, c.measured, c.verdict) for c in sec.claims] == [
        (c.claim, c.measured, c.verdict) for c in run.claims(windows="corpus windows")
    ]
    # the prompt's last prediction, by each listed method
    prompt = model.to_tokens(ctx.config.prompt, prepend_bos=True)
    _, cache = model.run_with_cache(prompt, names_filter=flow_names_filter(model))
    data = json.loads(paths["json"].read_text())["sections"]["flow"]
    assert data["numbers"]["prompt"]["position"] == prompt.shape[1] - 1
    for m in LISTED:
        row = geolens.contribution_flow(model, cache, m)[0, -1]
        assert data["numbers"]["prompt"]["flow"][m] == pytest.approx(row.tolist(), abs=1e-6)
        top = data["numbers"]["prompt"]["top"][m]
        assert [t["position"] for t in top] == torch.argsort(row, descending=True, stable=True)[:5].tolist()
    assert data["numbers"]["prompt"]["routes"]["position"] == prompt.shape[1] - 1


def test_flow_section_in_report_json_and_page(tiny_report):
    _, report, paths = tiny_report
    data = json.loads(paths["json"].read_text())
    flow = data["sections"]["flow"]
    assert {"prompt", "erasure", "naopc", "pairs", "curves", "sample"} <= set(flow["numbers"])
    assert {"families", "range_check", "n_documents", "n_predictions", "most_faithful"} <= set(
        flow["numbers"]["erasure"]
    )
    assert flow["params"]["status"] == "exploratory" and flow["params"]["erasure"]["positions"] == [15]
    assert any(
        f["kind"] == "HTMLView" and f["data"]["position"] == flow["numbers"]["prompt"]["position"]
        for f in flow["figures"]
    )
    page = paths["html"].read_text(encoding="utf-8")
    assert '<section id="flow">' in page and page.count('class="gl-flow-node') >= 1  # the routes view, embedded
    # the sample is stated, and no table verdict is shown without the protocol's sample
    sample = flow["numbers"]["sample"]
    assert f"n = {sample['n_windows']} corpus windows" in flow["claims"][0]["verdict"]
    [pairs] = [rows for caption, rows in flow["tables"].items() if caption.startswith("paired differences")]
    assert pairs["rows"] and all(
        r["verdict"] == f"indicative (n = {sample['n_windows']} corpus windows)" or r["verdict"] == "not testable"
        for r in pairs["rows"]
    )


def test_quick_flow_and_per_term_sizes_on_smollm2_windows():
    """The sizes the quick report uses on SmolLM2's 64-token windows (the report's quick defaults),
    without loading a model: the prediction at 15 on the first 3 windows, one per-term position on
    each of the first 3; each section's quick-mode line names what it left out."""
    from types import SimpleNamespace

    from geolens.report.sections import faithfulness as faith
    from geolens.report.sections import flow

    config = ReportConfig.quick_defaults()
    ctx = SimpleNamespace(
        tokens=torch.zeros(config.n_sequences, config.seq_len, dtype=torch.long), config=config
    )  # the corpus windows
    p = flow.params(ctx)
    assert p.erasure.positions == (15,) and "integrated_gradients" not in p.erasure.methods and flow.n_windows(ctx) == 3
    full = flow.params(SimpleNamespace(tokens=ctx.tokens, config=ReportConfig()))
    assert full.erasure.positions == (15, 31, 63) and set(full.erasure.methods) >= {
        "integrated_gradients",
        "value_zeroing_rollout",
    }
    # the full report's gradient methods: the prefix-mean baseline, version 3's local grid capped at 96 gradients
    e = full.erasure
    assert (e.ig_baseline, e.ig_tolerance, e.ig_max_steps, e.ig_grid) == ("prefix_mean", 0.01, 96, "local")
    many = SimpleNamespace(tokens=torch.zeros(63, 128, dtype=torch.long), config=ReportConfig())
    assert (
        flow.n_windows(many) == 16
        and flow.params(many).erasure.positions == (15, 31, 63)
        and faith.per_term_windows(many).shape[0] == 24
        and faith.per_term_params(SimpleNamespace(tokens=many.tokens, config=ReportConfig())).n_positions == 1
    )
    assert faith.per_term_params(ctx).n_positions == 1 and faith.per_term_windows(ctx).shape[0] == 3
    assert faith.per_term_params(ctx).query_range(config.seq_len) == (8, 62)
    assert faith.quick_sample(ctx).startswith("per-term effects on 3 of 8 windows")
    assert flow.quick_sample(ctx).startswith("the erasure test on 3 of 8 windows")
    assert "integrated gradients" in flow.quick_sample(ctx)


def test_doctests_of_the_flow_section_and_the_faithfulness_pipeline():
    import doctest

    import geolens.pipelines.faithfulness
    import geolens.report.sections.flow

    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for module in (geolens.report.sections.flow, geolens.pipelines.faithfulness):
        tests = [t for t in doctest.DocTestFinder().find(module) if t.examples]
        assert tests, module.__name__
        for t in tests:
            runner.run(t)
    assert runner.summarize(verbose=False).failed == 0


def test_the_integrated_gradients_note_states_baseline_and_completeness():
    """The sentence comes from the run's summary: the share within tolerance as a count of the
    predictions, or the median gap at fixed steps; nothing when integrated gradients did not run."""
    from geolens.flow import ErasureSettings
    from geolens.report.sections.flow import ig_note

    adaptive = ErasureSettings(ig_baseline="prefix_mean", ig_tolerance=0.01, ig_max_steps=96)
    summary = {"n_predictions": 48, "ig_completeness": {"share_within_tolerance": 45 / 48, "max_steps_used": 96}}
    note = ig_note(summary, adaptive)
    assert (
        "prefix-mean baseline" in note
        and "within 1% of completeness in 45 of 48 predictions (at most 96 steps)" in note
    )
    local = ErasureSettings(ig_baseline="prefix_mean", ig_tolerance=0.01, ig_max_steps=96, ig_grid="local")
    assert "(at most 96 gradients, local grid of docs/flow/v3/PROTOCOL.md)" in ig_note(summary, local)
    fixed = ErasureSettings(ig_steps=32)
    note = ig_note({"n_predictions": 3, "ig_completeness": {"median_rel_gap": 0.21}}, fixed)
    assert "erased prefix" in note and "median relative completeness gap is 0.21 at 32 steps" in note
    without = ErasureSettings(methods=("random", "contribution"))
    assert ig_note(summary, without) == "" and ig_note({"n_predictions": 3}, adaptive) == ""


@pytest.mark.skipif(
    importlib.util.find_spec("gensim") is None,
    reason="the full section's unigram replacement counts the Lee corpus, which ships in the gensim wheel",
)
def test_the_full_flow_section_runs_version_3s_gradient_methods():
    """A full (not quick) report's flow section on the tiny model: integrated gradients from the
    prefix-mean baseline on version 3's local grid; the section's sentence equals its run's completeness."""
    from conftest import make_tiny

    from geolens.report import build_report
    from report.conftest import tiny_inputs

    model = make_tiny("gqa")
    tokens, config = tiny_inputs(model)
    config.quick, config.sections = False, ["flow"]
    report = build_report(model, tokens, config, progress=False)
    sec = report_section(report, "flow")
    erasure, settings = sec.numbers["erasure"], sec.params["erasure"]
    assert (settings["ig_baseline"], settings["ig_tolerance"], settings["ig_max_steps"]) == ("prefix_mean", 0.01, 96)
    ic, n = erasure["ig_completeness"], erasure["n_predictions"]
    assert settings["ig_grid"] == ic["grid"] == "local" and 32 <= ic["max_steps_used"] <= 96
    within = round(ic["share_within_tolerance"] * n)
    assert f"within 1% of completeness in {within} of {n} predictions" in sec.intro
