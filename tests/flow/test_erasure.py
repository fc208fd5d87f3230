"""The input-token erasure test of contribution flow (geolens.flow.erasure, docs/flow/PROTOCOL.md):
erasure against hand-built forwards, gradient × input against float64 finite differences,
integrated gradients against a step-by-step float64 Riemann sum and its completeness, nAOPC on a
hand-made example, the document-cluster bootstrap and Holm, the known-answer check, the claims,
and the pre-registered protocol's text, hash and twin."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import TINY_KINDS, make_tiny

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
    induction_tokens,
    input_embeddings,
    integrated_gradients,
    measure_document,
    method_pairs,
    n_erased,
    ranking,
    replacement_ids,
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
from geolens.interventions.base import active_hook_count
from geolens.stats import cluster_bootstrap_indices, holm, percentile_ci

FOLDER = Path(__file__).resolve().parents[2] / "docs" / "flow"


KINDS: dict[int, str] = {}


@pytest.fixture(scope="module", params=TINY_KINDS)
def model(request):
    m = make_tiny(request.param)
    KINDS[id(m)] = request.param
    with torch.no_grad():  # the bridge's first run_with_cache leaves transformers' own output-capturing hooks
        m.run_with_cache(torch.tensor([[0, 5, 6]]))
    m.geolens_test_hooks = active_hook_count(m)
    return m


def as_float64(model):
    """A float64 copy of a tiny model (same kind and seed, so the same weights)."""
    m = make_tiny(KINDS[id(model)])
    m.to(torch.float64)
    return m


# a few short documents (the TL 2.x environment has no gensim, hence no offline corpora)
TEXTS = [
    "the river rose overnight and the bridge was closed to traffic until noon.",
    "a new library opened in the town centre, with a cafe on its top floor.",
    "farmers expect a late harvest after three weeks of cold and rain.",
    "the council voted to repair the old school roof before the winter.",
    "two climbers reached the summit on friday and came down safely.",
    "prices of fresh fruit fell as the first summer crops reached the market.",
]


def text_tokens(model, n: int = 14, doc: int = 0) -> torch.Tensor:
    ids = model.tokenizer(TEXTS[doc], add_special_tokens=False)["input_ids"][: n - 1]
    return torch.tensor([model.tokenizer.bos_token_id] + ids)


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
    with pytest.raises(ValueError, match="position"):
        gradient_x_input(model, tokens, 8)
    with pytest.raises(ValueError, match="baseline"):
        integrated_gradients(model, tokens, tokens[:5], 4)


# --- one document end to end ------------------------------------------------------------------------

SMALL = dict(
    positions=(6, 11),
    fractions=(0.1, 0.5),
    methods=("random", "contribution", "grad_x_input", "integrated_gradients"),
    ig_steps=4,
    n_boot=200,
)


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


# --- known answer ---------------------------------------------------------------------------------------


def test_induction_check_reads_the_flow_rows(model):
    tokens = induction_tokens(model, 6, seed=0)
    assert (
        tokens[0] == model.tokenizer.bos_token_id
        and torch.equal(tokens[1:7], tokens[7:])
        and len(set(tokens[1:7].tolist())) == 6
    )
    assert not set(tokens[1:].tolist()) & set(model.tokenizer.all_special_ids)
    table = induction_check(model, n_tokens=6, methods=("contribution", "alti"))
    assert active_hook_count(model) == model.geolens_test_hooks
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens[None], names_filter=flow_names_filter(model))
        R = contribution_flow(model, cache, "alti")[0]
    for r in table[table.method == "alti"].itertuples():
        row = R[r.query].tolist()
        others = [(row[j], -j) for j in range(r.query) if j != r.query]
        best = -max(others)[1]
        assert (
            r.largest_other == best
            and r.passes == (best == r.k + 1)
            and r.share_target == pytest.approx(row[r.k + 1], abs=1e-6)
        )
        assert r.rank_target == 1 + sum(1 for v, mj in others if (v, mj) > (row[r.k + 1], -(r.k + 1)))
    s = induction_summary(table)
    assert s["alti"]["n"] == 5 and s["alti"]["passed"] == int(table[table.method == "alti"].passes.sum())
    with pytest.raises(ValueError, match="fewer than"):
        induction_tokens(model, 20)


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
