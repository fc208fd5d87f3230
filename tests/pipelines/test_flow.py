"""The contribution-flow pipeline (geolens.pipelines.flow): the one-prompt look (prompt_flow) is each
method's last row and its routes and what geolens flow prints; the erasure test's claims read a
verdict only when pre-registered on the protocol's minimum, the replacement claim is indicative with
its numbers, and the claims read the primary family; its doctests run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

import geolens
from geolens.flow import (
    ErasureSettings,
)
from geolens.flow.core import (
    contribution_flow,
    flow_names_filter,
)

FLOW_DOCS = Path(__file__).resolve().parents[2] / "docs" / "flow"
VERDICT_WORDS = re.compile(r"\bholds\b|does not hold|\breversed\b|\btie\b", re.IGNORECASE)


@pytest.mark.parametrize(
    "status, n, want",
    [("pre-registered", 100, "holds"), ("pre-registered", 8, "indicative"), ("exploratory", 100, "indicative")],
)
def test_flow_claims_read_a_verdict_only_pre_registered_on_the_protocols_minimum(status, n, want):
    from geolens.flow import DIRECTIONS, ErasureSettings
    from geolens.pipelines.flow import flow_claims

    settings = ErasureSettings(methods=("random", "alti", "contribution"), replacements=("space",))
    pairs = [
        dict(direction=d, a=a, b=b, delta=0.1, ci_low=0.05, ci_high=0.2, verdict="holds")
        for d in DIRECTIONS
        for a, b in (("random", "alti"), ("random", "contribution"), ("alti", "contribution"))
    ]
    summary = dict(
        families={"primary": dict(replacement="space", n_documents=n, pairs=pairs)},
        range_check={"space": dict(excluded_kl=0, n_predictions=3 * n)},
        most_faithful={d: None for d in DIRECTIONS},
    )
    versus_alti, versus_random, best = flow_claims(summary, settings, status=status, windows="documents")
    assert versus_alti.holds is True and versus_random.holds is True and versus_alti.ci and versus_random.ci
    for c in (versus_alti, versus_random):
        assert c.verdict == f"{want} (n = {n} documents)"
        assert not VERDICT_WORDS.search(c.measured), c.measured  # intervals, no pair verdicts
        assert ("exploratory run" in c.why) == (status == "exploratory")
    assert best.decision == "descriptive"


def test_prompt_flow_is_each_methods_last_row_and_its_routes(tiny):
    from geolens.flow.routes import flow_routes
    from geolens.pipelines.flow import LISTED, prompt_flow

    model, tokens, _ = tiny
    prompt = tokens[:1]
    found = prompt_flow(model, prompt, LISTED + ("value_zeroing_rollout",), threshold=0.1, route_method="alti")
    _, cache = model.run_with_cache(prompt, names_filter=flow_names_filter(model))
    last = prompt.shape[1] - 1
    assert found.position == last and len(found.words) == prompt.shape[1]
    for m in LISTED + ("value_zeroing_rollout",):
        row = contribution_flow(model, cache, m, tokens=prompt)[0, last]
        torch.testing.assert_close(found.rows[m], row, atol=1e-6, rtol=1e-5)
        # top-k against a naive sort: largest share first, ties by position
        naive = sorted(range(last + 1), key=lambda j: (-float(row[j]), j))[:4]
        assert [t["position"] for t in found.top(4)[m]] == naive
        assert [t["share"] for t in found.top(4)[m]] == pytest.approx([float(row[j]) for j in naive], abs=1e-6)
        assert [t["token"] for t in found.top(4)[m]] == [found.words[j] for j in naive]
    assert found.routes.to_dict() == flow_routes(model, cache, last, 0.1, method="alti", tokens=prompt).to_dict()
    table = found.table(2)
    assert list(table.columns) == ["method", "rank", "position", "token", "share"] and len(table) == 2 * 4
    assert table[table["method"] == "alti"]["position"].tolist() == [t["position"] for t in found.top(2)["alti"]]
    assert prompt_flow(model, prompt, ("attention_rollout",), routes=False).routes is None
    with pytest.raises(ValueError, match=r"one prompt \[1, pos ≥ 2\]"):
        prompt_flow(model, tokens)


def test_flow_command_prints_what_prompt_flow_returns(capsys):
    """``geolens flow "prompt"`` lists the pipeline's top tokens, method by method."""
    import re

    from geolens.cli import main
    from geolens.pipelines.flow import LISTED, prompt_flow

    text = "the cat sat on the mat"
    assert main(["flow", text, "--model", "tiny-gqa", "--top-k", "3"]) == 0
    out = capsys.readouterr().out
    model = geolens.load_model("tiny-gqa")
    found = prompt_flow(model, model.to_tokens(text, prepend_bos=True), LISTED, routes=False)
    for m in LISTED:
        block = out.split(f"  by {m}:\n", 1)[1]
        printed = re.findall(r"^    pos\s+(\d+) .+?\s+([0-9.]+)$", block, re.M)[:3]
        top = found.top(3)[m]
        assert [int(p) for p, _ in printed] == [t["position"] for t in top]
        assert [float(s) for _, s in printed] == pytest.approx([t["share"] for t in top], abs=1e-4)


