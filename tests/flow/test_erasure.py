"""The input-token erasure test of contribution flow (geolens.flow.erasure, docs/flow/PROTOCOL.md):
erasure against hand-built forwards, gradient × input against float64 finite differences,
integrated gradients against a step-by-step float64 Riemann sum and its completeness, the
measured conditions, and the pre-registered protocol's text, hash and twin (the summary and its
claims: test_summary.py; the known-answer check: test_induction.py)."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import make_tiny

from flow.conftest import KINDS, SMALL, TEXTS, text_tokens
from geolens.adapter import adapter_for
from geolens.flow import (
    ERASURE_METHODS,
    ErasureSettings,
    contribution_flow,
    erase,
    erasure_outcomes,
    erasure_sets,
    flow_names_filter,
    gradient_x_input,
    induction_check,
    induction_summary,
    input_embeddings,
    integrated_gradients,
    measure_document,
    n_erased,
    ranking,
    replacement_ids,
    space_token,
    unigram_counts,
)
from geolens.interventions.base import active_hook_count


@pytest.fixture
def model(erasure_model):
    """The package's erasure model (tests/flow/conftest.py), under the name these tests use."""
    return erasure_model


FOLDER = Path(__file__).resolve().parents[2] / "docs" / "flow"


def as_float64(model):
    """A float64 copy of a tiny model (same kind and seed, so the same weights)."""
    m = make_tiny(KINDS[id(model)])
    m.to(torch.float64)
    return m


def naive_outcome(model, clean: list[int], built: list[int], target: int | None = None):
    """KL(p_clean ‖ p_built) and Δp at the last position, two separate full forwards, float64 loops."""
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([clean]))[0, -1].to(torch.float64), -1)
        lq = torch.log_softmax(model(torch.tensor([built]))[0, -1].to(torch.float64), -1)
    target = int(lp.argmax()) if target is None else target
    kl = 0.0
    for t in range(lp.shape[0]):
        kl += math.exp(float(lp[t])) * (float(lp[t]) - float(lq[t]))
    return kl, math.exp(float(lq[target])) - math.exp(float(lp[target])), target


# --- erasure and its outcomes ----------------------------------------------------------------------


def test_counts_rankings_and_sets():
    assert [n_erased(k, 14) for k in (0.01, 0.02, 0.05, 0.1, 0.2)] == [1, 1, 1, 2, 3]
    assert [n_erased(k, 30) for k in (0.01, 0.02, 0.05, 0.1, 0.2)] == [1, 1, 2, 3, 6]  # 0.1 · 30 stays 3
    assert [n_erased(k, 62) for k in (0.01, 0.02, 0.05, 0.1, 0.2)] == [1, 2, 4, 7, 13]
    assert n_erased(1.0, 5) == 5
    scores = torch.tensor([5.0, -3.0, 1.0, 1.0, 0.5, 9.0])
    assert ranking(scores, [1, 2, 3, 4]) == [2, 3, 4, 1]  # ties by increasing position
    assert ranking(scores, [1, 2, 3, 4], absolute=True) == [1, 2, 3, 4]
    order = [3, 1, 4, 2]
    assert erasure_sets(order, [0.25, 0.5], "comprehensiveness") == [[3], [3, 1]]
    assert erasure_sets(order, [0.25, 0.5], "sufficiency") == [[1, 4, 2], [4, 2]]
    with pytest.raises(ValueError, match="NaN"):
        ranking(torch.tensor([0.0, math.nan]), [1])
    with pytest.raises(ValueError, match="direction"):
        erasure_sets(order, [0.5], "both")


