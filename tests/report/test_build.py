"""Building a report (geolens.report.build): every section's numbers and the versions in report.json,
every claim with its numbers, criterion and sample size, an unknown section refused, the corpus
pass's progress bar per batch, and an analysis two sections ask for run once."""

from __future__ import annotations

import copy
import json
import re

import pytest
import torch

from geolens.report import (
    ReportConfig,
    available_sections,
    build_report,
)
from geolens.testing import tiny_tokens


def test_report_json_has_every_section_numbers_and_versions(tiny_report):
    model, report, paths = tiny_report
    data = json.loads(paths["json"].read_text())
    for key in ("torch", "transformers", "transformer_lens", "geolens", "circuitsvis", "model_mode"):
        assert data["versions"][key]
    assert data["params"]["n_sequences"] == 2 and data["params"]["n_heldout"] == 1 and data["params"]["seq_len"] == 16
    assert data["params"]["report_seconds"] >= data["params"]["corpus_pass_seconds"] >= 0
    # each part's wall and CPU seconds (this process, all threads)
    assert data["params"]["report_cpu_seconds"] >= data["params"]["corpus_pass_cpu_seconds"] >= 0
    assert all(s["cpu_seconds"] >= 0 and s["seconds"] >= 0 for s in data["sections"].values())
    if data["params"]["quick"]:  # what quick mode samples down, one line, in the page's run line too
        line = data["params"]["quick_sample"]
        assert "per-term effects on" in line and line.endswith("the full report keeps the published protocols")
        assert line in paths["html"].read_text()
    assert data["params"]["model_config"]["n_layers"] == model.cfg.n_layers
    assert set(data["sections"]) == {s.key for s in report.sections} == set(available_sections())
    for key, section in data["sections"].items():
        assert section["numbers"], key
        for fig in section["figures"]:
            assert fig["data"], (key, fig["title"])
    # the claim table is built from the section's measured numbers
    contrib = data["sections"]["contributions"]
    overall = contrib["numbers"]["overall"]
    [sink] = [c for c in data["claims"] if c["section"] == "contributions" and c["source"] == "paper A §3.2"]
    assert sink["numbers"]["mean_sink_attention"] == overall["sink_attention"]
    assert sink["criterion_met"] == (overall["sink_contribution"] < overall["sink_attention"])
    assert sink["holds"] is None and sink["decision"] == "indicative"  # a point comparison on 2 windows decides nothing
    assert f"{overall['sink_attention']:.3f}" in sink["measured"]
    assert len(data["claims"]) == sum(len(s["claims"]) for s in data["sections"].values())


def test_unknown_section_is_an_error(tiny_gqa):
    model, tokens, _ = tiny_gqa
    with pytest.raises(ValueError, match="unknown report sections"):
        build_report(model, tokens, ReportConfig(sections=["nope"]), progress=False)
    with pytest.raises(ValueError, match="seq_len"):
        build_report(model, tokens[:, :1], ReportConfig(), progress=False)
    with pytest.raises(ValueError, match="n_heldout"):
        build_report(model, tokens, ReportConfig(n_heldout=2), progress=False)


def test_every_claim_carries_its_numbers_and_a_criterion(tiny_report):
    _, report, _ = tiny_report
    assert report.claims
    for c in report.claims:
        assert c.numbers and c.criterion and c.measured, c.claim
        assert c.holds in (True, False, None)


def test_quick_corpus_pass_bar_advances_per_batch(tiny_gqa, capsys):
    """The corpus-pass bar counts batches; --quick's 8 windows must give it several steps."""
    from geolens.data import n_batches
    from geolens.runner import run_corpus
    from geolens.sinks.norm_curve import NormCurve

    model = tiny_gqa[0]
    quick = ReportConfig.quick_defaults()
    assert n_batches(quick.n_sequences, quick.batch_size) >= 4
    tokens = tiny_tokens(model, ("the cat sat on the mat.", "a dog ran far away!!") * 4, length=8)
    run_corpus(
        model,
        tokens[: quick.n_sequences],
        [NormCurve(model.cfg.n_layers, model.cfg.n_heads)],
        batch_size=quick.batch_size,
        desc="corpus pass",
    )
    err = capsys.readouterr().err
    steps = {int(m) for m in re.findall(r"corpus pass:.*?\| *(\d+)/4", err)}
    assert {1, 2, 3, 4} <= steps, err[-500:]


