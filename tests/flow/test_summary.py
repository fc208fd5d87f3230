"""The summary of the flow erasure test (geolens.flow.summary, docs/flow/PROTOCOL.md): nAOPC and the
range check by hand, the document-cluster bootstrap, one Holm family over both directions with not-
testable pairs, the replacement differences and their indicative claim, and a tiny run's summary and
claims."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from flow.conftest import SMALL, TEXTS, text_tokens
from geolens.flow import (
    ErasureSettings,
    measure_document,
    method_pairs,
    space_token,
    unigram_counts,
)
from geolens.flow.summary import (
    erasure_summary,
    family_tables,
    most_faithful,
    naopc_table,
    replacement_differences,
)
from geolens.stats import cluster_bootstrap_indices, holm, percentile_ci


@pytest.fixture
def model(erasure_model):
    """The package's erasure model (tests/flow/conftest.py), under the name these tests use."""
    return erasure_model


def _conditions(values: dict, fractions=(0.1, 0.5)) -> pd.DataFrame:
    """values[(doc, method, direction)] = (KL per fraction, drop per fraction); values[(doc, 'all')] = (KL, drop)."""
    rows = []
    for key, (kl, drop) in values.items():
        doc = key[0]
        if key[1] == "all":
            rows.append(
                dict(
                    document=doc,
                    position=5,
                    replacement="space",
                    method="all",
                    direction="all",
                    fraction=1.0,
                    n_erased=4,
                    kl=kl,
                    delta_p=-drop,
                )
            )
        else:
            for k, a, b in zip(fractions, kl, drop):
                rows.append(
                    dict(
                        document=doc,
                        position=5,
                        replacement="space",
                        method=key[1],
                        direction=key[2],
                        fraction=k,
                        n_erased=1,
                        kl=a,
                        delta_p=-b,
                    )
                )
    return pd.DataFrame(rows)


def test_naopc_by_hand_and_the_range_check():
    s = ErasureSettings(fractions=(0.1, 0.5), methods=("random", "contribution"), replacements=("space",))
    values = {
        (0, "all"): (2.0, 0.4),
        (0, "random", "comprehensiveness"): ([0.2, 0.6], [0.0, 0.1]),
        (0, "contribution", "comprehensiveness"): ([1.0, 3.0], [0.2, 0.4]),
        (0, "random", "sufficiency"): ([1.8, 1.4], [0.4, 0.2]),
        (0, "contribution", "sufficiency"): ([0.5, 0.1], [0.1, -0.1]),
        (1, "all"): (5e-4, 0.005),  # out of range for both outcomes
        (1, "random", "comprehensiveness"): ([1e-4, 2e-4], [0.001, 0.0]),
        (1, "contribution", "comprehensiveness"): ([3e-4, 1e-4], [0.0, 0.0]),
        (1, "random", "sufficiency"): ([1e-4, 1e-4], [0.0, 0.0]),
        (1, "contribution", "sufficiency"): ([1e-4, 1e-4], [0.0, 0.0]),
    }
    t = naopc_table(_conditions(values), s).set_index(["document", "method", "direction"])
    assert t.loc[(0, "random", "comprehensiveness"), "naopc_kl"] == pytest.approx((0.2 + 0.6) / 2 / 2.0)
    assert t.loc[(0, "contribution", "comprehensiveness"), "naopc_kl"] == pytest.approx(1.0)
    assert t.loc[(0, "contribution", "comprehensiveness"), "naopc_dp"] == pytest.approx(0.3 / 0.4)
    assert t.loc[(0, "contribution", "sufficiency"), "naopc_dp"] == pytest.approx(0.0)
    assert t.loc[(0, "random", "sufficiency"), "aopc_kl"] == pytest.approx(1.6)
    assert (
        not t.loc[(1, "random", "comprehensiveness"), "in_range_kl"]
        and not t.loc[(1, "random", "comprehensiveness"), "in_range_dp"]
    )
    assert np.isnan(t.loc[(1, "contribution", "sufficiency"), "naopc_kl"])
    with pytest.raises(ValueError, match="fractions"):
        naopc_table(
            _conditions(values),
            ErasureSettings(fractions=(0.1, 0.2, 0.5), methods=("random", "contribution"), replacements=("space",)),
        )


