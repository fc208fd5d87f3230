"""geolens.evaluate_attribution (geolens/faithfulness/evaluation.py): a metric registered here is scored
against the per-term ground truth; its partial Spearman equals an explicit float64 loop (one full
forward per removed term, ranks and correlations by hand); a copy of value-weighted attention scores
0; bad methods are one-line errors; the model comes back as it was, also after an exception."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import geolens
from geolens.metrics import unregister_metric
from geolens.per_term import float64_exact
from geolens.testing import tiny_bridge

pytestmark = pytest.mark.bridge_only  # float64 per-term effects are computed on the TL 4.x bridge

ROOT = Path(__file__).resolve().parents[2]
TEXTS = ["the cat sat on the mat.", "a dog ran far away!", "seven wizards judge boxing"]


@pytest.fixture
def registered():
    """Register metrics for one test; unregister them whatever happens."""
    names = []

    def register(name, fn, **options):
        geolens.register_metric(name, label=name, fn=fn, default=False, **options)
        names.append(name)
        return name

    yield register
    for name in names:
        unregister_metric(name)


@pytest.fixture(scope="module")
def evaluated():
    """√α ‖ṽ‖ (not a monotone function of the norm α‖ṽ‖) evaluated on the tiny GQA model."""
    geolens.register_metric("sqrt_weighted", label="√α‖ṽ‖", fn=lambda x: x.alpha.sqrt() * x.value_norm, default=False)
    try:
        model = tiny_bridge("gqa")
        yield model, geolens.evaluate_attribution("sqrt_weighted", model, TEXTS, n_boot=200)
    finally:
        unregister_metric("sqrt_weighted")


# ---------------------------------------------------------------------------------------------
# The oracle: explicit loops in float64


def _ranks(x):
    return [sum(b < a for b in x) + (sum(b == a for b in x) + 1) / 2.0 for a in x]


def _pearson(a, b):
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    num = sum((x - ma) * (y - mb) for x, y in zip(a, b))
    return num / math.sqrt(sum((x - ma) ** 2 for x in a) * sum((y - mb) ** 2 for y in b))


def _spearman(s, e):
    return _pearson(_ranks(s), _ranks(e))


def _partial(s, e, n):
    rs, re_, rn = _ranks(s), _ranks(e), _ranks(n)
    r_se, r_sn, r_en = _pearson(rs, re_), _pearson(rs, rn), _pearson(re_, rn)
    return (r_se - r_sn * r_en) / math.sqrt((1 - r_sn**2) * (1 - r_en**2))


@torch.no_grad()
def _naive_position(model, tokens, layer: int, query: int) -> dict:
    """For every term (h, j) with α ≠ 0: a full forward of the text with α_qj^h = 0 (one batch row
    per term), the KL of the next-token distribution at ``query``, the norm of the change of the
    attention output there (= ‖α ṽ‖) and the test metric √α‖ṽ‖ = norm / √α."""
    pattern_name, out_name = f"blocks.{layer}.attn.hook_pattern", f"blocks.{layer}.attn.hook_out"
    logits, cache = model.run_with_cache(tokens, names_filter=lambda n: n in (pattern_name, out_name))
    alpha = cache[pattern_name][0, :, query]
    terms = [(h, j) for h in range(alpha.shape[0]) for j in range(query + 1) if float(alpha[h, j]) != 0]
    seen = {}

    def zero(pattern, hook):
        pattern = pattern.clone()
        for row, (h, j) in enumerate(terms):
            pattern[row, h, query, j] = 0.0
        return pattern

    def keep(x, hook):
        seen["out"] = x[:, query]

    with model.hooks(fwd_hooks=[(pattern_name, zero), (out_name, keep)]):
        removed = model(tokens.expand(len(terms), -1), return_type="logits")[:, query]
    logp = torch.log_softmax(logits[0, query].double(), -1)
    kl, norm, score = {}, {}, {}
    for row, (h, j) in enumerate(terms):
        logq = torch.log_softmax(removed[row].double(), -1)
        kl[(h, j)] = float((logp.exp() * (logp - logq)).sum())
        norm[(h, j)] = float((cache[out_name][0, query] - seen["out"][row]).double().norm())
        score[(h, j)] = norm[(h, j)] / math.sqrt(float(alpha[h, j]))
    return dict(kl=kl, norm=norm, score=score)


def test_partial_spearman_equals_an_explicit_float64_loop(evaluated):
    _, result = evaluated
    model = tiny_bridge("gqa").to(torch.float64)  # the cast evaluate_attribution makes
    positions = result.positions.sort_values("query").drop_duplicates(["document", "layer", "query"]).iloc[:2]
    with float64_exact(model):
        for p in positions.itertuples():
            tokens = model.to_tokens(TEXTS[p.document], prepend_bos=True)
            naive = _naive_position(model, tokens, p.layer, p.query)
            terms = result.terms[(result.terms.document == p.document) & (result.terms.position == p.position)]
            keys = list(zip(terms["head"], terms["source"]))
            assert sorted(keys) == sorted(naive["kl"])  # every term with α ≠ 0, each once
            for column in ("kl", "norm", "score"):
                measured = terms[column].to_numpy()
                expected = np.array([naive[column][k] for k in keys])
                assert np.allclose(measured, expected, rtol=1e-9, atol=1e-15), column
            s, e, n = ([naive[c][k] for k in keys] for c in ("score", "kl", "norm"))
            assert p.norm_controlled == pytest.approx(_partial(s, e, n), abs=1e-9)
            assert p.plain == pytest.approx(_spearman(s, e), abs=1e-9)
            assert abs(p.norm_controlled) > 1e-3  # √α‖ṽ‖ ranks otherwise than the norm


def test_summary_means_and_intervals(evaluated):
    model, result = evaluated
    primary = result.row()
    assert primary["metric"] == "sqrt_weighted" and primary["n_positions"] == len(result.positions) == 6
    assert primary["mean"] == pytest.approx(result.positions.norm_controlled.mean())
    assert primary["ci_low"] <= primary["mean"] <= primary["ci_high"]
    assert result.row(metric="value_weighted")["mean"] == 0.0  # the norm itself
    family = result.differences[result.differences.analysis == "norm_controlled"]
    assert list(family.a) == ["value_weighted", "raw_attention"] and family.p_adj.notna().all()
    assert family.estimate.iloc[0] == pytest.approx(primary["mean"])
    assert set(result.summary.analysis) == set(geolens.faithfulness.norm_controlled.ANALYSES)
    assert result.to_dataframe().shape == (3 * len(set(result.summary.analysis)), result.summary.shape[1])
    assert "sqrt_weighted" in repr(result) and "<table" in result._repr_html_()
    assert next(model.parameters()).dtype == torch.float32 and model.cfg.dtype == torch.float32


def test_a_copy_of_value_weighted_scores_zero_beyond_the_norm(evaluated, registered):
    model, first = evaluated
    name = registered("norm_copy", lambda x: x.alpha * x.value_norm)
    tokens = [model.to_tokens(t, prepend_bos=True) for t in TEXTS]
    result = geolens.evaluate_attribution(name, "tiny-gqa", tokens=tokens, n_boot=100)  # a model by name
    assert (result.positions.norm_controlled == 0.0).all()
    ids = ["document", "position", "layer", "query"]
    assert result.positions[ids].equals(first.positions[ids])  # the same seeded draws
    vw = result.differences[
        (result.differences.analysis == "norm_controlled") & (result.differences.a == "value_weighted")
    ]
    assert vw.verdict.item() == "not testable"


@pytest.mark.parametrize("method", ["no_such_metric", "alti", "value_zeroing", "contribution_flow"])
def test_a_method_without_term_level_scores_is_a_one_line_error(method):
    with pytest.raises(ValueError) as info:
        geolens.evaluate_attribution(method, "tiny-gqa", TEXTS)
    message = str(info.value)
    assert "\n" not in message and repr(method) in message
    assert "contribution_abs" in message and "value_weighted" in message  # the allowed ones


def test_a_plain_callable_is_scored_as_its_registered_twin_and_a_wrong_shape_is_one_line(registered):
    """A callable with a metric's signature (LayerInputs -> [batch, head, query, key]) needs no
    registration: it is scored as the same fn registered; what it returns is checked in one line."""
    model = tiny_bridge("gqa")

    def sqrt_weighted(x):
        return x.alpha.sqrt() * x.value_norm

    plain = geolens.evaluate_attribution(sqrt_weighted, model, TEXTS, n_boot=100, progress=False)
    twin = registered("sqrt_weighted_twin", sqrt_weighted)
    named = geolens.evaluate_attribution(twin, model, TEXTS, n_boot=100, progress=False)
    assert plain.method == "sqrt_weighted"
    assert np.array_equal(plain.terms["score"].to_numpy(), named.terms["score"].to_numpy())
    with pytest.raises(ValueError) as info:
        geolens.evaluate_attribution(lambda x: x.alpha[:, :1], model, TEXTS, progress=False)
    message = str(info.value)
    assert "\n" not in message and "'callable'" in message and "[batch, head, query, key]" in message


def test_a_registered_metric_is_a_term_level_method(registered):
    from geolens.faithfulness.evaluation import term_level_methods

    assert "mine" not in term_level_methods()
    registered("mine", lambda x: x.alpha)
    assert "mine" in term_level_methods()


def _state(model):
    dtypes = {k: t.dtype for k, t in [*model.named_parameters(), *model.named_buffers()]}
    hooks = [
        (name, len(m._forward_hooks), len(m._forward_pre_hooks), "forward" in vars(m), "_masked_softmax" in vars(m))
        for name, m in model.named_modules()
    ]
    return dtypes, hooks, model.cfg.dtype


def test_the_model_is_restored_after_an_exception(registered):
    def boom(x):
        raise RuntimeError("boom from the metric")

    name = registered("boom", boom)
    model = tiny_bridge("gqa")
    tokens = model.to_tokens(TEXTS[0], prepend_bos=True)
    model(tokens), model.run_with_cache(tokens)  # the bridge adds its own hooks at its first forwards
    before = _state(model)
    weights = {k: p.detach().clone() for k, p in model.named_parameters()}
    geolens.evaluate_attribution("raw_attention", model, TEXTS[:1], n_boot=50)
    assert _state(model) == before
    with pytest.raises(RuntimeError, match="boom from the metric"):
        geolens.evaluate_attribution(name, model, TEXTS[:1])
    assert _state(model) == before
    assert all(torch.equal(p, weights[k]) for k, p in model.named_parameters())


def test_module_doctests():
    """The examples of the module's helpers (evaluate_attribution's runs in tests/test_public_api.py)."""
    import doctest

    from geolens.faithfulness.evaluation import float64_model, term_level_methods

    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for obj in (float64_model, term_level_methods):
        for test in doctest.DocTestFinder().find(obj, globs=dict(vars(sys.modules[obj.__module__]))):
            runner.run(test)
    assert runner.summarize(verbose=False).failed == 0


@pytest.mark.slow
def test_the_defaults_reproduce_protocol_3_on_smollm2():
    """Measured on the Lee windows (reference=False), a model of the protocol and its metric: the
    positions of the pre-registered run's first document exactly, every term's KL within 100 times
    its position's numerical floor and its score within 1e-9 (relative), and each position's
    statistic that of its terms (docs/evaluate.md). Bit for bit held on the machine of the run, on one
    thread; on another CPU (AMD EPYC here, against the run's) float64 sums round differently, by
    about one floor."""
    import pandas as pd

    from geolens.faithfulness.norm_controlled import position_statistics

    folder = ROOT / "docs" / "faithfulness" / "v3" / "smollm2-135m"
    if not (folder / "per_term_terms.csv.gz").is_file():
        pytest.skip(f"{folder} holds no protocol-3 run")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the run (--threads 1): the same reductions, so the same bits
    try:
        result = geolens.evaluate_attribution(
            "contribution_abs", "smollm2-135m", n_documents=1, n_boot=100, reference=False, cache=False
        )
    finally:
        torch.set_num_threads(threads)
    terms = pd.read_csv(folder / "per_term_terms.csv.gz", float_precision="round_trip")
    positions = pd.read_csv(folder / "per_term_positions.csv.gz", float_precision="round_trip")
    terms, positions = terms[terms.document == 0], positions[positions.document == 0]
    ids = ["document", "position", "layer", "query", "n_terms"]
    assert result.positions[ids].reset_index(drop=True).equals(positions[ids].reset_index(drop=True))
    both = result.terms.merge(terms, on=["document", "position", "head", "source"], suffixes=("", "_stored"))
    assert len(both) == len(result.terms) == len(terms)
    floors = both.merge(positions[["position", "floor"]], on="position")["floor"].to_numpy()
    assert (np.abs(both.kl - both.kl_stored).to_numpy() <= 100 * floors).all()
    np.testing.assert_allclose(both.score, both.contribution_stored.abs(), rtol=1e-9, atol=0)
    # each position's statistic is the protocol's of its terms (the KLs measured here: those at the
    # floor rank by rounding noise, so against the published KLs the statistic moves by up to 1e-3)
    mine = terms.set_index(["position", "head", "source"])
    measured = both.set_index(["position", "head", "source"])
    mine = mine.assign(kl=measured.kl, delta_logp_next=measured.delta_logp_next).reset_index()
    for p in result.positions.itertuples():
        here = position_statistics(mine[mine.position == p.position], float(p.floor))
        published = position_statistics(terms[terms.position == p.position], float(p.floor))
        assert p.norm_controlled == pytest.approx(here["norm_controlled"]["contribution_abs"], abs=1e-9)
        assert p.norm_controlled == pytest.approx(published["norm_controlled"]["contribution_abs"], abs=1e-3)


def test_several_methods_share_one_measurement_of_the_effects_and_equal_their_own_calls():
    """A list of methods: one evaluation each, in order, each equal to its own call (the effects are
    measured once for all of them), progress as a callable once per document."""
    model = tiny_bridge("gqa")
    texts = ["the cat sat on the mat.", "a dog ran far away!"]
    lines = []
    both = geolens.evaluate_attribution(
        ["contribution_abs", "raw_attention"], model, texts, n_boot=100, progress=lines.append
    )
    assert [r.method for r in both] == ["contribution_abs", "raw_attention"] and len(lines) == 2
    for result in both:
        alone = geolens.evaluate_attribution(result.method, model, texts, n_boot=100, progress=False)
        assert result.summary.equals(alone.summary) and result.terms.equals(alone.terms)
    with pytest.raises(ValueError, match="each method once"):
        geolens.evaluate_attribution(["raw_attention", "raw_attention"], model, texts)
    with pytest.raises(ValueError, match="at least one"):
        geolens.evaluate_attribution([], model, texts)
