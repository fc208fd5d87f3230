"""geolens.report: the attention-vs-contribution statistics against loops, and the report end to end."""

from __future__ import annotations

import json
import re

import pytest
import reference
import torch

from geolens.report import (
    ContributionContrast,
    ReportConfig,
    available_sections,
    build_report,
    contrast_samples,
    render_html,
    write_report,
)
from geolens.runner import run_corpus
from geolens.testing import tiny_tokens
from geolens.viz.common import circuitsvis_bundle


def _naive_contrast(model, cache):
    """Per (layer, head): lists of the four measures for every (sequence, query ≥ 1), by loops."""
    out = {}
    for l in range(model.cfg.n_layers):
        pattern, _, _ = reference.raw_tensors(model, cache, l)
        c = reference.contributions(model, cache, l, "intra")
        b, h, n, _ = pattern.shape
        for hi in range(h):
            rows = {"sink_attention": [], "sink_contribution": [], "top1_agreement": [], "negative_share": []}
            for bi in range(b):
                for i in range(1, n):
                    a_row, c_row = pattern[bi, hi, i, : i + 1].tolist(), c[bi, hi, i, : i + 1].tolist()
                    best_a = max(range(i + 1), key=lambda j: (a_row[j], -j))
                    best_c = max(range(i + 1), key=lambda j: (c_row[j], -j))
                    rows["sink_attention"].append(a_row[0])
                    rows["sink_contribution"].append(c_row[0])
                    rows["top1_agreement"].append(float(best_a == best_c))
                    rows["negative_share"].append(sum(v < 0 for v in c_row) / (i + 1))
            out[l, hi] = rows
    return out


def test_contrast_matches_loops_and_streams_over_batches(tiny):
    model, tokens, cache = tiny
    naive = _naive_contrast(model, cache)
    whole = ContributionContrast.for_model(model)
    run_corpus(model, tokens, [whole], batch_size=1, progress=False)  # two batches of one sequence
    frame = whole.per_head()
    for (l, h), rows in naive.items():
        got = frame[(frame["layer"] == l) & (frame["head"] == h)].iloc[0]
        assert got["n_queries"] == len(rows["sink_attention"])
        for name, values in rows.items():
            # top-1 ties between float32 and float64 values are not an issue on random models
            assert got[name] == pytest.approx(sum(values) / len(values), abs=2e-5), (l, h, name)
    overall = whole.overall()
    assert overall["sink_attention"] == pytest.approx(frame["sink_attention"].mean())
    assert 0 <= overall["negative_share"] < 1


def test_contrast_merge_and_state_round_trip(tiny_gqa):
    model, tokens, _ = tiny_gqa
    a, b, whole = (ContributionContrast.for_model(model) for _ in range(3))
    run_corpus(model, tokens[:1], [a], progress=False)
    run_corpus(model, tokens[1:], [b], progress=False)
    run_corpus(model, tokens, [whole], progress=False)
    a.merge(b)
    for name in ("sink_attention", "top1_agreement"):
        torch.testing.assert_close(getattr(a, name).mean, getattr(whole, name).mean)
    restored = ContributionContrast.for_model(model).load_state_dict(a.state_dict())
    torch.testing.assert_close(restored.negative_share.m2, a.negative_share.m2)
    with pytest.raises(ValueError, match="cannot merge"):
        a.merge(ContributionContrast(3, 4))
    with pytest.raises(ValueError, match="no batch"):
        ContributionContrast(2, 4).overall()


def test_contrast_samples_rejects_bad_shapes():
    with pytest.raises(ValueError, match="square"):
        contrast_samples(torch.zeros(1, 1, 2, 3), torch.zeros(1, 1, 2, 3))
    with pytest.raises(ValueError, match="two positions"):
        contrast_samples(torch.ones(1, 1, 1, 1), torch.ones(1, 1, 1, 1))


@pytest.fixture(scope="module")
def tiny_report(tmp_path_factory):
    from conftest import make_tiny

    model = make_tiny("gqa")
    tokens = tiny_tokens(model, ("the cat sat on the mat.", "a dog ran far away!!", "one two three"), length=16)
    config = ReportConfig(model="tiny-gqa", corpus="tiny", batch_size=2, n_heldout=1, prompt="the cat sat on the mat", quick=True)
    report = build_report(model, tokens, config, progress=False)
    out = tmp_path_factory.mktemp("report")
    paths = write_report(report, out)
    return model, report, paths


