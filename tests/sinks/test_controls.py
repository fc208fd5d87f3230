"""Sink-intervention controls (docs/method.md §4.5, issue 10 item 5) against hand-built edits and naive loops."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import TINY_KINDS, make_tiny
from reference import naive_v0

from geolens.adapter import hook_name
from geolens.interventions import active_hook_count, applied
from geolens.interventions.sink_values import (
    SINK_EDIT_KINDS,
    SinkEditSpec,
    rotation_direction,
    sink_edit,
    sink_edit_applied,
    sink_edit_query_heads,
)
from geolens.sinks.controls import ALL, ROTATE_POOLED, default_conditions, edited_window, sink_controls
from geolens.sinks.controls_protocol import edit_dose
from geolens.testing import tiny_tokens

V = "attn.hook_v"
TEXTS = ("the cat sat on the mat.", "a dog ran far away!!", "one two three four five", "big red boxes fly high")


@pytest.fixture(scope="module", params=["gqa", "mha"])
def model_tokens(request):
    model = make_tiny(request.param)
    return model, tiny_tokens(model, TEXTS, length=12)


def _values(model, tokens, fwd_hooks=(), layer=1):
    """(logits, cached hook_v of ``layer``) with the hooks applied."""
    name = hook_name(layer, V)
    with torch.no_grad(), applied(model, list(fwd_hooks)):
        logits, cache = model.run_with_cache(tokens, names_filter=lambda n: n == name)
    return logits, cache[name]


def _naive_edit(v, spec, *, layer, corpus_mean=None, position=None):
    """The edit built by hand: loops over rows and kv heads, float64, Python arithmetic."""
    v = v.double()
    out = v.clone()
    b, pos, n_kv, d = v.shape
    for r in range(b):
        for k in range(n_kv):
            v0 = v[r, 0, k]
            if spec.kind == "scale":
                out[r, 0, k] = spec.lam * v0
            elif spec.kind == "remove":
                out[r, 0, k] = 0
            elif spec.kind == "mean_tail":
                out[r, 0, k] = sum(v[r, j, k] for j in range(1, pos)) / (pos - 1)
            elif spec.kind == "rescale_mean_norm":
                target = sum(math.sqrt(float((v[r, j, k] ** 2).sum())) for j in range(1, pos)) / (pos - 1)
                out[r, 0, k] = v0 * (target / math.sqrt(float((v0**2).sum())))
            elif spec.kind == "corpus_mean":
                out[r, 0, k] = corpus_mean[k]
            elif spec.kind == "rotate":
                g = rotation_direction(spec.seed, layer, n_kv, d)[k]
                n0 = math.sqrt(float((v0**2).sum()))
                u = g - float((g * v0).sum()) / n0**2 * v0  # Gram-Schmidt against v_0
                out[r, 0, k] = n0 * u / math.sqrt(float((u**2).sum()))
            elif spec.kind == "random_token":
                j = position if isinstance(position, int) else int(position[r])
                out[r, j, k] = spec.lam * v[r, j, k]
    return out


SPECS = [
    SinkEditSpec("scale", 0.0),
    SinkEditSpec("scale", 2.0),
    SinkEditSpec("remove"),
    SinkEditSpec("mean_tail"),
    SinkEditSpec("rescale_mean_norm"),
    SinkEditSpec("corpus_mean"),
    SinkEditSpec("rotate", seed=0),
    SinkEditSpec("rotate", seed=7),
    SinkEditSpec("random_token", 0.0),
    SinkEditSpec("random_token", 2.0),
]


def test_every_kind_is_tested():
    assert {s.kind for s in SPECS} == set(SINK_EDIT_KINDS)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.label)
def test_edited_hook_v_equals_the_hand_built_edit(model_tokens, spec):
    model, tokens = model_tokens
    layer = 1
    _, v_base = _values(model, tokens, layer=layer)
    _, v0_layer0 = _values(model, tokens, layer=0)
    n_kv = v_base.shape[2]
    means = {layer: torch.randn(n_kv, v_base.shape[3])}
    positions = [3, 5, 1, 11]
    edit = sink_edit(model, spec, layers=[layer], corpus_means=means, position=torch.tensor(positions))
    _, v_new = _values(model, tokens, edit.fwd_hooks, layer=layer)
    expected = _naive_edit(v_base, spec, layer=layer, corpus_mean=means[layer].double(), position=positions)
    torch.testing.assert_close(v_new.double(), expected.to(v_new.dtype).double(), atol=1e-6, rtol=1e-5)
    # the layer before the edit is untouched
    _, v_other = _values(model, tokens, edit.fwd_hooks, layer=0)
    assert torch.equal(v_other, v0_layer0)


def test_rotation_keeps_the_norm_turns_by_90_degrees_and_depends_on_the_seed(model_tokens):
    model, tokens = model_tokens
    _, v = _values(model, tokens)
    _, r0 = _values(model, tokens, sink_edit(model, SinkEditSpec("rotate", seed=0), layers=[1]).fwd_hooks)
    _, r0b = _values(model, tokens, sink_edit(model, SinkEditSpec("rotate", seed=0), layers=[1]).fwd_hooks)
    _, r1 = _values(model, tokens, sink_edit(model, SinkEditSpec("rotate", seed=1), layers=[1]).fwd_hooks)
    torch.testing.assert_close(r0[:, 0].norm(dim=-1), v[:, 0].norm(dim=-1), rtol=1e-5, atol=1e-6)
    cos = torch.nn.functional.cosine_similarity(r0[:, 0].double(), v[:, 0].double(), dim=-1)
    assert cos.abs().max() < 1e-5
    assert torch.equal(r0, r0b) and not torch.allclose(r0[:, 0], r1[:, 0])
    torch.testing.assert_close(r0[:, 1:], v[:, 1:])


def test_rescale_hits_the_mean_non_sink_norm_and_keeps_the_direction(model_tokens):
    model, tokens = model_tokens
    _, v = _values(model, tokens)
    _, r = _values(model, tokens, sink_edit(model, SinkEditSpec("rescale_mean_norm"), layers=[1]).fwd_hooks)
    target = v[:, 1:].double().norm(dim=-1).mean(1)  # [b, kv]
    torch.testing.assert_close(r[:, 0].double().norm(dim=-1), target, rtol=1e-5, atol=1e-6)
    cos = torch.nn.functional.cosine_similarity(r[:, 0].double(), v[:, 0].double(), dim=-1)
    torch.testing.assert_close(cos, torch.ones_like(cos), atol=1e-6, rtol=0)


def test_per_row_specs_equal_separate_forwards(model_tokens):
    model, tokens = model_tokens
    window = tokens[:1]
    specs = [SinkEditSpec("scale", 0.0), SinkEditSpec("rotate", seed=2), SinkEditSpec("random_token", 2.0)]
    edit = sink_edit(model, specs, layers=[0, 1], position=4)
    with torch.no_grad(), applied(model, edit.fwd_hooks):
        batched = model(window.expand(3, -1), return_type="logits")
    for r, s in enumerate(specs):
        with torch.no_grad(), applied(model, sink_edit(model, s, layers=[0, 1], position=4).fwd_hooks):
            single = model(window, return_type="logits")
        torch.testing.assert_close(batched[r : r + 1], single, atol=1e-5, rtol=1e-5)


def _naive_window_stats(model, window, spec, layers, *, corpus_means, position):
    """NLL, mean ‖o_i^h‖ and mean cos(o_i^h, s_i^h) by explicit loops in float64 (one spec, no branch)."""
    names = [hook_name(l, n) for l in layers for n in (V, "attn.hook_pattern")]
    edit = sink_edit(model, spec, layers=layers, corpus_means=corpus_means, position=position)
    with torch.no_grad(), applied(model, edit.fwd_hooks):
        logits, cache = model.run_with_cache(window, names_filter=lambda n: n in names)
    logp = torch.log_softmax(logits[0].double(), -1)
    T = window.shape[1]
    nll = -sum(float(logp[i, window[0, i + 1]]) for i in range(T - 1)) / (T - 1)
    norms, coss = [], []
    for l in layers:
        pattern = cache[hook_name(l, "attn.hook_pattern")][0].double()
        v = cache[hook_name(l, V)][0].double()
        W_O = model.blocks[l].attn.W_O.detach().double()
        H = pattern.shape[0]
        g = H // v.shape[1]
        for h in range(H):
            vt = [v[j, h // g] @ W_O[h] for j in range(T)]
            for i in range(1, T):
                o = sum(float(pattern[h, i, j]) * vt[j] for j in range(i + 1))
                s = sum(vt[j] for j in range(1, i + 1)) / i
                norms.append(float(o.norm()))
                coss.append(float(o @ s / (o.norm() * s.norm())))
    return nll, float(np.mean(norms)), float(np.mean(coss))


@pytest.mark.parametrize("layers", [[1], [0, 1]])
def test_edited_window_matches_naive_statistics(model_tokens, layers):
    model, tokens = model_tokens
    window = tokens[2:3]
    specs = [
        SinkEditSpec("scale", 0.0),
        SinkEditSpec("rescale_mean_norm"),
        SinkEditSpec("rotate", seed=1),
        SinkEditSpec("random_token", 0.0),
    ]
    before = active_hook_count(model)
    nll, norm, cos = edited_window(model, window, specs, layers, position=5)
    for r, s in enumerate(specs):
        n_ref, o_ref, c_ref = _naive_window_stats(model, window, s, layers, corpus_means=None, position=5)
        assert nll[r] == pytest.approx(n_ref, rel=1e-5, abs=1e-6)
        assert norm[r] == pytest.approx(o_ref, rel=1e-5)
        assert cos[r] == pytest.approx(c_ref, rel=1e-4, abs=1e-6)
    assert active_hook_count(model) == before


def test_sink_controls_tables_follow_their_definitions(model_tokens):
    model, tokens = model_tokens
    specs = default_conditions(lambdas=(0.0, 2.0), seeds=(0, 1))
    res = sink_controls(model, tokens, conditions=specs, layers=[1], n_boot=300, seed=0)
    W = tokens.shape[0]
    assert res.n_windows == W and set(res.conditions.scope) == {ALL, "1"}
    assert (res.conditions.n_windows == W).all()
    # clean PPL and ΔPPL by separate plain forwards (naive, float64)
    with torch.no_grad():
        logp = torch.log_softmax(model(tokens, return_type="logits").double(), -1)
    clean = [-float(logp[w, :-1].gather(-1, tokens[w, 1:, None]).mean()) for w in range(W)]
    assert res.clean_ppl == pytest.approx(math.exp(np.mean(clean)), rel=1e-5)
    positions = res.windows.groupby("window").random_position.first().to_numpy()
    assert ((positions >= 1) & (positions < tokens.shape[1])).all()
    means = {}
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    for l in range(model.cfg.n_layers):
        means[l] = cache[hook_name(l, V)][:, 0].double().mean(0).float()
    for s in (SinkEditSpec("scale", 2.0), SinkEditSpec("rotate", seed=1), SinkEditSpec("random_token", 0.0)):
        for scope, layers in ((ALL, [0, 1]), ("1", [1])):
            nlls = [
                _naive_window_stats(
                    model, tokens[w : w + 1], s, layers, corpus_means=means, position=int(positions[w])
                )[0]
                for w in range(W)
            ]
            row = res.conditions[(res.conditions.scope == scope) & (res.conditions.edit == s.label)].iloc[0]
            assert row.delta_ppl == pytest.approx(
                math.exp(np.mean(nlls)) - math.exp(np.mean(clean)), rel=1e-4, abs=1e-6
            )
            assert row.delta_ppl_lo <= row.delta_ppl_hi
    # BOS at position 0 sees no other token: the corpus mean of v_0 is v_0 itself, so no effect
    cm = res.conditions[res.conditions.edit == "corpus_mean"]
    assert np.allclose(cm.delta_ppl, 0, atol=1e-4) and np.allclose(cm.out_norm_ratio, 1, atol=1e-5)
    # the pooled rotation is the mean of the seeds
    for scope in (ALL, "1"):
        c = res.conditions[res.conditions.scope == scope].set_index("edit")
        assert c.loc[ROTATE_POOLED, "delta_ppl"] == pytest.approx(
            (c.loc["rotate seed=0", "delta_ppl"] + c.loc["rotate seed=1", "delta_ppl"]) / 2
        )
        # the scale λ=0 head-output norm ratio is the edited over the clean mean
        assert c.loc["scale λ=0", "out_norm_ratio"] == pytest.approx(
            c.loc["scale λ=0", "out_norm"] / c.loc["scale λ=0", "out_norm_clean"]
        )
    # verdicts agree with their CIs, and the scope claim with its pairs
    p = res.pairs
    assert set(p.control) >= {ROTATE_POOLED, "corpus_mean", "random_token λ=0", "random_token λ=2"}
    for _, r in p.iterrows():
        expected = "norm edit larger" if r.diff_lo > 0 else ("control larger" if r.diff_hi < 0 else "tie")
        assert r.verdict == expected
    for _, r in res.scopes.iterrows():
        v = p.loc[p.scope == r.scope, "verdict"]
        assert r.claim == (
            "holds" if (v == "norm edit larger").all() else "fails" if (v == "control larger").any() else "undecided"
        )
    assert res.summary()["n_windows"] == W


def test_bad_inputs_raise_one_line_errors():
    model = make_tiny("gqa")
    tokens = tiny_tokens(model, length=12)
    with pytest.raises(ValueError, match="unknown sink edit kind 'flip'"):
        SinkEditSpec("flip")
    with pytest.raises(ValueError, match="finite"):
        SinkEditSpec("scale", float("inf"))
    with pytest.raises(ValueError, match="corpus_mean needs"):
        sink_edit(model, SinkEditSpec("corpus_mean"))
    with pytest.raises(ValueError, match="random_token needs position"):
        sink_edit(model, SinkEditSpec("random_token", 0.0))
    with pytest.raises(IndexError, match="layers"):
        sink_controls(model, tokens, layers=[5])
    with pytest.raises(ValueError, match="pos ≥ 3"):
        sink_controls(model, tokens[:, :2])
    with pytest.raises(TypeError, match="SinkEditSpec"):
        sink_edit(model, ["scale"])
    # an error inside the forward pass leaves no hook behind
    before = active_hook_count(model)
    with pytest.raises(IndexError, match="random_token positions"):
        with sink_edit_applied(model, SinkEditSpec("random_token", 0.0), position=0, layers=[1]):
            model(tokens)
    with pytest.raises(ValueError, match="corpus mean of layer 1 has shape"):
        with (
            torch.no_grad(),
            sink_edit_applied(model, SinkEditSpec("corpus_mean"), corpus_means={1: torch.zeros(3, 3)}, layers=[1]),
        ):
            model(tokens)
    assert active_hook_count(model) == before


@pytest.mark.slow
def test_controls_on_smollm2(smollm2, smollm2_tokens):
    """Real model: v_0 is one vector in every window (BOS sees only itself), so the corpus-mean edit
    changes nothing; the rotation keeps ‖v_0‖ in kv-head space; λ = 0 in the last layer moves PPL."""
    model = smollm2
    tokens = smollm2_tokens[:2, :24]
    name = hook_name(29, V)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n == name)
    v0 = cache[name][:, 0]
    torch.testing.assert_close(v0[0], v0[1], atol=1e-5, rtol=1e-5)
    specs = [SinkEditSpec("corpus_mean"), SinkEditSpec("rotate", seed=0), SinkEditSpec("scale", 0.0)]
    res = sink_controls(model, tokens, conditions=specs, layers=[29], all_layers=False, n_boot=200)
    c = res.conditions.set_index("edit")
    assert abs(c.loc["corpus_mean", "delta_ppl"]) < 1e-3 * res.clean_ppl
    assert c.loc["scale λ=0", "delta_ppl"] != 0
    _, rotated = _values(
        model, tokens, sink_edit(model, SinkEditSpec("rotate", seed=0), layers=[29]).fwd_hooks, layer=29
    )
    assert rotated.shape[2] == 3  # SmolLM2: 3 kv heads for 9 query heads
    torch.testing.assert_close(rotated[:, 0].norm(dim=-1), v0.norm(dim=-1), rtol=1e-4, atol=1e-5)


# =============================================================================================
# Dose-matched controls (docs/faithfulness/PROTOCOL.md §6): rotations by θ, per-query-head edits,
# the windows, the sink heads, the two-stage bootstrap, Holm, the checkpoint.


@pytest.mark.parametrize("degrees", [30.0, 60.0, 90.0, 180.0])
def test_rotation_by_theta_keeps_the_norm_and_moves_v0_by_2_sin_half_theta(model_tokens, degrees):
    model, tokens = model_tokens
    _, v = _values(model, tokens)
    spec = SinkEditSpec("rotate", seed=4, degrees=degrees)
    _, r = _values(model, tokens, sink_edit(model, spec, layers=[1]).fwd_hooks)
    v0, r0 = v[:, 0].double(), r[:, 0].double()
    n0 = v0.norm(dim=-1)
    torch.testing.assert_close(r0.norm(dim=-1), n0, rtol=1e-5, atol=1e-6)
    moved = (r0 - v0).norm(dim=-1) / n0
    torch.testing.assert_close(
        moved, torch.full_like(moved, 2 * math.sin(math.radians(degrees) / 2)), rtol=1e-5, atol=1e-6
    )
    assert edit_dose(spec) == pytest.approx(2 * math.sin(math.radians(degrees) / 2), abs=1e-12)
    # the plane contains v_0 and the seeded direction g: v_0' has no component outside span{v_0, g}
    g = rotation_direction(4, 1, v.shape[2], v.shape[3]).to(v0)
    for b in range(v0.shape[0]):
        for k in range(v0.shape[1]):
            basis = torch.linalg.qr(torch.stack([v0[b, k], g[k]], 1))[0]
            off = r0[b, k] - basis @ (basis.T @ r0[b, k])
            assert float(off.norm()) < 1e-5 * float(n0[b, k])
            torch.testing.assert_close(r0[b, k], naive_v0(v[b, 0, k], spec, 1, k, v.shape[2]), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(r[:, 1:], v[:, 1:])
    if degrees == 90.0:  # the earlier rotate control is the 90° rotation in the same plane
        _, r90 = _values(model, tokens, sink_edit(model, SinkEditSpec("rotate", seed=4), layers=[1]).fwd_hooks)
        torch.testing.assert_close(r90, r, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", TINY_KINDS)
def test_query_head_edit_of_every_head_equals_the_hook_v_edit(kind):
    model = make_tiny(kind, n_layers=3)
    tokens = tiny_tokens(model, TEXTS, length=12)
    for spec in (SinkEditSpec("scale", 0.0), SinkEditSpec("rotate", seed=2, degrees=60.0), SinkEditSpec("scale", 1.5)):
        with torch.no_grad(), applied(model, sink_edit(model, spec, layers=[0, 2]).fwd_hooks):
            via_v = model(tokens, return_type="logits")
        with torch.no_grad(), applied(model, sink_edit_query_heads(model, spec, layers=[0, 2]).fwd_hooks):
            via_z = model(tokens, return_type="logits")
        torch.testing.assert_close(via_z, via_v, rtol=1e-5, atol=1e-5)
    assert active_hook_count(model) == 0


def _capture(model, tokens, hooks, layer):
    """(z, pattern, v) of ``layer`` in a forward with ``hooks``."""
    names = [hook_name(layer, n) for n in ("attn.hook_z", "attn.hook_pattern", V)]
    with torch.no_grad(), applied(model, list(hooks)):
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
    return [cache[n] for n in names]


@pytest.mark.parametrize("kind", TINY_KINDS)
def test_query_head_edit_changes_only_the_chosen_heads_exactly(kind):
    """A sink-head scope inside a kv group: head 0 edited, head 1 (same kv head under GQA) untouched."""
    model = make_tiny(kind, n_layers=2)
    tokens = tiny_tokens(model, TEXTS, length=10)
    spec = SinkEditSpec("rotate", seed=1, degrees=60.0)
    edit = sink_edit_query_heads(model, spec, layers=[0, 1], heads={0: [0], 1: [2, 3]})
    assert edit.layers == (0, 1) and edit.query_heads == (0, 2, 3)
    z_clean, _, _ = _capture(model, tokens, [], 0)
    before = active_hook_count(model)  # a bridge's run_with_cache keeps hooks of its own
    z, pattern, v = _capture(model, tokens, edit.fwd_hooks, 0)
    H, T = pattern.shape[1], tokens.shape[1]
    group = H // v.shape[2]
    for h in range(1, H):  # the other heads of layer 0, bit for bit
        assert torch.equal(z[:, :, h], z_clean[:, :, h])
    for b in range(tokens.shape[0]):  # head 0 by hand: z_i = Σ_j α_ij v_j with v_0 replaced for this head only
        v0_new = naive_v0(v[b, 0, 0], spec, 0, 0, v.shape[2])
        for i in range(T):
            ref = sum(float(pattern[b, 0, i, j]) * (v0_new if j == 0 else v[b, j, 0].double()) for j in range(i + 1))
            torch.testing.assert_close(z[b, i, 0].double(), ref, rtol=1e-5, atol=1e-6)
    # layer 1: heads 2 and 3 edited (kv head 1 under GQA), heads 0 and 1 as their input makes them
    z1, pattern1, v1 = _capture(model, tokens, edit.fwd_hooks, 1)
    for h in range(H):
        k = h // group
        for b in range(tokens.shape[0]):
            v0_new = naive_v0(v1[b, 0, k], spec, 1, k, v1.shape[2]) if h in (2, 3) else v1[b, 0, k].double()
            ref = torch.stack(
                [
                    sum(
                        float(pattern1[b, h, i, j]) * (v0_new if j == 0 else v1[b, j, k].double()) for j in range(i + 1)
                    )
                    for i in range(T)
                ]
            )
            torch.testing.assert_close(z1[b, :, h].double(), ref, rtol=1e-5, atol=1e-6)
    assert active_hook_count(model) == before


@pytest.mark.bridge_only
def test_module_examples_run():
    import doctest

    import geolens.interventions.sink_values as sink_values
    import geolens.sinks.controls as controls
    import geolens.sinks.controls_dose as controls_dose
    import geolens.sinks.controls_protocol as controls_protocol
    import geolens.sinks.controls_summary as controls_summary

    for module in (controls, controls_dose, controls_protocol, controls_summary, sink_values):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        assert result.attempted > 0 and result.failed == 0, module.__name__