def _synthetic_run(n_docs=12, per_doc=3, seed=0, identical=("grad_x_input", "integrated_gradients")):
    """naopc rows and rankings of a made-up run: contribution erases better than random, the two
    gradient methods share one ranking (identical by construction)."""
    rng = np.random.default_rng(seed)
    methods = ("random", "alti", "contribution", "grad_x_input", "integrated_gradients")
    s = ErasureSettings(
        positions=(5, 6, 7)[:per_doc], fractions=(0.1, 0.5), methods=methods, replacements=("space",), n_boot=400
    )
    naopc, ranks = [], []
    for d in range(n_docs):
        doc_effect = rng.normal(0, 0.3)
        for p in s.positions[:per_doc]:
            base = rng.normal(0.5, 0.05) + doc_effect
            vals = {
                "random": base,
                "alti": base + 0.05,
                "contribution": base + 0.3,
                "grad_x_input": base + 0.1,
                "integrated_gradients": base + 0.1,
            }
            for m in methods:
                for direction in ("comprehensiveness", "sufficiency"):
                    v = vals[m] if direction == "comprehensiveness" else 1 - vals[m]
                    naopc.append(
                        dict(
                            document=d,
                            position=p,
                            replacement="space",
                            method=m,
                            direction=direction,
                            naopc_kl=v,
                            in_range_kl=True,
                            naopc_dp=np.nan,
                            in_range_dp=False,
                        )
                    )
                order = [1, 2, 3, 4] if m in identical else list(rng.permutation([1, 2, 3, 4]))
                ranks.append(dict(document=d, position=p, method=m, order=" ".join(map(str, order))))
    return pd.DataFrame(naopc), pd.DataFrame(ranks), s


def test_cluster_bootstrap_resamples_whole_documents():
    naopc, ranks, s = _synthetic_run()
    fam = family_tables(naopc, ranks, s, "space", "kl")
    assert fam["n_documents"] == 12 and fam["n_predictions"] == 36
    rows = naopc[(naopc.method == "contribution") & (naopc.direction == "comprehensiveness")].sort_values(
        ["document", "position"]
    )
    x, docs = rows.naopc_kl.to_numpy(), rows.document.to_numpy()
    means = []
    for resample in cluster_bootstrap_indices(docs, s.n_boot, s.boot_seed):
        counts = {d: int((docs[resample] == d).sum()) for d in set(docs.tolist())}
        assert all(c % 3 == 0 for c in counts.values())  # a document comes with all three of its predictions
        means.append(sum(x[j] for j in resample) / len(resample))
    lo, hi = percentile_ci(np.array(means), 0.95)
    got = next(m for m in fam["methods"] if m["method"] == "contribution" and m["direction"] == "comprehensiveness")
    assert got["naopc"] == pytest.approx(x.mean()) and (got["ci_low"], got["ci_high"]) == pytest.approx((lo, hi))
    # a bootstrap over predictions would ignore the document effect: its interval is narrower
    rows_lo, rows_hi = percentile_ci(
        np.array([x[r].mean() for r in np.random.default_rng(0).integers(0, 36, (400, 36))]), 0.95
    )
    assert hi - lo > 1.3 * (rows_hi - rows_lo)