def test_report_is_self_contained(tiny_report):
    _, report, paths = tiny_report
    page = paths["html"].read_text(encoding="utf-8")
    assert circuitsvis_bundle()[:5000] in page and page.count("var CircuitsVis") == 1
    assert not re.search(r"<script[^>]*\bsrc\s*=", page), "no script is fetched"
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", page), "no external resource"
    assert "unpkg.com" not in page
    assert 'src="data:image/png;base64,' in page
    assert page.count('class="geolens-circuitsvis"') >= 3
    for s in report.sections:
        assert f'<section id="{s.key}">' in page
    assert page == render_html(report)


def test_report_json_has_every_section_numbers_and_versions(tiny_report):
    model, report, paths = tiny_report
    data = json.loads(paths["json"].read_text())
    for key in ("torch", "transformers", "transformer_lens", "geolens", "circuitsvis", "model_mode"):
        assert data["versions"][key]
    assert data["params"]["n_sequences"] == 2 and data["params"]["n_heldout"] == 1 and data["params"]["seq_len"] == 16
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
    assert sink["holds"] == (overall["sink_contribution"] < overall["sink_attention"])
    assert f"{overall['sink_attention']:.3f}" in sink["measured"]
    assert len(data["claims"]) == sum(len(s["claims"]) for s in data["sections"].values())


def test_report_example_heatmaps_hold_the_prompt_contributions(tiny_report):
    model, report, _ = tiny_report
    import geolens

    section = next(s for s in report.sections if s.key == "contributions")
    heat = next(f for f in section.figures if getattr(f, "components", None) and f.components[0].name == "AttentionHeads")
    prompt = model.to_tokens("the cat sat on the mat", prepend_bos=True)
    _, cache = model.run_with_cache(prompt)
    c = geolens.contribution_weights(model, cache, heat.data["layer"], mode="intra")[0]
    torch.testing.assert_close(heat.data["contribution"], c.double(), atol=1e-6, rtol=0)


def test_unknown_section_is_an_error(tiny_gqa):
    model, tokens, _ = tiny_gqa
    with pytest.raises(ValueError, match="unknown report sections"):
        build_report(model, tokens, ReportConfig(sections=["nope"]), progress=False)
    with pytest.raises(ValueError, match="seq_len"):
        build_report(model, tokens[:, :1], ReportConfig(), progress=False)
    with pytest.raises(ValueError, match="n_heldout"):
        build_report(model, tokens, ReportConfig(n_heldout=2), progress=False)


def test_report_command_is_registered(capsys):
    from geolens.cli import build_parser, main

    args = build_parser().parse_args(["report", "--quick", "--out", "x", "--n-sequences", "4"])
    assert args.quick and args.n_sequences == 4 and args.out == "x"
    assert main(["report", "--list-sections"]) == 0
    assert "contributions" in capsys.readouterr().out.split()
    config = ReportConfig.quick_defaults(n_sequences=4, seq_len=None)
    assert config.quick and config.n_sequences == 4 and config.seq_len == ReportConfig.quick_defaults().seq_len


def _section_json(paths, key: str, module: str) -> dict:
    """Section ``key`` of the report's JSON; skips the test when ``module`` is not installed (no such section)."""
    data = json.loads(paths["json"].read_text())
    if key not in data["sections"]:
        pytest.skip(f"{module} is not installed")
    return data["sections"][key]


def test_sink_claims_follow_the_sink_numbers(tiny_report):
    import numpy as np

    _, _, paths = tiny_report
    sec = _section_json(paths, "sinks", "geolens.sinks")
    ratios = [r["value_norm_ratio"] for r in sec["numbers"]["geometry_heads"]["rows"]]
    [norm_claim] = [c for c in sec["claims"] if "3–10×" in c["claim"]]
    assert norm_claim["numbers"]["value_norm_ratio_median"] == pytest.approx(float(np.median(ratios)))
    assert norm_claim["holds"] == (float(np.median(ratios)) <= 1 / 3)
    [drift_claim] = [c for c in sec["claims"] if "semantic cone" in c["claim"]]
    rows = {r["lambda"]: r for r in sec["numbers"]["drift_summary"]["rows"]}
    assert drift_claim["numbers"]["delta_ppl"] == pytest.approx(rows[0.0]["delta_ppl"])
    assert drift_claim["holds"] == (rows[0.0]["delta_ppl"] > 0 and rows[0.0]["cos_cone_low_norm"] > rows[1.0]["cos_cone_low_norm"])


def test_every_claim_carries_its_numbers_and_a_criterion(tiny_report):
    _, report, _ = tiny_report
    assert report.claims
    for c in report.claims:
        assert c.numbers and c.criterion and c.measured, c.claim
        assert c.holds in (True, False, None)