@pytest.mark.bridge_only  # the examples build TransformerLens 4.x bridges
def test_doctests_of_the_flow_pipeline():
    import doctest

    import geolens.pipelines.flow

    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    tests = [t for t in doctest.DocTestFinder().find(geolens.pipelines.flow) if t.examples]
    assert {t.name.rsplit(".", 1)[-1] for t in tests} >= {"prompt_flow", "top_tokens"}
    for t in tests:
        runner.run(t)
    assert runner.summarize(verbose=False).failed == 0


def test_the_replacement_claim_is_indicative_with_its_numbers():
    """No rule is pre-registered for robustness to the replacement: the claim never reads holds or
    does not hold, even on the protocol's 100 documents of a pre-registered run, and it shows the
    intervals; it no longer compares verdicts."""
    from geolens.pipelines.flow import flow_claims, replacement_claim

    settings = ErasureSettings(methods=("random", "contribution"))
    tests = [
        dict(
            direction=d,
            method=m,
            naopc_primary=0.5,
            naopc_robustness=0.5 + delta,
            delta=delta,
            ci_low=delta - 0.01,
            ci_high=delta + 0.01,
            level=0.99,
            p=0.01,
            p_adj=0.04,
            rank=1,
            excludes_zero=abs(delta) > 0.01,
        )
        for d in ("comprehensiveness", "sufficiency")
        for m, delta in (("random", 0.0), ("contribution", 0.2))
    ]
    moved = dict(primary="space", robustness="unigram", outcome="kl", n_predictions=300, n_documents=100, tests=tests)
    c = replacement_claim(moved, status="pre-registered")
    assert c.decision == "indicative" and c.holds is None and c.ci
    assert c.verdict.startswith("indicative (n = 100 documents)") and "no decision rule" in c.why
    assert "2 of 4 intervals" in c.measured and "contribution flow comp. +0.2 [+0.19, +0.21]" in c.measured
    quiet = replacement_claim(dict(moved, tests=[dict(t, excludes_zero=False) for t in tests]), status="exploratory")
    assert (
        "0 of 4 intervals" in quiet.measured
        and "the largest difference" in quiet.measured
        and "exploratory run" in quiet.measured
    )
    pairs = [
        dict(direction=d, a="random", b="contribution", delta=0.1, ci_low=0.05, ci_high=0.2, verdict="holds")
        for d in ("comprehensiveness", "sufficiency")
    ]
    summary = dict(
        families={"primary": dict(replacement="space", n_documents=100, pairs=pairs)},
        range_check={"space": dict(excluded_kl=0, n_predictions=300)},
        most_faithful={},
        verdict_changes=[],
        replacement_differences=moved,
    )
    claims = flow_claims(summary, settings, status="pre-registered")
    robust = [x for x in claims if "replacement" in x.claim]
    assert len(robust) == 1 and robust[0].decision == "indicative" and not any("verdicts" in x.claim for x in claims)