def test_erasure_outcomes_equal_hand_built_forwards(model):
    clean = text_tokens(model, 12)
    space = space_token(model)
    assert model.tokenizer.decode([space]) == " "
    sets = [[1], [2, 5], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [2, 5], []]  # a repeated row and the clean input
    rows = torch.stack(
        [erase(clean, torch.isin(torch.arange(12), torch.tensor(s, dtype=torch.long)), space) for s in sets]
    )
    out = erasure_outcomes(model, clean, rows, chunk_size=2)
    assert active_hook_count(model) == model.geolens_test_hooks
    for r, s in enumerate(sets):
        built = clean.tolist()
        for j in s:
            built[j] = space
        kl, dp, target = naive_outcome(model, clean.tolist(), built)
        assert out.target == target
        assert float(out.kl[r]) == pytest.approx(kl, abs=1e-6)
        assert float(out.delta_p[r]) == pytest.approx(dp, abs=1e-6)
    assert float(out.kl[4]) == 0.0 and float(out.delta_p[4]) == 0.0  # the clean row shares the clean forward
    with pytest.raises(ValueError, match="rows must be"):
        erasure_outcomes(model, clean, rows[:, :5])


def test_replacements():
    ids = replacement_ids("unigram", 6, counts=torch.tensor([0, 3, 0, 1]), rng=np.random.default_rng([2026, 0, 2]))
    expected = np.random.default_rng([2026, 0, 2]).choice(4, size=6, p=np.array([0, 3, 0, 1]) / 4)
    assert ids.tolist() == expected.tolist() and set(ids.tolist()) <= {1, 3}
    with pytest.raises(ValueError, match="replacement must be"):
        replacement_ids("mask", 3)
    with pytest.raises(ValueError, match="space_id"):
        replacement_ids("space", 3)


def test_unigram_counts_count_the_tokens(model):
    texts = ["ab a", "ba"]
    counts = unigram_counts(model, texts)
    by_hand = torch.zeros(model.cfg.d_vocab, dtype=torch.int64)
    for text in texts:
        for t in model.tokenizer(text, add_special_tokens=False)["input_ids"]:
            by_hand[t] += 1
    assert torch.equal(counts, by_hand) and int(counts.sum()) == 6


# --- gradient attributions -----------------------------------------------------------------------


def test_forward_from_the_embeddings_is_the_model(model):
    tokens = text_tokens(model, 10)
    x = input_embeddings(model, tokens)
    with torch.no_grad():
        direct = model(tokens[None])[0]
        from_x = adapter_for(model).forward_from_layer(x[None], 0)[0]
    torch.testing.assert_close(from_x, direct, rtol=1e-5, atol=1e-5)


def naive_input_gradient(m64, tokens: torch.Tensor, position: int, target: int):
    """(x, ∂ log p(target) at ``position`` / ∂x): a full forward of the tokens in float64 whose
    first block's input is swapped for a leaf tensor by a hook (not the code's start-at-layer path)."""
    from geolens.interventions.base import applied

    hook = adapter_for(m64).resid_pre_hook(0)
    with torch.no_grad():
        _, cache = m64.run_with_cache(tokens[None], names_filter=lambda n: n == hook)
    x = cache[hook][0].clone().requires_grad_(True)
    with torch.enable_grad(), applied(m64, [(hook, lambda act, hook: x[None])]):
        logits = m64(tokens[None])[0, position].to(torch.float64)
        (grad,) = torch.autograd.grad(torch.log_softmax(logits, -1)[target], x)
    return x.detach(), grad


def test_gradient_x_input_matches_naive_float64_autograd(model):
    """Σ_d x_jd ∂f/∂x_jd by explicit loops over positions and dimensions, from a float64 copy of
    the model run on the whole sequence (the code runs only the prefix, from the embeddings)."""
    tokens, position = text_tokens(model, 10), 7
    got = gradient_x_input(model, tokens, position)
    assert active_hook_count(model) == model.geolens_test_hooks
    m64 = as_float64(model)
    with torch.no_grad():
        target = int(m64(tokens[None])[0, position].argmax())
    x, grad = naive_input_gradient(m64, tokens, position, target)
    for j in range(tokens.shape[0]):
        expected = sum(float(x[j, d]) * float(grad[j, d]) for d in range(x.shape[1]))
        assert float(got[j]) == pytest.approx(expected, abs=1e-6, rel=1e-3), j
    assert torch.all(got[position + 1 :] == 0) and float(got[: position + 1].abs().sum()) > 0


