"""The per-term endpoint of protocol 2 (geolens.faithfulness.ground_truth, .preregistered, the command).

The oracle of the metric scores is tests/reference.py (ṽ materialised, loops, float64); the oracle
of the Spearman correlation is a rank-by-counting loop; the measured effects themselves are checked
against hand-built removals in tests/per_term/test_effects.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from reference import _outputs

from geolens.adapter import adapter_for
from geolens.faithfulness.ground_truth import (
    SOURCE_METRICS,
    TERM_METRICS,
    draw_positions,
    ground_truth_document,
    ground_truth_summary,
    single_term_effects,
    spearman,
    top_overlap,
)
from geolens.per_term import per_term_effects, position_effects
from geolens.stats import cluster_bootstrap_indices, percentile_ci, resample_means
from geolens.testing import tiny_tokens

PROTOCOL = Path(__file__).resolve().parents[2] / "docs" / "faithfulness" / "protocol.json"


def naive_spearman(x, y) -> float:
    """Pearson correlation of average ranks, by loops: rank = 1 + #smaller + (#equal − 1)/2."""

    def ranks(v):
        return [1 + sum(w < u for w in v) + (sum(w == u for w in v) - 1) / 2 for u in v]

    a, b = np.array(ranks(list(x)), dtype=float), np.array(ranks(list(y)), dtype=float)
    a, b = a - a.mean(), b - b.mean()
    return float((a * b).sum() / np.sqrt((a * a).sum() * (b * b).sum()))


def test_positions_follow_the_protocol_draw():
    rng = np.random.default_rng([2026, 7])
    expected = []
    for _ in range(20):
        layer = int(rng.integers(0, 30))
        expected.append((layer, int(rng.integers(8, 127))))
    assert draw_positions(7, 30, 20, (8, 126)) == expected
    drawn = draw_positions(3, 18, 500, (8, 126))
    assert {l for l, _ in drawn} == set(range(18)) and min(q for _, q in drawn) == 8 and max(q for _, q in drawn) == 126


def test_spearman_and_top_overlap_against_references():
    rng = np.random.default_rng(0)
    for _ in range(20):
        s, e = rng.random(30), rng.random(30)
        s[:5] = s[0]  # ties get average ranks
        assert spearman(s, e) == pytest.approx(naive_spearman(s, e), abs=1e-12)
    assert spearman(np.ones(5), np.arange(5.0)) == 0.0  # a metric that ranks nothing
    assert np.isnan(spearman(np.arange(5.0), np.ones(5)))  # effects all equal: excluded
    assert (
        top_overlap(np.arange(10.0), np.arange(10.0)) == 1.0 and top_overlap(np.arange(10.0), -np.arange(10.0)) == 0.0
    )


@pytest.fixture(scope="module")
def measured(tiny):
    model = tiny[0]
    tokens = tiny_tokens(model, length=24)[:1]
    rows, positions = ground_truth_document(model, tokens, 5, n_positions=3, queries=(8, 23))
    return model, tokens, rows, positions


