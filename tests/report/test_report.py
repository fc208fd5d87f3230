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


TEXTS = ("the cat sat on the mat.", "a dog ran far away!!", "one two three")


def _tiny_inputs(model):
    """The tiny report's windows and configuration (2 corpus windows, 1 held out, 16 tokens)."""
    tokens = tiny_tokens(model, TEXTS, length=16)
    config = ReportConfig(
        model="tiny-gqa", corpus="tiny", batch_size=2, n_heldout=1, prompt="the cat sat on the mat", quick=True
    )
    return tokens, config


def _context(model):
    """The context every section of the tiny report was built with."""
    from geolens.report import ReportContext

    tokens, config = _tiny_inputs(model)
    return ReportContext(model=model, tokens=tokens[:-1], heldout=tokens[-1:], config=config, progress=False)


@pytest.fixture(scope="module")
def tiny_report(tmp_path_factory):
    from conftest import make_tiny

    model = make_tiny("gqa")
    tokens, config = _tiny_inputs(model)
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
    assert data["params"]["report_seconds"] >= data["params"]["corpus_pass_seconds"] >= 0
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


def test_report_example_heatmaps_hold_the_prompt_contributions(tiny_report):
    model, report, _ = tiny_report
    import geolens

    section = next(s for s in report.sections if s.key == "contributions")
    heat = next(
        f for f in section.figures if getattr(f, "components", None) and f.components[0].name == "AttentionHeads"
    )
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
    assert norm_claim["criterion_met"] == (float(np.median(ratios)) <= 1 / 3)
    [drift_claim] = [c for c in sec["claims"] if "semantic cone" in c["claim"]]
    rows = {r["lambda"]: r for r in sec["numbers"]["drift_summary"]["rows"]}
    assert drift_claim["numbers"]["delta_ppl"] == pytest.approx(rows[0.0]["delta_ppl"])
    assert drift_claim["criterion_met"] == (
        rows[0.0]["delta_ppl"] > 0 and rows[0.0]["cos_cone_low_norm"] > rows[1.0]["cos_cone_low_norm"]
    )


def test_every_claim_carries_its_numbers_and_a_criterion(tiny_report):
    _, report, _ = tiny_report
    assert report.claims
    for c in report.claims:
        assert c.numbers and c.criterion and c.measured, c.claim
        assert c.holds in (True, False, None)


@pytest.fixture(scope="module")
def full_faithfulness(tmp_path_factory):
    """The faithfulness section of a full (not quick) report on the tiny model: protocol 2's
    per-term endpoint, then protocol 1's superseded curves in an appendix."""
    from conftest import make_tiny

    model = make_tiny("gqa")
    tokens, config = _tiny_inputs(model)
    config.quick, config.sections = False, ["faithfulness"]
    report = build_report(model, tokens, config, progress=False)
    return report, write_report(report, tmp_path_factory.mktemp("full"))


def test_full_report_keeps_protocol_1_only_in_a_labelled_appendix(full_faithfulness):
    report, paths = full_faithfulness
    assert [s.key for s in report.sections] == ["faithfulness", "faithfulness_protocol1"]
    current, appendix = report.sections
    assert appendix.appendix and not current.appendix and appendix.title.startswith("Appendix:")
    assert "superseded" in appendix.title and appendix.intro.startswith("<b>Superseded.</b>")
    assert "curves" not in current.numbers and not current.figures
    assert all("superseded" in c.claim for c in appendix.claims) and appendix.claims
    assert not any("superseded" in c.claim for c in current.claims)
    data = json.loads(paths["json"].read_text())
    assert data["sections"]["faithfulness_protocol1"]["appendix"] is True
    assert not any(f["section"] == "faithfulness_protocol1" for f in data["first_screen"]["findings"])
    page = paths["html"].read_text(encoding="utf-8")
    assert (
        page.index('<section id="faithfulness">')
        < page.index('<section id="faithfulness_protocol1" class="appendix">')
        < page.index('<section id="run">')
    )


