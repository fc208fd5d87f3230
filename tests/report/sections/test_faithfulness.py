"""The report's faithfulness section (geolens.report.sections.faithfulness): protocol 3's per-term
endpoint, its numbers the pipeline's own and, recomputed by hand from the run's per-term rows, the
partial Spearman given the norm that the tables show."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from report.conftest import report_section, tiny_context


def _ranks(x) -> np.ndarray:
    return pd.Series(np.asarray(x, dtype=np.float64)).rank(method="average").to_numpy()


def _by_hand(scores, kl, norm) -> tuple[float, float]:
    """(partial Spearman given the norm, plain Spearman) of one position, from the textbook formula
    on numpy's correlation matrix of the average ranks."""
    r = np.corrcoef([_ranks(scores), _ranks(kl), _ranks(norm)])
    r_se, r_sn, r_en = r[0, 1], r[0, 2], r[1, 2]
    return float((r_se - r_sn * r_en) / np.sqrt((1 - r_sn**2) * (1 - r_en**2))), float(r_se)


def test_faithfulness_section_shows_protocol_3_numbers_that_check_by_hand(tiny_report):
    """The section's summary is run_norm_controlled's on the same corpus windows (document index =
    window index, float64 effects, the model back in float32); each metric's mean partial and plain
    Spearman in its table, and each pair's Δ, equal the means over positions recomputed by hand from
    the per-term rows; verdicts read indicative (an exploratory run on 2 windows)."""
    from geolens.pipelines.norm_controlled import run_norm_controlled
    from geolens.report.sections import faithfulness as section_module

    model, report, paths = tiny_report
    sec = report_section(report, "faithfulness")
    ctx = tiny_context(model)
    params = section_module.per_term_params(ctx)
    assert params.n_positions == 1 and params.n_boot == 1000 and params.query_range(16) == (8, 14)
    run = run_norm_controlled(model, section_module.per_term_windows(ctx), params, progress=False)
    summary = sec.numbers["norm_controlled"]
    assert json.dumps(summary, sort_keys=True, default=str) == json.dumps(run.summary, sort_keys=True, default=str)
    assert summary["effects_dtype"] == "float64" and next(model.parameters()).dtype == torch.float32
    terms = run.tables["terms"]
    assert terms.kl.dtype == np.float64 and summary["n_positions"] == 2 and summary["n_documents"] == 2
    assert sorted(terms.document.unique()) == [0, 1] and terms["query"].between(8, 14).all()

    scores = {
        "raw_attention": lambda t: t.raw_attention,
        "contribution": lambda t: t.contribution,
        "contribution_abs": lambda t: t.contribution.abs(),
        "output_normalized_intra": lambda t: t.output_normalized_intra,
        "grad_x_act": lambda t: t.grad_x_act.abs(),
    }
    partial, plain = {m: [] for m in scores}, {m: [] for m in scores}
    for _, part in terms.groupby(["document", "position"]):
        for m, score in scores.items():
            p, s = _by_hand(score(part), part.kl, part.norm)
            partial[m].append(p)
            plain[m].append(s)

    data = json.loads(paths["json"].read_text())["sections"]["faithfulness"]
    assert set(data["numbers"]) == {"norm_controlled", "norm_controlled_sample"}  # tiny-gqa: no published run
    assert data["numbers"]["norm_controlled_sample"]["minimum"] == 100
    assert data["params"]["norm_controlled"]["n_positions_per_document"] == 1
    assert data["params"]["norm_controlled"]["effects_dtype"] == "float64"
    [means] = [
        t for caption, t in data["tables"].items() if caption.startswith("per-term endpoint (protocol 3): mean partial")
    ]
    rows = {r["metric"]: r for r in means["rows"]}
    for m in scores:
        assert rows[m]["partial_spearman"] == pytest.approx(np.mean(partial[m]), abs=1e-12), m
        assert rows[m]["plain_spearman"] == pytest.approx(np.mean(plain[m]), abs=1e-12), m
    for m in ("value_weighted", "output_normalized_inter"):  # the norm, and the norm over one ‖o_i‖: 0 by construction
        assert rows[m]["partial_spearman"] == 0.0
    assert all(r["n_positions"] == 2 and r["n_documents"] == 2 for r in rows.values())

    [pairs] = [
        t
        for caption, t in data["tables"].items()
        if caption.startswith("per-term endpoint (protocol 3): pre-registered")
    ]
    by_pair = {(r["a"], r["b"]): r for r in pairs["rows"]}
    assert len(by_pair) == 9 and all(r["verdict"] == "indicative (n = 2 corpus windows)" for r in pairs["rows"])
    c = np.mean(partial["contribution"])
    assert by_pair[("output_normalized_inter", "contribution")]["estimate"] == pytest.approx(c, abs=1e-12)
    assert by_pair[("raw_attention", "contribution")]["estimate"] == pytest.approx(
        c - np.mean(partial["raw_attention"]), abs=1e-12
    )
    assert by_pair[("raw_attention", "contribution")]["plain_estimate"] == pytest.approx(
        np.mean(plain["contribution"]) - np.mean(plain["raw_attention"]), abs=1e-12
    )

    # the headline: ρ(c) beyond the norm; the intro says what changed from protocol 2
    [finding] = data["findings"]
    assert finding["value"] == pytest.approx(c, abs=1e-12) and finding["n"] == 2
    assert "What changed from protocol 2" in sec.intro and "docs/faithfulness/v3/PROTOCOL.md" in sec.intro
    assert "float64" in sec.intro and "published" not in sec.intro
    assert not data["figures"] and all(
        caption.startswith("per-term endpoint (protocol 3)") for caption in data["tables"]
    )


