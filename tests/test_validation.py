"""Argument validation: bad input that would give a plausible number or a misleading error gets a
one-line error naming the problem."""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny

from geolens import attention_metrics, contribution_weights, influence_factors, names_filter
from geolens.testing import tiny_tokens
from geolens.validation import check_choice, check_dtype, check_eps, check_layer


@pytest.fixture(scope="module")
def gqa():
    model = make_tiny("gqa")
    _, cache = model.run_with_cache(tiny_tokens(model), names_filter=names_filter(model))
    return model, cache


FUNCTIONS = [contribution_weights, attention_metrics, influence_factors]


@pytest.mark.parametrize("fn", FUNCTIONS)
@pytest.mark.parametrize("eps", [-1.0, float("nan"), float("inf")])
def test_bad_eps_is_refused(gqa, fn, eps):
    model, cache = gqa
    with pytest.raises(ValueError, match="eps must be a finite number ≥ 0"):
        fn(model, cache, 0, eps=eps)


@pytest.mark.parametrize("fn", FUNCTIONS)
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_integer_dtype_is_refused(gqa, fn, dtype):
    model, cache = gqa
    with pytest.raises(ValueError, match="floating-point dtype"):
        fn(model, cache, 0, dtype=dtype)


@pytest.mark.parametrize("fn", FUNCTIONS)
def test_negative_layer_works_everywhere(gqa, fn):
    model, cache = gqa
    last = model.cfg.n_layers - 1
    a, b = fn(model, cache, -1), fn(model, cache, last)
    if isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b)
    else:
        assert a.layer == b.layer == last
        torch.testing.assert_close(
            a.attention if hasattr(a, "attention") else a.contribution,
            b.attention if hasattr(b, "attention") else b.contribution,
        )


@pytest.mark.parametrize("fn", FUNCTIONS)
@pytest.mark.parametrize("layer", [1.0, True, "1"])
def test_non_integer_layer_is_refused(gqa, fn, layer):
    model, cache = gqa
    with pytest.raises(TypeError, match="layer must be an integer layer index"):
        fn(model, cache, layer)


@pytest.mark.parametrize("fn", FUNCTIONS)
def test_layer_out_of_range(gqa, fn):
    model, cache = gqa
    with pytest.raises(IndexError, match="out of range: the model has 2 layers"):
        fn(model, cache, 2)
    with pytest.raises(IndexError, match="out of range"):
        fn(model, cache, -3)


def test_check_layer_never_wraps_when_asked():
    assert check_layer(-1, 30) == 29
    with pytest.raises(IndexError, match="0…29"):
        check_layer(-1, 30, allow_negative=False)
    with pytest.raises(IndexError):
        check_layer(99, 30, allow_negative=False)
    assert check_layer(torch.tensor(3), 30) == 3


def test_check_eps_and_dtype():
    assert check_eps(0) == 0.0
    with pytest.raises(TypeError):
        check_eps(True)
    with pytest.raises(TypeError):
        check_eps("small")
    assert check_dtype(torch.float64) is torch.float64
    with pytest.raises(TypeError):
        check_dtype("float32")


def test_foreign_cache_gqa_into_mha_is_refused():
    """A grouped-query model's cache read with a multi-head model is refused (not expanded to its heads)."""
    from conftest import TINY_KINDS

    assert "mha" in TINY_KINDS
    gqa_model = make_tiny("gqa")
    mha_model = make_tiny("mha")
    _, cache = gqa_model.run_with_cache(tiny_tokens(gqa_model), names_filter=names_filter(gqa_model))
    with pytest.raises(ValueError, match="kv heads .*another model"):
        contribution_weights(mha_model, cache, 0)


def test_foreign_cache_with_more_layers_is_refused():
    deep = make_tiny("gqa", n_layers=3)
    shallow = make_tiny("gqa", n_layers=2)
    _, cache = deep.run_with_cache(tiny_tokens(deep), names_filter=names_filter(deep))
    with pytest.raises(ValueError, match="cache holds layer 2 but the model has 2 layers"):
        contribution_weights(shallow, cache, 0)


def test_sequences_longer_than_the_context_are_refused_where_geolens_runs_the_model(tiny_gqa):
    from geolens import run_corpus
    from geolens.data import token_windows
    from geolens.sinks.norm_curve import NormCurve
    from geolens.testing import tiny_tokens
    from geolens.validation import check_context

    model = tiny_gqa[0]
    n_ctx = model.cfg.n_ctx
    assert check_context(model, n_ctx) == n_ctx
    with pytest.raises(ValueError, match=rf"{n_ctx + 1} tokens is longer than the model's context \(n_ctx = {n_ctx}\)"):
        check_context(model, n_ctx + 1)
    with pytest.raises(ValueError, match="longer than the model's context"):
        run_corpus(
            model,
            tiny_tokens(model, length=n_ctx + 8),
            [NormCurve(model.cfg.n_layers, model.cfg.n_heads)],
            progress=False,
        )
    with pytest.raises(ValueError, match=f"seq_len {n_ctx + 1}: a window"):
        token_windows(model, ["a b c " * 200], n_ctx + 1)


def test_check_choice_names_the_argument_and_every_choice():
    assert check_choice("inter", ("intra", "inter"), name="mode") == "inter"
    for bad in ("all", "", None, 1, ["intra"]):
        with pytest.raises(ValueError) as err:
            check_choice(bad, ("intra", "inter"), name="mode")
        assert str(err.value) == f"mode must be one of 'intra', 'inter', got {bad!r}"
    with pytest.raises(
        ValueError, match=r"^queries must be one of 'all' \(every query\), 'final' \(the last one\), got 'first'$"
    ):
        check_choice("first", {"all": "every query", "final": "the last one"}, name="queries")
    # every function that takes a choice refuses a bad one with this message
    from geolens.selection.scores import rankings
    from geolens.taxonomy import TaxonomyAnalysis
    from geolens.viz.contributions import signed_heatmaps

    with pytest.raises(ValueError, match="^by must be one of 'attention', 'norm', got 'rank'$"):
        rankings(torch.ones(1), torch.ones(1), "rank")
    with pytest.raises(ValueError, match="^space must be one of 'value' .*, 'projected' .*, got 'raw'$"):
        TaxonomyAnalysis(2, 4, space="raw")
    with pytest.raises(ValueError, match="^scale must be one of 'symmetric', 'per_sign', got 'log'$"):
        signed_heatmaps(torch.zeros(1, 2, 2), ["a", "b"], scale="log")