def test_rows_equal_naive_scores_against_the_measured_effects(measured):
    model, tokens, rows, positions = measured
    assert len(positions) == 3
    assert len(rows) == 3 * 2 * (len(TERM_METRICS) + len(SOURCE_METRICS))
    _, cache = model.run_with_cache(tokens)
    for p in positions.itertuples():
        pattern, vt, weighted, head_out, layer_out = _outputs(model, cache, p.layer)
        i, n = p.query, p.query + 1
        alpha = pattern[0, :, i, :n]
        value_norm = vt[0, :, :n].norm(dim=-1)
        o_head = head_out[0, :, i]
        o_layer = layer_out[0, i]
        c = torch.stack(
            [
                torch.stack([torch.dot(o_layer, weighted[0, h, i, j]) / torch.dot(o_layer, o_layer) for j in range(n)])
                for h in range(alpha.shape[0])
            ]
        )
        naive = {
            "raw_attention": alpha,
            "value_weighted": alpha * value_norm,
            "output_normalized_intra": alpha * value_norm / o_head.norm(dim=-1)[:, None],
            "output_normalized_inter": alpha * value_norm / o_layer.norm(),
            "contribution": c,
            "contribution_abs": c.abs(),
        }
        # the effects as the run measured them (one clean run, one KV cache of the window): Δp of
        # near-tied terms differs from a separate clean forward's in float32 rounding, enough to
        # swap ranks; the effects themselves are checked against hand-built removals in test_per_term
        with torch.no_grad():
            logits, full = model.run_with_cache(tokens)
            kv = adapter_for(model).prefix_kv_cache(tokens)
        effects = position_effects(model, tokens, p.layer, p.query, clean_run=(logits, full), kv_cache=kv).term
        assert torch.allclose(effects.kl, per_term_effects(model, tokens, p.layer, p.query).kl, atol=1e-7, rtol=1e-4)
        ran = effects.ran.numpy()
        for outcome, effect in (("kl", effects.kl.numpy()), ("delta_p", -effects.delta_p.numpy())):
            for metric, scores in naive.items():
                got = rows[
                    (rows.position == p.position)
                    & (rows.scope == "term")
                    & (rows.outcome == outcome)
                    & (rows.metric == metric)
                ]
                want = naive_spearman(scores.numpy()[ran], effect[ran])
                assert float(got.spearman.iloc[0]) == pytest.approx(want, abs=1e-6), (metric, outcome)
                source = rows[
                    (rows.position == p.position)
                    & (rows.scope == "source")
                    & (rows.outcome == outcome)
                    & (rows.metric == metric)
                ]
                assert int(source.n_terms.iloc[0]) == n


def test_source_scope_effects_and_counts(measured):
    model, tokens, rows, positions = measured
    p = positions.iloc[0]
    effects = per_term_effects(model, tokens, int(p.layer), int(p.query), scope="source")
    got = rows[
        (rows.position == 0) & (rows.scope == "source") & (rows.outcome == "kl") & (rows.metric == "value_zeroing")
    ]
    assert int(got.n_terms.iloc[0]) == int(effects.ran.sum())
    assert set(rows[rows.scope == "term"].metric) == set(TERM_METRICS) and set(
        rows[rows.scope == "source"].metric
    ) == set(SOURCE_METRICS)


def _constructed_rows():
    """Two metrics on 5 documents of 1–4 positions; b better than a by 0.2 everywhere, c = a's ranking."""
    rng = np.random.default_rng(3)
    rows = []
    for d, n in enumerate([1, 4, 2, 3, 2]):
        for p in range(n):
            base = rng.normal(0.3, 0.1)
            for metric, rho, ranking in (
                ("raw_attention", base, "r1"),
                ("value_weighted", base + 0.2, "r2"),
                ("random", base, "r1"),
            ):
                rows.append(
                    dict(
                        document=d,
                        position=p,
                        layer=0,
                        query=8,
                        scope="term",
                        outcome="kl",
                        metric=metric,
                        n_terms=9,
                        excluded=False,
                        spearman=rho,
                        top5=0.4,
                        ranking=ranking,
                    )
                )
    return pd.DataFrame(rows)


def test_summary_resamples_whole_documents_and_forms_one_holm_family():
    rows = _constructed_rows()
    summary = ground_truth_summary(
        rows, [("raw_attention", "value_weighted"), ("random", "raw_attention")], n_boot=300, seed=4
    )
    table = rows.pivot_table(index=["document", "position"], columns="metric", values="spearman")[
        ["raw_attention", "value_weighted", "random"]
    ]
    indices = cluster_bootstrap_indices(table.index.get_level_values("document").to_numpy(), 300, 4)
    lo, hi = percentile_ci(resample_means(table.to_numpy(), indices), 0.95)
    got = {m["metric"]: m for m in summary["metrics"]}
    assert got["value_weighted"]["ci_low"] == pytest.approx(lo[1]) and got["value_weighted"][
        "ci_high"
    ] == pytest.approx(hi[1])
    assert got["raw_attention"]["n_positions"] == 12 and got["raw_attention"]["n_documents"] == 5
    pairs = {(p["a"], p["b"]): p for p in summary["pairs"]}
    vw = pairs[("raw_attention", "value_weighted")]
    assert (
        vw["estimate"] == pytest.approx(0.2)
        and vw["verdict"] == "holds"
        and vw["p_adj"] is not None
        and vw["rank"] == 1
    )
    same = pairs[("random", "raw_attention")]  # identical rankings at every position: out of the family
    assert same["verdict"] == "not testable" and same["p_adj"] is None
    assert summary["multiple_comparison"] == "holm"