def test_integrated_gradients_equal_a_step_by_step_riemann_sum(model):
    """The batched implementation against a float64 loop: one autograd call per step through the
    model run from its embeddings, averaged by hand."""
    tokens, position, steps = text_tokens(model, 10), 8, 5
    baseline = erase(tokens, (torch.arange(10) > 0) & (torch.arange(10) < position), space_token(model))
    got = integrated_gradients(model, tokens, baseline, position, n_steps=steps, batch_size=2)
    assert active_hook_count(model) == model.geolens_test_hooks
    m64 = as_float64(model)
    adapter = adapter_for(m64)
    x = input_embeddings(m64, tokens[: position + 1])
    xb = input_embeddings(m64, baseline[: position + 1])
    total = torch.zeros_like(x)
    for s in range(steps):
        alpha = (s + 0.5) / steps
        point = (xb + alpha * (x - xb)).clone().requires_grad_(True)
        with torch.enable_grad():
            f = torch.log_softmax(adapter.forward_from_layer(point[None], 0)[0, -1], -1)[got.target]
            (grad,) = torch.autograd.grad(f, point)
        total += grad
    expected = [float(((x[j] - xb[j]) * total[j]).sum()) / steps for j in range(position + 1)]
    assert got.attributions[: position + 1].tolist() == pytest.approx(expected, abs=1e-5, rel=1e-3)
    assert got.attributions[0] == 0 and got.attributions[position] == 0  # BOS and the position are not on the path
    assert torch.all(got.attributions[position + 1 :] == 0)


def test_integrated_gradients_completeness_within_the_discretisation_error(model):
    """Σ_j IG_j − (f(x) − f(x′)) is the midpoint rule's error on a smooth path integral: in float64
    it falls about 16× for 4× the steps (second order) and is negligible at 128 steps."""
    m64 = as_float64(model)
    tokens = text_tokens(model, 12)
    baseline = erase(tokens, torch.arange(12) > 0, space_token(model))
    gaps = {}
    for steps in (8, 32, 128):
        ig = integrated_gradients(m64, tokens, baseline, 10, n_steps=steps, batch_size=64)
        gaps[steps] = abs(ig.completeness_gap)
        span = abs(ig.f_input - ig.f_baseline)
    assert span > 1e-4
    assert gaps[128] < 1e-5 * max(span, 1.0)
    assert gaps[8] > gaps[32] and 6 < gaps[32] / gaps[128] < 40, gaps


def test_gradient_helpers_remove_hooks_on_error(model):
    tokens = text_tokens(model, 8)
    with pytest.raises(IndexError):
        integrated_gradients(model, tokens, tokens, 6, target=model.cfg.d_vocab + 5, n_steps=2)
    assert active_hook_count(model) == model.geolens_test_hooks
    with pytest.raises(IndexError, match="position=8 is out of range"):
        gradient_x_input(model, tokens, 8)
    with pytest.raises(ValueError, match="baseline"):
        integrated_gradients(model, tokens, tokens[:5], 4)


# --- one document end to end ------------------------------------------------------------------------