def test_claims_read_the_primary_family():
    from geolens.pipelines.flow import flow_claims

    settings = ErasureSettings(methods=("random", "attention_rollout", "alti", "contribution", "integrated_gradients"))
    verdicts = {
        ("random", "attention_rollout"): "holds",
        ("random", "alti"): "holds",
        ("random", "contribution"): "holds",
        ("random", "integrated_gradients"): "holds",
        ("attention_rollout", "contribution"): "holds",
        ("alti", "contribution"): "tie",
        ("contribution", "integrated_gradients"): "holds",
        ("attention_rollout", "alti"): "holds",
        ("attention_rollout", "integrated_gradients"): "holds",
        ("alti", "integrated_gradients"): "holds",
    }
    pairs = [
        dict(
            direction=d,
            a=a,
            b=b,
            delta=0.1 if v == "holds" else 0.0,
            ci_low=0.05 if v == "holds" else -0.1,
            ci_high=0.2,
            verdict=v,
        )
        for d in ("comprehensiveness", "sufficiency")
        for (a, b), v in verdicts.items()
    ]
    summary = dict(
        families={"primary": dict(replacement="space", n_documents=100, pairs=pairs)},
        range_check={"space": dict(excluded_kl=2, n_predictions=300)},
        most_faithful={
            "comprehensiveness": dict(method="integrated_gradients", by=0.1, ci_low=0.05, ci_high=0.2, against="alti"),
            "sufficiency": None,
        },
    )
    claims = {c.claim: c for c in flow_claims(summary, settings, status="pre-registered")}
    by_name = lambda word: next(c for k, c in claims.items() if word in k)  # noqa: E731
    assert by_name("than attention rollout").decision == "holds"
    assert by_name("than ALTI").decision == "undecided"  # a tie in both directions
    assert by_name("than integrated gradients").decision == "does not hold"  # integrated gradients wins
    assert by_name("random ranking").decision == "holds"
    assert (
        by_name("most faithful").decision == "descriptive"
        and "integrated gradients" in by_name("most faithful").measured
    )
    explo = {c.claim: c for c in flow_claims(summary, settings, status="exploratory")}
    assert all(c.decision in ("indicative", "descriptive") for c in explo.values())


def test_the_pipelines_defaults_are_the_flow_protocols_version_3():
    """run_flow's default settings are those the version-3 twin gives (so the API and the command
    agree); the quick look uses the same baseline at fixed steps."""
    from geolens.flow import ErasureSettings
    from geolens.pipelines.flow import FlowParams

    twin = json.loads((FLOW_DOCS / "v3/protocol.json").read_text(encoding="utf-8"))
    assert FlowParams().erasure == ErasureSettings.from_protocol(twin)
    quick = FlowParams.quick().erasure
    assert quick.ig_baseline == "prefix_mean" and quick.ig_tolerance is None and quick.ig_steps == 8


PUBLISHED_FLOW = sorted(p.parent for p in FLOW_DOCS.rglob("manifest.json") if not (p.parent / "INCOMPLETE").exists())


@pytest.mark.slow
@pytest.mark.parametrize("folder", PUBLISHED_FLOW, ids=lambda p: str(p.relative_to(FLOW_DOCS)))
def test_published_flow_runs_recompute_from_their_per_document_files(folder):
    """Every finished flow erasure run in docs/flow: FlowRun.load re-summarises the stored
    per-document tables, and every statistic equals its summary.json exactly (the known-answer
    check to float32 rounding: its table is stored rounded); the version-3 runs meet the protocol's
    completeness goal (integrated gradients within 1 % for ≥ 95 % of predictions)."""
    from geolens.pipelines.flow import FlowRun

    saved = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    new = json.loads(json.dumps(FlowRun.load(folder).summary))
    induction = new.pop("induction_check", None)
    assert {k: saved[k] for k in new} == new
    for method, row in (induction or {}).items():
        for key, value in row.items():
            assert value == pytest.approx(saved["induction_check"][method][key], abs=1e-6), (method, key)
    assert saved["status"] == "pre-registered" and saved["n_documents"] >= 100, folder
    if saved["protocol_version"] >= 3:
        assert saved["ig_completeness"]["share_rel_gap_within_1pct"] >= 0.95


def test_published_flow_runs_are_found():
    """The parametrized check above sees the finished runs (v1 on both models, v2 on Gemma, v3 on
    both), not an empty list."""
    names = {str(p.relative_to(FLOW_DOCS)) for p in PUBLISHED_FLOW}
    assert {"smollm2-135m", "gemma3-270m", "v2/gemma3-270m", "v3/smollm2-135m", "v3/gemma3-270m"} <= names