def test_single_term_effects_are_medians_by_hand():
    def naive_median(values):
        s = sorted(values)
        n = len(s)
        return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2

    g = np.random.default_rng(3)
    positions = pd.DataFrame(
        dict(kl_term_max=g.exponential(size=7), kl_term_sum=g.exponential(size=7), clean_top_prob=g.uniform(size=7))
    )
    got = single_term_effects(positions)
    assert got["n_positions"] == 7
    assert got["median_kl_of_largest_term"] == naive_median(positions.kl_term_max.tolist())
    assert got["median_kl_of_all_terms_summed"] == naive_median(positions.kl_term_sum.tolist())
    assert got["median_clean_top_prob"] == naive_median(positions.clean_top_prob.tolist())
    even = single_term_effects(positions.iloc[:4])
    assert even["median_clean_top_prob"] == pytest.approx(
        naive_median(positions.clean_top_prob.iloc[:4].tolist()), rel=1e-15
    )


def test_cluster_draws_take_every_position_of_a_drawn_document():
    rows = _constructed_rows()
    documents = rows[rows.metric == "raw_attention"].document.to_numpy()
    for ix in cluster_bootstrap_indices(documents, 50, 1):
        drawn, counts = np.unique(documents[ix], return_counts=True)
        for d, c in zip(drawn, counts):
            assert c % (documents == d).sum() == 0


# ---------------------------------------------------------------------------------------------
# The command


@pytest.fixture
def corpus(tmp_path):
    """A local corpus of two long documents (the TL 2.x environment has no gensim, hence no Lee)."""
    words = "the quick brown fox jumps over the lazy dog while seven wizards quietly judge boxing matches".split()
    docs = [" ".join(words[(k * d) % len(words)] for k in range(400)) for d in (1, 2)]
    path = tmp_path / "docs.txt"
    path.write_text("\n\n".join(docs))
    return str(path)