def test_faithfulness_claims_are_protocol_3s_and_exploratory_in_the_report(tiny_report):
    _, report, _ = tiny_report
    sec = report_section(report, "faithfulness")
    assert [c.decision for c in sec.claims] == ["indicative", "indicative", "descriptive"]
    for c in sec.claims:
        sample = c.numbers["sample"]
        assert sample["n_windows"] == 2 and sample["low_power"]
        assert (
            sample["low_power_reason"] == "2 < 100 corpus windows; exploratory run: settings differ from the protocol"
        )
    assert "beyond its norm" in sec.claims[0].claim and "partial Spearman" in sec.claims[0].measured


def test_published_run_is_quoted_only_for_the_protocols_models(tmp_path):
    """The published protocol-3 summary is read for a protocol model (from docs/, with its n), never
    for another model or when the file is missing."""
    from geolens.report.sections.faithfulness import PUBLISHED, published, published_text

    for name in ("smollm2-135m", "gemma3-270m"):
        pub = published(name)
        saved = json.loads((PUBLISHED / name / "summary.json").read_text())["per_term_effects"]
        [c] = [m for m in saved["norm_controlled"]["metrics"] if m["metric"] == "contribution"]
        assert pub["path"] == f"docs/faithfulness/v3/{name}/summary.json" and pub["label"] == "pre-registered"
        assert (pub["n_positions"], pub["n_documents"]) == (saved["n_positions"], saved["n_documents"])
        assert pub["metrics"]["contribution"]["mean"] == c["mean"]
        text = published_text(pub)
        assert f"{c['mean']:+.3f} [{c['ci_low']:+.3f}, {c['ci_high']:+.3f}]" in text
        assert f"n = {saved['n_positions']} positions of {saved['n_documents']}" in text
    assert published("tiny-gqa") is None and published("smollm2-135m", root=tmp_path) is None
    assert published_text(None) == ""


def test_the_quoted_run_names_its_fragile_verdicts():
    """The quote of the published protocol-3 run says which of its Holm verdicts are fragile under
    the leave-one-out analysis (docs/stability/results/stability.json), and how many are stable."""
    from geolens.report.sections.faithfulness import published, published_text

    pub = published("smollm2-135m")
    assert pub["stability"]["n_tests"] == 9
    assert "per_term_norm_controlled: contribution → contribution_abs" in pub["stability"]["fragile"]
    text = published_text(pub)
    assert "2 of its 9 Holm verdicts are fragile" in text and "contribution → contribution_abs" in text
    stable = published_text(dict(pub, stability=dict(n_tests=9, fragile=[])))
    assert "Each of its 9 Holm verdicts survives leaving out any one document or layer" in stable
