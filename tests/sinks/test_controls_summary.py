"""The dose-response summary of the sink controls (geolens.sinks.controls_summary): the two-stage
bootstrap over documents then seeds, and one Holm family over the scopes, on constructed tables."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from geolens.interventions.sink_values import (
    SinkEditSpec,
)
from geolens.sinks.controls_protocol import edit_dose
from geolens.sinks.controls_summary import dose_summary, two_stage_means
from geolens.stats import holm
from sinks.conftest import SMALL

ONE = replace(SMALL, scopes=("all_heads",))


def _constructed_table(doc_effect, seed_effect, *, norm=(0.0, 0.0), scopes=("all_heads",), protocol=SMALL, G=4):
    """A complete windows table: 2 windows per document; rotations x = doc_effect[d] + seed_effect[s]
    (+ 0.1 per angle index), norm edits norm[i] + doc_effect[d]; both outcomes the same numbers."""
    rows = []
    for scope_i, scope in enumerate(scopes):
        for w in range(2 * G):
            d = 10 + w // 2  # document labels need not start at 0
            for i, lam in enumerate(protocol.lambdas):
                x = norm[i % len(norm)] + doc_effect[w // 2] + scope_i
                rows.append(
                    dict(
                        window=w,
                        document=d,
                        scope=scope,
                        edit="scale",
                        lam=lam,
                        degrees=np.nan,
                        seed=pd.NA,
                        dose=abs(1 - lam),
                        nll_clean=1.0,
                        nll=1.0,
                        delta_ppl=x,
                        kl=x,
                    )
                )
            for a_i, a in enumerate(protocol.degrees):
                for s in protocol.seeds(a):
                    x = doc_effect[w // 2] + seed_effect[s] + 0.1 * a_i
                    rows.append(
                        dict(
                            window=w,
                            document=d,
                            scope=scope,
                            edit="rotate",
                            lam=np.nan,
                            degrees=a,
                            seed=s,
                            dose=edit_dose(SinkEditSpec("rotate", degrees=a)),
                            nll_clean=1.0,
                            nll=1.0,
                            delta_ppl=x,
                            kl=x,
                        )
                    )
    table = pd.DataFrame(rows)
    table["seed"] = table["seed"].astype("Int64")
    return table


def test_two_stage_bootstrap_resamples_documents_then_seeds():
    rng = np.random.default_rng(5)
    doc_effect, seed_effect = rng.normal(size=4), rng.normal(size=3)
    table = _constructed_table(doc_effect, seed_effect)
    out = dose_summary(table, ONE)
    rows = {(r["edit"], r["lam"] if r["edit"] == "scale" else r["degrees"]): r for r in out["dose_response"]}
    # by hand: one generator; first G document draws per resample, then seeds per angle in ascending order
    gen = np.random.default_rng(SMALL.seed)
    docs = gen.integers(0, 4, size=(SMALL.n_boot, 4))
    seeds = {a: gen.integers(0, len(SMALL.seeds(a)), size=(SMALL.n_boot, len(SMALL.seeds(a)))) for a in SMALL.degrees}
    for a_i, a in enumerate(SMALL.degrees):
        means = []
        for b in range(SMALL.n_boot):
            vals = [
                doc_effect[d] + seed_effect[s] + 0.1 * a_i for d in docs[b] for _window in range(2) for s in seeds[a][b]
            ]
            means.append(sum(vals) / len(vals))
        lo, hi = np.quantile(means, [0.025, 0.975])
        r = rows[("rotate", a)]
        assert (r["kl_low"], r["kl_high"]) == pytest.approx((lo, hi), rel=1e-12)
        assert r["n_seeds"] == len(SMALL.seeds(a)) and r["n_windows"] == 8 and r["n_documents"] == 4
        assert r["bootstrap"] == "documents, then seeds"
    norm_means = [np.mean([doc_effect[d] for d in docs[b]]) for b in range(SMALL.n_boot)]
    assert (rows[("scale", 0.0)]["kl_low"], rows[("scale", 0.0)]["kl_high"]) == pytest.approx(
        tuple(np.quantile(norm_means, [0.025, 0.975])), rel=1e-12
    )
    # seed variance alone widens a rotation's interval, never a norm edit's
    only_seeds = {
        (r["edit"], r["lam"] or r["degrees"]): r
        for r in dose_summary(_constructed_table(np.zeros(4), seed_effect), ONE)["dose_response"]
    }
    assert only_seeds[("rotate", 60.0)]["kl_high"] - only_seeds[("rotate", 60.0)]["kl_low"] > 0.1
    assert only_seeds[("scale", 2.0)]["kl_high"] == only_seeds[("scale", 2.0)]["kl_low"]
    # and document variance alone widens both
    only_docs = {
        (r["edit"], r["lam"] or r["degrees"]): r
        for r in dose_summary(_constructed_table(doc_effect, np.zeros(3)), ONE)["dose_response"]
    }
    assert only_docs[("rotate", 60.0)]["kl_high"] > only_docs[("rotate", 60.0)]["kl_low"]
    assert two_stage_means(np.ones((2, 3)), [np.array([0, 1])], np.array([[2, 2, 0]])).tolist() == [1.0]


def test_verdicts_form_one_holm_family_over_the_scopes():
    rng = np.random.default_rng(1)
    doc_effect = rng.normal(scale=0.01, size=4)
    seed_effect = rng.normal(scale=0.01, size=3)
    # all_heads: the norm edits at dose 1 (λ = 0, 2) sit 1 above the 60° rotation; sink_heads: equal (scope_i adds 1)
    table = _constructed_table(doc_effect, seed_effect, norm=(1.0, 0.0, 1.0), scopes=("all_heads",))
    sink = _constructed_table(doc_effect, seed_effect, norm=(-1.0, 0.0, -1.0), scopes=("all_heads",)).assign(
        scope="sink_heads"
    )
    sink.loc[sink.edit == "scale", ["kl", "delta_ppl"]] += (
        1.0  # sink: norm = doc effect, equal to the rotation on average
    )
    out = dose_summary(pd.concat([table, sink], ignore_index=True), SMALL)
    pairs = {p["scope"]: p for p in out["pairs"]}
    a, s = pairs["all_heads"], pairs["sink_heads"]
    assert a["estimate"] == pytest.approx(1.0 - np.mean(seed_effect), abs=1e-12)
    assert a["norm_edit"] == pytest.approx(1.0 + doc_effect.mean()) and a["rotation"] == pytest.approx(
        doc_effect.mean() + seed_effect.mean()
    )
    assert a["verdict"] == "holds" and a["ci_low"] > 0 and a["rank"] == 1 and a["level"] == pytest.approx(1 - 0.05 / 2)
    assert [a["p_adj"], s["p_adj"]] == pytest.approx(holm([a["p"], s["p"]]).tolist())
    assert s["rank"] == 2 and s["level"] == pytest.approx(0.95)
    assert s["verdict"] == ("tie" if s["ci_low"] <= 0 <= s["ci_high"] else s["verdict"])
    assert a["lambdas"] == [0.0, 2.0] and a["degrees"] == [60.0] and a["n_seeds"] == 3
    assert all(p["verdict"] is None and p["outcome"] == "delta_ppl" for p in out["exploratory_pairs"])
    assert all(
        p["verdict"] == "not decided (exploratory)"
        for p in dose_summary(table.assign(), SMALL, verdicts=False, not_testable={"sink_heads": "none"})["pairs"][:1]
    )
    # a scope with nothing to edit is 'not testable', left out of the family (m = 1: the other test at full level 0.95)
    alone = dose_summary(table, SMALL, not_testable={"sink_heads": "no sink head"})
    nt = {p["scope"]: p for p in alone["pairs"]}
    assert (
        nt["sink_heads"]["verdict"] == "not testable"
        and nt["sink_heads"]["p"] is None
        and nt["sink_heads"]["note"] == "no sink head"
    )
    assert nt["all_heads"]["level"] == pytest.approx(0.95) and nt["all_heads"]["p_adj"] == nt["all_heads"]["p"]
    with pytest.raises(ValueError, match="rows for 8 windows"):
        dose_summary(table.iloc[1:], SMALL, not_testable={"sink_heads": "none"})
    with pytest.raises(ValueError, match="not tested"):
        dose_summary(pd.concat([table, sink]), SMALL, not_testable={"sink_heads": "none"})