def test_measure_document_conditions_are_hand_built_erasures(model):
    """Every condition's KL and Δp equal a full forward of the input built by hand from scores
    recomputed independently (flow row, seeded random, gradient × input, integrated gradients)."""
    settings = ErasureSettings(**{**SMALL, "methods": ("random", "contribution", "integrated_gradients")})
    window = text_tokens(model, 12, doc=3)
    counts = unigram_counts(model, TEXTS)
    space = space_token(model)
    tables = measure_document(model, window, 7, settings, space_id=space, counts=counts)
    assert active_hook_count(model) == model.geolens_test_hooks
    cond, preds, ranks = tables["conditions"], tables["predictions"], tables["rankings"]
    n_expected = (
        len(settings.positions) * len(settings.replacements) * (1 + len(settings.methods) * 2 * len(settings.fractions))
    )
    assert len(cond) == n_expected and len(preds) == 2 and len(ranks) == 2 * len(settings.methods)
    with torch.no_grad():
        _, cache = model.run_with_cache(window[None, :12], names_filter=flow_names_filter(model))
        flow = contribution_flow(model, cache, "contribution")[0]
    unigram = np.random.default_rng([2026, 7, 2]).choice(counts.numel(), size=12, p=(counts / counts.sum()).numpy())
    for i in settings.positions:
        prefix = window[: i + 1]
        target = int(preds.set_index("position").loc[i, "target"])
        baseline = prefix.clone()
        baseline[1:i] = space
        ig = integrated_gradients(model, prefix, baseline, i, target=target, n_steps=4)
        scores = {
            "contribution": flow[i, : i + 1],
            "random": torch.from_numpy(np.random.default_rng([2026, 7, i, 1]).random(i + 1)),
            "integrated_gradients": ig.attributions.abs(),
        }
        for method, s in scores.items():
            order = sorted(range(1, i), key=lambda j: (-float(s[j]), j))
            saved = ranks[(ranks.position == i) & (ranks.method == method)].order.iloc[0]
            assert [int(v) for v in saved.split()] == order, method
        rows = cond[cond.position == i]
        naive = {}
        for r in rows.itertuples():
            if r.method == "all":
                erased = list(range(1, i))
            else:
                order = [
                    int(v) for v in ranks[(ranks.position == i) & (ranks.method == r.method)].order.iloc[0].split()
                ]
                n = max(1, math.ceil(r.fraction * len(order) - 1e-9))
                erased = order[:n] if r.direction == "comprehensiveness" else order[n:]
            assert r.n_erased == len(erased)
            built = prefix.tolist()
            for j in erased:
                built[j] = space if r.replacement == "space" else int(unigram[j])
            if tuple(built) not in naive:
                naive[tuple(built)] = naive_outcome(model, prefix.tolist(), built, target)
            kl, dp, _ = naive[tuple(built)]
            assert r.kl == pytest.approx(kl, abs=1e-6) and r.delta_p == pytest.approx(dp, abs=1e-6), r
        p = preds[preds.position == i].iloc[0]
        assert p.n_erasable == i - 1 and p.target == ig.target
        assert (p.ig_sum, p.ig_f_input, p.ig_f_baseline) == pytest.approx(
            (float(ig.attributions.sum()), ig.f_input, ig.f_baseline), abs=1e-6
        )


# --- statistics ---------------------------------------------------------------------------------------


# --- known answer ---------------------------------------------------------------------------------------


# --- settings and the pre-registered protocol ------------------------------------------------------


def test_settings_are_checked():
    with pytest.raises(ValueError, match="positions"):
        ErasureSettings(positions=(1, 5))
    with pytest.raises(ValueError, match="fractions"):
        ErasureSettings(fractions=(0.0, 0.5))
    with pytest.raises(ValueError, match="methods"):
        ErasureSettings(methods=("contribution", "lime"))
    with pytest.raises(ValueError, match="replacements"):
        ErasureSettings(replacements=("mask",))


def _protocol():
    return json.loads((FOLDER / "protocol.json").read_text(encoding="utf-8"))


def test_protocol_text_is_frozen_by_its_recorded_hash():
    digest = hashlib.sha256((FOLDER / "PROTOCOL.md").read_bytes()).hexdigest()
    assert digest == (FOLDER / "PROTOCOL.sha256").read_text().strip(), (
        "docs/flow/PROTOCOL.md changed after it was fixed: a new version needs a new version number in protocol.json and a new PROTOCOL.sha256"
    )
    assert f"version {_protocol()['version']}" in (FOLDER / "PROTOCOL.md").read_text(encoding="utf-8")