def test_faithfulness_and_pruning_claims_follow_their_tables(tiny_report):
    _, report, _ = tiny_report
    sections = {s.key: s for s in report.sections}
    if "faithfulness" in sections:
        pairs = sections["faithfulness"].numbers["pairs"]
        comp = pairs[(pairs.direction == "comprehensiveness") & (pairs.quantity == "delta_logprob") & pairs.claimed]
        [claim] = [c for c in sections["faithfulness"].claims if "(comprehensiveness)" in c.claim]
        verdicts = set(comp.verdict)
        if verdicts <= {"holds", "tie", "reversed"}:
            assert claim.holds == (verdicts == {"holds"})
        else:  # one quick-mode document, or no range: undecided, never a verdict without a CI
            assert claim.holds is None
    if "pruning" in sections:
        df = sections["pruning"].numbers["curves"]
        mean = df.groupby("order").delta_ppl.mean()
        random_mean = mean[[o for o in mean.index if o.startswith("random")]].mean()
        [claim] = sections["pruning"].claims
        assert claim.holds == (mean["regime"] < random_mean)
        assert claim.numbers["regime"] == pytest.approx(mean["regime"])


def test_quick_corpus_pass_bar_advances_per_batch(tiny_gqa, capsys):
    """The corpus-pass bar counts batches; --quick's 8 windows must give it several steps."""
    from geolens.runner import n_batches, run_corpus
    from geolens.streaming import HeadSinkRate

    model = tiny_gqa[0]
    quick = ReportConfig.quick_defaults()
    assert n_batches(quick.n_sequences, quick.batch_size) >= 4
    tokens = tiny_tokens(model, ("the cat sat on the mat.", "a dog ran far away!!") * 4, length=8)
    run_corpus(model, tokens[: quick.n_sequences], [HeadSinkRate(model.cfg.n_layers, model.cfg.n_heads)],
               batch_size=quick.batch_size, desc="corpus pass")  # fmt: skip
    err = capsys.readouterr().err
    steps = {int(m) for m in re.findall(r"corpus pass:.*?\| *(\d+)/4", err)}
    assert {1, 2, 3, 4} <= steps, err[-500:]


def test_taxonomy_section_shows_the_offset_statistic(tiny_report):
    _, report, paths = tiny_report
    sec = _section_json(paths, "taxonomy", "geolens.taxonomy")
    rows = sec["numbers"]["heads"]["rows"]
    assert {"top_offset", "top_offset_share", "label", "offset_dominant"} <= set(rows[0])
    dominated = [r["label"] for r in rows if r["offset_dominant"]]
    assert sec["numbers"]["offset_dominated"]["labels"] == dominated
    assert all(lab.startswith("Reset (offset −") for lab in dominated)
    assert sec["params"]["queries"] == "all"
    page = paths["html"].read_text(encoding="utf-8")
    assert "offset-dominated heads" in page and "window prefixes" in page


def test_sample_size_rule():
    from geolens.report.build import LOW_POWER_MIN_WINDOWS, describe_sample, sample_size

    assert LOW_POWER_MIN_WINDOWS == 20
    assert not sample_size(20)["low_power"] and not sample_size(64, n_seeds=3)["low_power"]
    assert sample_size(19)["low_power_reason"] == "19 < 20 windows"
    one = sample_size(64, windows="held-out windows", n_seeds=1)
    assert one["low_power"] and one["low_power_reason"] == "one seed"
    assert describe_sample(one) == "n = 64 held-out windows, 1 seed; LOW POWER: one seed"
    assert describe_sample(sample_size(32)) == "n = 32 corpus windows"
    with pytest.raises(ValueError, match="n_seeds"):
        sample_size(10, n_seeds=0)


def test_every_verdict_shows_its_sample_size(tiny_report):
    _, report, paths = tiny_report
    data = json.loads(paths["json"].read_text())
    page = paths["html"].read_text(encoding="utf-8")
    for c in data["claims"]:
        sample = c["numbers"]["sample"]
        assert sample["n_windows"] >= 1 and sample["low_power"] == (sample["n_windows"] < 20 or sample["n_seeds"] == 1)
        assert c["measured"].endswith("]") and "n = " in c["measured"]
        if c["section"] in ("faithfulness", "pruning"):
            assert sample["windows"] == "held-out windows" and sample["n_windows"] == 1
        elif "semantic cone" not in c["claim"]:
            assert sample == {"n_windows": 2, "windows": "corpus windows", "n_seeds": None, "low_power": True, "low_power_reason": "2 < 20 windows"}
        if c["section"] == "pruning":
            assert sample["n_seeds"] == 1 and "one seed" in sample["low_power_reason"]
    assert data["params"]["n_low_power_claims"] == len(data["claims"])  # 2 windows: every verdict is low power
    assert page.count("LOW POWER") >= len(data["claims"])