def test_one_holm_family_over_both_directions_with_not_testable_pairs():
    naopc, ranks, s = _synthetic_run()
    fam = family_tables(naopc, ranks, s, "space", "kl")
    pairs = fam["pairs"]
    assert len(pairs) == 2 * len(method_pairs(s.methods)) == 20
    untestable = [p for p in pairs if (p["a"], p["b"]) == ("grad_x_input", "integrated_gradients")]
    assert len(untestable) == 2 and all(p["verdict"] == "not testable" and np.isnan(p["p"]) for p in untestable)
    live = [p for p in pairs if p["verdict"] != "not testable"]
    assert [p["p_adj"] for p in live] == pytest.approx(holm([p["p"] for p in live]).tolist())
    for p in live:
        assert (
            p["verdict"] == ("holds" if p["ci_low"] > 0 else "reversed" if p["ci_high"] < 0 else "tie")
            or p["holm_stopped_at"]
        )
    by = {(p["direction"], p["a"], p["b"]): p for p in pairs}
    for d in ("comprehensiveness", "sufficiency"):  # Δ > 0 means b better in both directions
        assert (
            by[(d, "random", "contribution")]["delta"] == pytest.approx(0.3)
            and by[(d, "random", "contribution")]["verdict"] == "holds"
        )
        assert by[(d, "contribution", "grad_x_input")]["verdict"] == "reversed"
    best = most_faithful(pairs, s.methods, "comprehensiveness")
    assert (
        best["method"] == "contribution"
        and best["against"] in ("grad_x_input", "integrated_gradients")
        and best["by"] == pytest.approx(0.2)
    )
    assert most_faithful([dict(p, verdict="tie") for p in pairs], s.methods, "sufficiency") is None
    # an exploratory outcome: 95% intervals, no verdicts
    explo = family_tables(naopc, ranks, s, "space", "kl", verdicts=False)
    assert all("verdict" not in p and p["level"] == 0.95 for p in explo["pairs"])


def _naive_replacement_differences(naopc, settings):
    """robustness − primary nAOPC (KL) per (direction, method), explicit loops in float64: the
    predictions in range under both replacements, their mean difference, and its mean on each
    document-cluster resample (indices from geolens.stats)."""
    first, second = settings.replacements
    value = {}
    for r in naopc.itertuples():
        if r.in_range_kl:
            value[(r.document, r.position, r.replacement, r.direction, r.method)] = float(r.naopc_kl)
    keys = [(d, m) for d in ("comprehensiveness", "sufficiency") for m in settings.methods]
    predictions = sorted({(d, p) for d, p, *_ in value})
    both = [
        (d, p) for d, p in predictions if all((d, p, rep, di, m) in value for rep in (first, second) for di, m in keys)
    ]
    diffs = {k: [value[(d, p, second, *k)] - value[(d, p, first, *k)] for d, p in both] for k in keys}
    if not both:
        return both, {}, {}
    docs = np.array([d for d, _ in both])
    boot = {k: [] for k in keys}
    for resample in cluster_bootstrap_indices(docs, settings.n_boot, settings.boot_seed):
        for k in keys:
            boot[k].append(sum(diffs[k][j] for j in resample) / len(resample))
    return both, {k: sum(v) / len(v) for k, v in diffs.items()}, {k: np.array(v) for k, v in boot.items()}


def test_replacement_differences_by_hand():
    """Two replacements on a made-up run: one method moves by +0.2 under the second one, the others
    by noise only; a prediction out of range under one replacement leaves both."""
    rng = np.random.default_rng(1)
    methods = ("random", "alti", "contribution")
    s = ErasureSettings(positions=(5, 6), fractions=(0.1, 0.5), methods=methods, n_boot=500)
    rows = []
    for d in range(10):
        for pos in (5, 6):
            for rep in s.replacements:
                in_range = not (d == 3 and pos == 6 and rep == "unigram")
                for m in methods:
                    for direction in ("comprehensiveness", "sufficiency"):
                        v = rng.normal(0.5, 0.05) + (0.2 if (m == "contribution" and rep == "unigram") else 0.0)
                        rows.append(
                            dict(
                                document=d,
                                position=pos,
                                replacement=rep,
                                method=m,
                                direction=direction,
                                naopc_kl=v if in_range else np.nan,
                                in_range_kl=in_range,
                                naopc_dp=np.nan,
                                in_range_dp=False,
                            )
                        )
    naopc = pd.DataFrame(rows)
    got = replacement_differences(naopc, s)
    both, mean, boot = _naive_replacement_differences(naopc, s)
    assert got["primary"] == "space" and got["robustness"] == "unigram" and got["outcome"] == "kl"
    assert got["n_predictions"] == len(both) == 19 and got["n_documents"] == 10 and len(got["tests"]) == 2 * 3
    for t in got["tests"]:
        k = (t["direction"], t["method"])
        lo, hi = percentile_ci(boot[k], t["level"])
        assert t["delta"] == pytest.approx(mean[k], abs=1e-12) and (t["ci_low"], t["ci_high"]) == pytest.approx(
            (lo, hi), abs=1e-12
        )
        assert t["naopc_robustness"] - t["naopc_primary"] == pytest.approx(mean[k], abs=1e-12)
    assert [t["p_adj"] for t in got["tests"]] == pytest.approx(holm([t["p"] for t in got["tests"]]).tolist())
    assert sorted(t["level"] for t in got["tests"]) == pytest.approx([1 - 0.05 / (6 - r + 1) for r in range(6, 0, -1)])
    moved = {(t["direction"], t["method"]) for t in got["tests"] if t["excludes_zero"]}
    assert moved == {("comprehensiveness", "contribution"), ("sufficiency", "contribution")}
    # one replacement: nothing to compare
    assert (
        replacement_differences(
            naopc[naopc.replacement == "space"], ErasureSettings(methods=methods, replacements=("space",))
        )["tests"]
        == []
    )