def test_protocol_twin_is_the_code_default_and_says_what_the_text_says():
    p = _protocol()
    s = ErasureSettings.from_protocol(p)
    assert s == ErasureSettings()  # the code's defaults are the protocol's
    assert set(s.methods) == set(ERASURE_METHODS)
    assert (
        p["data"]["n_documents"] >= p["data"]["min_documents"] >= 100
        and p["statistics"]["multiple_comparison"] == "holm"
    )
    assert max(p["fractions"]) <= 0.2 and p["statistics"]["verdicts"] == ["holds", "reversed", "tie", "not testable"]
    text = " ".join((FOLDER / "PROTOCOL.md").read_text(encoding="utf-8").split())  # line breaks as spaces
    assert "{" + ", ".join(f"{k:.2f}" for k in p["fractions"]) + "}" in text
    assert "positions 15, 31 and 63" in text
    assert f"B = {p['statistics']['n_boot']}" in text and f"{p['integrated_gradients']['steps']} steps" in text
    assert (
        f"first {p['data']['seq_len'] - 1} tokens" in text
        and f"at least {p['data']['min_document_tokens']} tokens" in text
    )
    for phrase in (
        "Holm",
        "not testable",
        "single space",
        "unigram",
        "[2026, document_index, position, 1]",
        "[2026, document_index, 2]",
        "≈ 245 FE",
    ):
        assert phrase in text, phrase
    labels = {
        "random": "random",
        "attention_rollout": "attention rollout",
        "value_zeroing_rollout": "Value Zeroing rollout",
        "alti": "ALTI",
        "contribution": "contribution",
        "grad_x_input": "gradient × input",
        "integrated_gradients": "integrated gradients",
    }
    order = text.split("**Methods, in this order:**")[1].split(" - ")[0]
    positions = [order.index(labels[m]) for m in p["methods"]]
    assert positions == sorted(positions)


# --- the real model (slow tier) ------------------------------------------------------------------------


@pytest.mark.slow
def test_one_smollm2_window_end_to_end(smollm2, smollm2_tokens):
    """measure_document on SmolLM2 (the prediction at position 15 of a Lee window, every method, 16
    integrated-gradient steps): the space token is one token, a condition equals its hand-built
    forward, integrated gradients' completeness gap is the discretisation's (it falls well over 4×
    at 4× the steps), and the known-answer check runs on every flow."""
    model, window = smollm2, smollm2_tokens[0, :16]
    settings = ErasureSettings(positions=(15,), ig_steps=16, replacements=("space",))
    space = space_token(model)
    assert model.tokenizer.decode([space]) == " "
    tables = measure_document(model, window, 0, settings, space_id=space)
    cond, preds, ranks = tables["conditions"], tables["predictions"], tables["rankings"]
    assert len(cond) == 1 + len(ERASURE_METHODS) * 2 * 5 and cond.kl.ge(0).all()
    target = int(preds.target.iloc[0])
    r = cond[(cond.method == "contribution") & (cond.direction == "comprehensiveness") & (cond.fraction == 0.2)].iloc[0]
    order = [int(v) for v in ranks[ranks.method == "contribution"].order.iloc[0].split()]
    built = window.tolist()
    for j in order[: r.n_erased]:
        built[j] = space
    kl, dp, _ = naive_outcome(model, window.tolist(), built, target)
    assert (
        r.n_erased == 3 and r.kl == pytest.approx(kl, rel=1e-3, abs=1e-6) and r.delta_p == pytest.approx(dp, abs=1e-5)
    )
    p = preds.iloc[0]
    gap16 = abs(p.ig_sum - (p.ig_f_input - p.ig_f_baseline))
    baseline = window.clone()
    baseline[1:15] = space
    gap64 = abs(integrated_gradients(model, window, baseline, 15, target=target, n_steps=64).completeness_gap)
    print(
        f"integrated gradients, f(x) - f(x') = {p.ig_f_input - p.ig_f_baseline:.4f}: completeness gap {gap16:.4f} (16 steps), {gap64:.4f} (64 steps)"
    )
    assert gap16 <= 0.15 * abs(p.ig_f_input - p.ig_f_baseline) and gap64 < gap16 / 4
    table = induction_check(model)
    assert len(table) == 4 * 19 and set(table.method) == {
        "contribution",
        "alti",
        "attention_rollout",
        "value_zeroing_rollout",
    }
    print(induction_summary(table))


@pytest.mark.bridge_only
def test_doctests():
    import doctest

    import geolens.flow.erasure as module
    import geolens.flow.summary as summary

    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
    assert doctest.testmod(summary, optionflags=doctest.ELLIPSIS).failed == 0