def test_every_verdict_shows_its_sample_size(tiny_report):
    _, report, paths = tiny_report
    data = json.loads(paths["json"].read_text())
    for c in data["claims"]:
        sample = c["numbers"]["sample"]
        assert sample["n_windows"] >= 1 and sample["low_power"] == (
            sample["n_windows"] < sample["minimum"]
            or sample["n_seeds"] == 1
            or "exploratory run" in sample["low_power_reason"]
        )
        assert "[n = " not in c["measured"]  # the sample goes with the verdict, not into the measurement
        if c["decision"] != "descriptive":
            assert c["verdict"] == f"{c['decision']} (n = {sample['n_windows']} {sample['windows']}" + (
                f", {sample['n_seeds']} seed{'s' if sample['n_seeds'] != 1 else ''})"
                if sample["n_seeds"] is not None
                else ")"
            )
        assert "protocol 1" not in c["claim"] and "superseded" not in c["claim"]  # current protocols only
        if c["section"] == "pruning":
            assert sample["windows"] == "held-out windows" and sample["n_windows"] == 1
        elif c["section"] == "faithfulness":  # protocol 3's per-term endpoint on the corpus windows: an exploratory run
            assert sample == {
                "n_windows": 2,
                "windows": "corpus windows",
                "n_seeds": None,
                "minimum": 100,
                "low_power": True,
                "low_power_reason": "2 < 100 corpus windows; exploratory run: settings differ from the protocol",
            }
        elif c["section"] == "flow":  # windows with a prediction in range; an exploratory run of the erasure protocol
            assert sample["windows"] == "corpus windows" and sample["minimum"] == 100 and sample["n_windows"] <= 2
            assert sample["low_power"] and sample["low_power_reason"].endswith(
                "exploratory run: settings differ from the protocol"
            )
        elif "semantic cone" not in c["claim"]:
            assert sample == {
                "n_windows": 2,
                "windows": "corpus windows",
                "n_seeds": None,
                "minimum": 20,
                "low_power": True,
                "low_power_reason": "2 < 20 corpus windows",
            }
        if c["section"] == "pruning":
            assert sample["n_seeds"] == 1 and "one seed" in sample["low_power_reason"]
    assert data["params"]["n_low_power_claims"] == len(data["claims"])  # 2 windows: every sample is below its minimum
    assert data["params"]["n_decided_claims"] == 0


def test_an_analysis_two_sections_ask_for_runs_once_and_both_get_its_state(tiny_gqa):
    """The taxonomy and pruning sections both read a TaxonomyAnalysis of the same configuration:
    the corpus pass runs it once, and the twin's state equals a pass of its own."""
    from geolens.report.build import shared_analyses
    from geolens.runner import run_corpus
    from geolens.taxonomy import TaxonomyAnalysis

    model, tokens, _ = tiny_gqa
    a, b = TaxonomyAnalysis.for_model(model), TaxonomyAnalysis.for_model(model)
    other = TaxonomyAnalysis.for_model(model, space="projected")
    distinct, twins = shared_analyses([a, other, b])
    assert distinct == [a, other] and twins == [(b, a)]
    run_corpus(model, tokens, distinct, batch_size=1, progress=False)
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    alone = run_corpus(model, tokens, [TaxonomyAnalysis.for_model(model)], batch_size=1, progress=False)[0]
    assert b.result().distribution == alone.result().distribution
    assert torch.equal(b.prefix_counts.total, alone.prefix_counts.total)
    a.prefix_counts.total += 1  # the twin's state is a copy: changing one leaves the other
    assert torch.equal(b.prefix_counts.total, alone.prefix_counts.total)