def test_faithfulness_and_pruning_claims_follow_their_tables(tiny_report, full_faithfulness):
    _, report, _ = tiny_report
    sections = {s.key: s for s in report.sections + full_faithfulness[0].sections[1:]}
    if "faithfulness_protocol1" in sections:
        pairs = sections["faithfulness_protocol1"].numbers["pairs"]
        comp = pairs[(pairs.direction == "comprehensiveness") & (pairs.quantity == "delta_logprob") & pairs.claimed]
        [claim] = [c for c in sections["faithfulness_protocol1"].claims if "(comprehensiveness)" in c.claim]
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
        elif c["section"] == "faithfulness":  # the per-term endpoint, on the corpus windows
            assert sample == {
                "n_windows": 2,
                "windows": "corpus windows",
                "n_seeds": None,
                "minimum": 100,
                "low_power": True,
                "low_power_reason": "2 < 100 corpus windows",
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


# Verdict words that need a CI-decided claim on enough data (geolens.claims), as the page and the
# command print them.
VERDICT = re.compile(r"\bholds\b|does not hold", re.IGNORECASE)


def _verdict_cells(page: str) -> list[str]:
    """The text of the verdict column (the 4th cell) of every row of the page's claim table."""
    table = page.split('<section id="claims">', 1)[1].split("</section>", 1)[0]
    rows = re.findall(r"<tr><td>.*?</tr>", table, re.S)
    return [re.sub(r"<[^>]+>", "", re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)[3]) for row in rows]


def test_no_verdict_without_a_confidence_interval_in_the_page(tiny_report):
    _, report, paths = tiny_report
    page = paths["html"].read_text(encoding="utf-8")
    cells = _verdict_cells(page)
    assert len(cells) == len(report.claims) and cells
    assert not [c for c in cells if VERDICT.search(c)], cells
    indicative = [c for c in cells if c.startswith("indicative (n = ")]
    assert "indicative (n = 2 corpus windows)" in cells and len(indicative) == sum(
        c.holds is not None or c.ci for c in report.claims
    )
    assert {c for c in cells if not c.startswith("indicative (n = ")} <= {"descriptive"}


def test_a_claim_decided_by_intervals_on_enough_windows_reads_its_verdict(tiny_report):
    """The other side of the rule, in the same page template: the verdict is shown when it is due."""
    from geolens.claims import Claim, sample_size
    from geolens.report import Report, Section

    _, report, _ = tiny_report
    claims = [
        Claim(
            "A is above B",
            "paper A §3.1",
            "Δ = +0.3 [+0.1, +0.5]",
            True,
            "95% CI above 0",
            {"sample": sample_size(64)},
            ci=True,
        ),
        Claim(
            "C is above D",
            "paper A §3.1",
            "Δ = −0.2 [−0.4, +0.1]",
            False,
            "95% CI above 0",
            {"sample": sample_size(64)},
            ci=True,
        ),
        Claim("E is above F", "paper A §3.1", "Δ = +0.3", True, "Δ > 0", {"sample": sample_size(64)}),  # no CI
        Claim(
            "G is above H",
            "paper A §3.1",
            "Δ = +0.3 [+0.1, +0.5]",
            True,
            "95% CI above 0",
            {"sample": sample_size(19)},
            ci=True,
        ),
    ]
    page = render_html(Report([Section("s", "S", "intro", claims=claims)], dict(report.params), dict(report.versions)))
    assert _verdict_cells(page) == [
        "holds (n = 64 corpus windows)",
        "does not hold (n = 64 corpus windows)",
        "indicative (n = 64 corpus windows)",
        "indicative (n = 19 corpus windows)",
    ]
    assert '<span class="holds">holds (n = 64' in page and '<span class="fails">does not hold (n = 64' in page
    assert (
        'title="no confidence interval">indicative (n = 64' in page
        and 'title="below the minimum sample: 19 &lt; 20 corpus windows"' in page
    )