def test_command_runs_resumes_and_labels_a_small_run_exploratory(tmp_path, capsys, corpus):
    from geolens.cli import main

    out = tmp_path / "run"
    args = [
        "faithfulness",
        "--protocol",
        str(PROTOCOL),
        "--model",
        "tiny-gqa",
        "--corpus",
        corpus,
        "--max-documents",
        "1",
        "--stage",
        "per_term",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["label"] == "exploratory" and any("1 documents" in d for d in summary["differences"])
    assert summary["protocol_sha256"] == (PROTOCOL.parent / "PROTOCOL.sha256").read_text().strip()
    assert summary["protocol"]["masking_scope"] == "layer" and max(summary["protocol"]["fractions"]) <= 0.2
    assert all(p["verdict"] in ("not decided (exploratory)", "not testable") for p in summary["pairs"])
    assert summary["per_term_effects"]["pairs"] == summary["pairs"]  # the README's pairs say so too
    assert summary["preregistration"]["status"] == "exploratory" and summary["preregistration"]["json_sha256"]
    assert summary["per_term_effects"]["n_positions"] == 20
    readme = (out / "README.md").read_text()
    assert summary["command"] in readme and "| contribution_abs |" in readme and "one Holm family" in readme
    assert "Exploratory run, no verdicts" in readme and "| None |" not in readme
    rows = pd.read_csv(out / "per_term_rows.csv.gz")
    # resuming a finished stage recomputes nothing and gives the same summary
    assert main(args + ["--resume"]) == 0
    again = json.loads((out / "summary.json").read_text())
    for got, want in zip(again["per_term_effects"]["metrics"], summary["per_term_effects"]["metrics"]):
        for key, value in want.items():  # read back from CSV text: last-digit rounding
            assert got[key] == (value if isinstance(value, str) else pytest.approx(value, rel=1e-12, abs=1e-12)), key
    assert pd.read_csv(out / "per_term_rows.csv.gz").equals(rows)
    assert "resuming after 1 documents" in capsys.readouterr().out


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--protocol", "nowhere/protocol.json"], "--protocol: protocol nowhere/protocol.json: no such file"),
        (["--protocol", str(PROTOCOL), "--layers", "3"], "--protocol fixes the design; drop --layers"),
        (["--stage", "per_term"], "--stage needs --protocol"),
    ],
)
def test_bad_protocol_options_are_one_line_errors(extra, message, capsys, tmp_path):
    from geolens.cli import main

    assert main(["faithfulness", "--model", "tiny-gqa", "--out", str(tmp_path / "x"), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_stages_run_separately_merge_into_one_summary(tmp_path, corpus):
    """--stage masking, then --stage per_term --resume into the same folder: one summary with both
    endpoints and the ceiling check (a tiny random model is off-distribution everywhere, so the
    masking endpoint is all exclusions and forms no pair)."""
    from geolens.cli import main

    out = tmp_path / "run"
    base = [
        "faithfulness",
        "--protocol",
        str(PROTOCOL),
        "--model",
        "tiny-gqa",
        "--corpus",
        corpus,
        "--max-documents",
        "1",
        "--out",
        str(out),
    ]
    assert main(base + ["--stage", "masking"]) == 0
    first = json.loads((out / "summary.json").read_text())
    assert first["stages"] == {"per_term": "not run", "masking": "complete"} and "ceiling_check" in first
    assert first["ceiling_check"]["n_conditions"] > 0 and first["masking"]["pairs"] == []
    assert main(base + ["--stage", "per_term", "--resume"]) == 0
    both = json.loads((out / "summary.json").read_text())
    assert both["stages"] == {"per_term": "complete", "masking": "complete"}
    assert both["ceiling_check"] == first["ceiling_check"] and both["pairs"] == both["per_term_effects"]["pairs"]
    assert "Per-layer masking endpoint" in (out / "README.md").read_text()


def test_merged_summary_keeps_each_stage_time_and_lists_the_untestable_pairs(tmp_path, corpus):
    """stage_seconds comes from each stage's progress file; a progress file written before timing
    was kept gives way to the earlier summary's time for that stage, never to the wall-clock time of
    the invocation that merged it (the bug that showed SmolLM2's per-term stage as 101 s, not
    5596 s). The pairs that cannot differ by construction are listed as "not testable"."""
    from geolens.cli import main

    out = tmp_path / "run"
    base = [
        "faithfulness",
        "--protocol",
        str(PROTOCOL),
        "--model",
        "tiny-gqa",
        "--corpus",
        corpus,
        "--max-documents",
        "1",
        "--out",
        str(out),
    ]
    assert main(base + ["--stage", "masking"]) == 0
    assert main(base + ["--stage", "per_term", "--resume"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    for stage in ("per_term", "masking"):
        saved = json.loads((out / f"{stage}_progress.json").read_text())
        assert summary["stage_seconds"][stage] == saved["seconds"]
    # the masking progress file as an older version wrote it (no time), its summary holding the time
    progress = json.loads((out / "masking_progress.json").read_text())
    del progress["seconds"]
    (out / "masking_progress.json").write_text(json.dumps(progress))
    summary["stage_seconds"]["masking"] = 1234.5
    (out / "summary.json").write_text(json.dumps(summary))
    assert main(base + ["--stage", "per_term", "--resume"]) == 0
    merged = json.loads((out / "summary.json").read_text())
    assert merged["stage_seconds"]["masking"] == 1234.5 and merged["seconds"] != 1234.5
    protocol = json.loads(PROTOCOL.read_text())
    assert [(p["a"], p["b"]) for p in merged["not_testable"]] == [
        tuple(e["pair"]) for e in protocol["not_testable_by_construction"]
    ]
    assert all(p["verdict"] == "not testable" and p["why"] for p in merged["not_testable"])
    # a pair untestable under every ranking scope is in no family (value-weighted → output-normalised
    # intra is untestable only when a whole row is ranked; the protocol ranks per query, where it differs)
    anywhere = [{p["a"], p["b"]} for p in merged["not_testable"] if p["ranking_scope"] == "any"]
    assert anywhere and not any({q["a"], q["b"]} in anywhere for q in merged["pairs"])
    readme = (out / "README.md").read_text()
    assert "Not testable by construction" in readme and "value_weighted → output_normalized_inter" in readme