def test_summary_of_a_tiny_run_and_its_claims(model):
    from geolens.pipelines.flow import FlowRun

    settings = ErasureSettings(**{**SMALL, "methods": ("random", "attention_rollout", "contribution")})
    counts = unigram_counts(model, TEXTS)
    parts = [
        measure_document(model, text_tokens(model, 12, doc=d), d, settings, space_id=space_token(model), counts=counts)
        for d in range(3)
    ]
    tables = {k: pd.concat([p[k] for p in parts], ignore_index=True) for k in parts[0]}
    summary = erasure_summary(tables, settings)
    assert summary["n_documents"] == 3 and summary["n_predictions"] == 6 and summary["multiple_comparison"] == "holm"
    assert set(summary["families"]) == {"primary", "robustness"}
    assert (
        summary["families"]["primary"]["replacement"] == "space"
        and summary["families"]["robustness"]["replacement"] == "unigram"
    )
    moved = summary["replacement_differences"]  # unigram − space nAOPC, against explicit float64 loops
    both, mean, _ = _naive_replacement_differences(naopc_table(tables["conditions"], settings), settings)
    assert moved["n_predictions"] == len(both) and len(moved["tests"]) == (2 * 3 if both else 0)
    for t in moved["tests"]:
        assert t["delta"] == pytest.approx(mean[(t["direction"], t["method"])], abs=1e-12)
    run = FlowRun.of(tables, settings, status="pre-registered")
    assert {"naopc", "pairs", "curves", "conditions"} <= set(run.tables)
    claims = run.claims()
    assert claims and all(c.decision in ("indicative", "descriptive") for c in claims)  # 3 documents: below the minimum
    robust = next(c for c in claims if "replacement token" in c.claim)
    assert robust.holds is None and robust.numbers["replacement_differences"] == moved
    # the report's table of the differences: the summary's numbers, under headers that read as words
    from geolens.claims import sample_size
    from geolens.report.columns import header, is_identifier
    from geolens.report.sections.flow import tables as section_tables

    shown = section_tables(run, sample_size(3, windows="corpus windows"))
    if moved["tests"]:
        table = shown["replacements"]
        assert not any(is_identifier(header(c)) for c in table.columns)
        assert table["Δ unigram − space"].tolist() == pytest.approx([t["delta"] for t in moved["tests"]])
        assert table["nAOPC (space)"].tolist() == pytest.approx([t["naopc_primary"] for t in moved["tests"]])
    else:
        assert "replacements" not in shown and "replacements" not in run.tables
    assert f"n = {summary['families']['primary']['n_documents']} documents" in claims[0].verdict  # documents in range
    if summary["families"]["primary"]["n_predictions"]:
        view = run.figures["naopc"]()
        assert set(view.data["naopc"]) == {"comprehensiveness", "sufficiency"}
        assert view.data["naopc"]["comprehensiveness"]["contribution"][0] == pytest.approx(
            next(
                m["naopc"]
                for m in summary["families"]["primary"]["methods"]
                if m["method"] == "contribution" and m["direction"] == "comprehensiveness"
            )
        )
        view.close()
    else:
        assert run.figures == {}