def test_quick_report_command_prints_no_verdict_without_a_ci(tmp_path, capsys):
    """``geolens report --quick`` on a tiny model: every printed claim line reads indicative (n = …)
    or descriptive, never [holds] / [does not hold]; the same in its HTML page."""
    from geolens.cli import main

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(
        "\n\n".join(f"The cat number {i} sat on the mat and looked at the dog far away." * 3 for i in range(6)),
        encoding="utf-8",
    )
    out = tmp_path / "out"
    args = [
        "report",
        "--quick",
        "--model",
        "tiny-gqa",
        "--corpus",
        str(corpus),
        "--n-sequences",
        "3",
        "--seq-len",
        "24",
        "--no-progress",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    printed = capsys.readouterr().out.split("paper claim → measured", 1)[1]
    lines = [line.strip() for line in printed.splitlines() if line.startswith("  [")]
    data = json.loads((out / "report.json").read_text())
    assert len(lines) == len(data["claims"]) >= 10
    verdicts = [line[: line.index("]") + 1] for line in lines]  # "[indicative (n = 3 corpus windows)]"
    assert not [v for v in verdicts if VERDICT.search(v)], verdicts
    assert all(v == "[descriptive]" or v.startswith("[indicative (n = ") for v in verdicts), verdicts
    assert "[indicative (n = 3 corpus windows)]" in verdicts
    assert "[indicative (n = 1 held-out windows, 1 seed)]" in verdicts  # pruning
    # the contribution-flow claims and the per-term endpoint's claims, decided by intervals, read indicative with their n
    flow = [line for line in lines if "Contribution flow attributes" in line]
    per_term = [line for line in lines if "measured effect" in line]
    assert flow and len(per_term) == 2 and all(line.startswith("[indicative (n = ") for line in flow + per_term), (
        flow + per_term
    )
    cells = _verdict_cells((out / "report.html").read_text(encoding="utf-8"))
    assert [f"[{c}]" for c in cells] == verdicts


# --- contribution flow and the per-term endpoint: the sections show what their pipelines return ------------


def _section(report, key: str):
    return next(s for s in report.sections if s.key == key)


def test_flow_section_shows_the_pipelines_own_numbers(tiny_report):
    """Same windows and settings through the pipeline ``geolens flow`` runs: the same tables, claims
    and prompt attribution; the prompt's rows equal geolens.contribution_flow on a fresh cache."""
    import pandas as pd

    import geolens
    from geolens.flow import flow_names_filter
    from geolens.pipelines.flow import LISTED, run_flow
    from geolens.report.sections import flow as section_module

    model, report, paths = tiny_report
    sec = _section(report, "flow")
    ctx = _context(model)
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
    sec = _section(report, "faithfulness")
    ctx = _context(model)
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


def test_quick_flow_and_per_term_sizes_on_smollm2_windows():
    """The sizes the quick report uses on SmolLM2's 64-token windows (the report's quick defaults),
    without loading a model: the prediction at 15, one per-term position per window."""
    from types import SimpleNamespace

    from geolens.report.sections import faithfulness as faith
    from geolens.report.sections import flow

    config = ReportConfig.quick_defaults()
    ctx = SimpleNamespace(
        tokens=torch.zeros(config.n_sequences, config.seq_len, dtype=torch.long), config=config
    )  # the corpus windows
    p = flow.params(ctx)
    assert p.erasure.positions == (15,) and "integrated_gradients" not in p.erasure.methods and flow.n_windows(ctx) == 8
    full = flow.params(SimpleNamespace(tokens=ctx.tokens, config=ReportConfig()))
    assert full.erasure.positions == (15, 31, 63) and set(full.erasure.methods) >= {
        "integrated_gradients",
        "value_zeroing_rollout",
    }
    many = SimpleNamespace(tokens=torch.zeros(63, 128, dtype=torch.long), config=ReportConfig())
    assert (
        flow.n_windows(many) == 16
        and flow.params(many).erasure.positions == (15, 31, 63)
        and faith.per_term_windows(many).shape[0] == 32
    )
    assert faith.per_term_params(ctx).n_positions == 1 and faith.per_term_windows(ctx).shape[0] == 8
    assert faith.per_term_params(ctx).query_range(config.seq_len) == (8, 62)


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


# --- a report a researcher scans: the first screen, citations, intervals, parameters ---------------------------


def _visible_text(page: str) -> str:
    """The page's text without its <head>, scripts, styles and tags (entities left as they are)."""
    body = page.split("</head>", 1)[1]
    body = re.sub(r"<(script|style)\b.*?</\1>", " ", body, flags=re.S)
    return re.sub(r"<[^>]+>", " ", body)


def test_first_screen_has_the_run_findings_and_one_figure_before_the_claims(tiny_report):
    from geolens.report.document import MAX_FINDINGS, headline

    _, report, paths = tiny_report
    page = paths["html"].read_text(encoding="utf-8")
    data = json.loads(paths["json"].read_text())
    first = page.split('<header id="first-screen">', 1)[1].split("</header>", 1)[0]
    assert page.index('<header id="first-screen">') < page.index('<section id="claims">')
    run = data["first_screen"]["run"]
    assert run["model"] == "tiny-gqa" and run["n_windows"] == 2 and run["n_tokens"] == 3 * 16
    for text in ("tiny-gqa", "2 windows × 16 tokens", "48 tokens", f"geolens {report.versions['geolens']}", "built in"):
        assert text in first, text
    findings = data["first_screen"]["findings"]
    assert 3 <= len(findings) <= MAX_FINDINGS and len(findings) == len(headline(report))
    items = re.findall(r'<li class="finding">(.*?)</li>', first, re.S)
    assert len(items) == len(findings)
    for item, f in zip(items, findings):
        assert f["estimate"] in item and f["sample"] in item and f'href="#{f["section"]}"' in item
        assert f"n = {f['n']} " in f["sample"]
        assert (f["ci_low"] is None) == ("[" not in f["estimate"])  # the JSON keeps the interval the page prints
    assert first.count("<img ") == 1  # one figure, a matplotlib one
    fig = data["first_screen"]["figure"]
    assert fig["title"] == data["sections"][fig["section"]]["figures"][fig["index"]]["title"]


def test_each_full_citation_appears_once_and_claims_cite_by_author_and_year(tiny_report):
    import html

    from geolens.report.citations import REFERENCES, full_citation_html

    _, report, paths = tiny_report
    page = paths["html"].read_text(encoding="utf-8")
    for ref in REFERENCES:
        assert page.count(full_citation_html(ref)) == 1, ref.key
        assert page.count(html.escape(ref.title)) == 1, ref.key  # nowhere else either (not in the claim table)
    table = page.split('<section id="claims">', 1)[1].split("</section>", 1)[0]
    rows = re.findall(r"<tr><td>.*?</tr>", table, re.S)
    assert len(rows) == len(report.claims)
    for row in rows:
        source = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)[1]
        links = re.findall(r'<a href="#ref-([a-z0-9]+)">([^<]+)</a>', source)
        assert links, source
        for key, text in links:
            assert f'<li id="ref-{key}">' in page and re.search(r"\b(19|20)\d\d\b", text), (key, text)


INTERVAL = re.compile(r"\[([+\-−]?\d[\d.eE+\-−]*%?), ([+\-−]?\d[\d.eE+\-−]*%?)\]")


def test_no_interval_of_zero_width_or_from_one_window_is_printed(tiny_report):
    import pandas as pd

    from geolens.claims import Claim, sample_size
    from geolens.report import Report, Section
    from geolens.report.document import Finding, _interval_columns

    _, report, paths = tiny_report
    page, data = paths["html"].read_text(encoding="utf-8"), json.loads(paths["json"].read_text())
    intervals = INTERVAL.findall(_visible_text(page))
    assert intervals and not [(a, b) for a, b in intervals if a == b]
    for c in data["claims"]:
        if c["numbers"]["sample"]["n_windows"] < 2:
            assert not INTERVAL.search(c["measured"]), c["measured"]
    n_pairs = 0
    for key, section in data["sections"].items():  # the tables' interval columns, as shown (report.json = page)
        for caption, table in section["tables"].items():
            for lo, hi in _interval_columns(table["columns"]):
                for row in table["rows"]:
                    n_pairs += row[lo] is not None
                    assert row[lo] is None or f"{row[lo]:.4g}" != f"{row[hi]:.4g}", (key, caption, lo, row)
    assert n_pairs
    # a run on one window: the value with "n = 1, no interval", never [+0.214, +0.214]
    one = sample_size(1, windows="held-out windows")
    section = Section(
        "s",
        "S",
        "intro",
        claims=[Claim("X", "paper A §3.1", "Δ = +0.214 [+0.214, +0.214]", True, "CI > 0", {"sample": one}, ci=True)],
        tables=[("t", pd.DataFrame({"layer": [0, 1], "ci_low": [0.5, 0.1], "ci_high": [0.5, 0.3]}))],
        findings=[Finding("One window", "a difference", 0.214, 0.214, 0.214, 1, "held-out windows")],
    )
    small = Report([section], dict(report.params), dict(report.versions))
    page = render_html(small)
    text = _visible_text(page)
    assert "+0.214 (n = 1, no interval)" in text and "[+0.214, +0.214]" not in text
    assert "n = 1 held-out window, no interval" in text
    from geolens.report import report_json

    data = report_json(small)
    assert data["claims"][0]["measured"] == "Δ = +0.214 (n = 1, no interval)"
    rows = data["sections"]["s"]["tables"]["t"]["rows"]
    assert rows[0]["ci_low"] is None and rows[0]["ci_high"] is None and rows[1]["ci_low"] == 0.1
    [finding] = data["first_screen"]["findings"]
    assert finding["ci_low"] is None and finding["estimate"] == "+0.214"
    assert finding["sample"] == "n = 1 held-out window, no interval"


def test_quick_report_shows_no_superseded_protocol(tiny_report):
    _, report, paths = tiny_report
    page = paths["html"].read_text(encoding="utf-8")
    data = json.loads(paths["json"].read_text())
    assert not any(s.appendix for s in report.sections) and 'class="appendix"' not in page
    assert "faithfulness_protocol1" not in data["sections"]
    for key, section in data["sections"].items():
        assert not section["appendix"]
        labels = [f["title"] for f in section["figures"]] + list(section["tables"])
        labels += [c["claim"] for c in section["claims"]]
        assert not [t for t in labels if re.search(r"superseded|protocol 1|all-layer", t, re.I)], key
    faith = data["sections"]["faithfulness"]
    assert "curves" not in faith["numbers"] and "protocol" not in faith["params"]


def test_parameters_render_as_small_tables_not_json(tiny_report):
    from geolens.report.document import param_rows

    _, report, paths = tiny_report
    page = paths["html"].read_text(encoding="utf-8")
    assert "parameters: {" not in page
    tables = re.findall(r'<table class="params"><caption>(.*?)</caption>(.*?)</table>', page, re.S)
    captions = [c for c, _ in tables]
    assert "parameters of this run" in captions and "versions" in captions
    for s in report.sections:
        if not s.params:
            continue
        section = page.split(f'<section id="{s.key}"', 1)[1].split("</section>", 1)[0]
        [(caption, body)] = re.findall(r'<table class="params"><caption>(.*?)</caption>(.*?)</table>', section, re.S)
        assert caption.startswith("parameters (") and caption.endswith(" s)")
        cells = re.findall(r"<tr><td><code>(.*?)</code></td><td>(.*?)</td></tr>", body, re.S)
        assert len(cells) == len(param_rows(s.params)) and cells, s.key
        assert not [v for _, v in cells if re.search(r'[{}]|&#34;|"\s*:', v)], s.key  # no JSON in a cell
    assert param_rows({"a": {"b": 1, "c": [1, 2]}, "d": None, "e": True, "f": 0.25}) == [
        ("a.b", "1"),
        ("a.c", "1, 2"),
        ("d", "none"),
        ("e", "yes"),
        ("f", "0.25"),
    ]
