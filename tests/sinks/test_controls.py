"""Sink-intervention controls (docs/method.md §4.5, issue 10 item 5) against hand-built edits and naive loops."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import make_tiny

from geolens.adapter import hook_name
from geolens.interventions import active_hook_count, applied
from geolens.interventions.sink_values import (
    SINK_EDIT_KINDS,
    SinkEditSpec,
    rotation_direction,
    sink_edit,
    sink_edit_applied,
)
from geolens.sinks.controls import ALL, ROTATE_POOLED, default_conditions, edited_window, sink_controls
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


def test_gqa_edits_happen_in_kv_head_space():
    """kv_heads=[1] edits only kv head 1; the layer output equals Σ_h α ṽ with the edited kv value."""
    from test_sinks_interventions import _expected_attn_out, _run

    model = make_tiny("gqa")  # 4 query heads, 2 kv heads
    tokens = tiny_tokens(model, length=12)
    layer = 0
    edit = sink_edit(model, SinkEditSpec("rotate", seed=3), layers=[layer], kv_heads=[1])
    assert edit.query_heads == (2, 3)
    _, v_base, pattern, _ = _run(model, tokens, layer=layer)
    _, v_new, _, out_new = _run(model, tokens, edit.fwd_hooks, layer=layer)
    assert v_new.shape[2] == 2
    assert torch.equal(v_new[:, :, 0], v_base[:, :, 0]) and torch.equal(v_new[:, 1:], v_base[:, 1:])
    assert not torch.allclose(v_new[:, 0, 1], v_base[:, 0, 1])
    torch.testing.assert_close(out_new.double(), _expected_attn_out(model, pattern, v_new, layer), atol=1e-5, rtol=1e-4)


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

import json  # noqa: E402
from dataclasses import replace  # noqa: E402
from pathlib import Path  # noqa: E402

import pandas as pd  # noqa: E402
from conftest import TINY_KINDS  # noqa: E402

from geolens.interventions.sink_values import sink_edit_query_heads  # noqa: E402
from geolens.resume import write_records  # noqa: E402
from geolens.sinks.controls_dose import (  # noqa: E402
    CheckpointMismatch,
    controls_sample,
    dose_controls,
    dose_window,
    gu_sink_heads,
    read_windows,
    write_windows,
)
from geolens.sinks.controls_protocol import DoseProtocol, edit_dose, protocol_deviations, read_protocol  # noqa: E402
from geolens.sinks.controls_summary import dose_summary, two_stage_means  # noqa: E402
from geolens.stats import holm  # noqa: E402

PROTOCOL_DIR = Path(__file__).resolve().parents[2] / "docs" / "faithfulness"
SMALL = DoseProtocol(
    lambdas=(0.0, 0.5, 2.0), seeds_by_angle=((60.0, 3), (180.0, 2)), n_documents=2, seq_len=12, n_boot=300
)
ONE = replace(SMALL, scopes=("all_heads",))
DOCS = [
    "the cat sat on the mat, then it ran off.",
    "no",
    "a dog ran far away!! it came back at noon.",
    "one two three four five six seven",
    "big red boxes fly high over the hills.",
    "short",
]


def _naive_v0(v0, spec, layer, kv, n_kv):
    """v_0' by hand, float64, Python arithmetic: λ v_0, or cos θ v_0 + sin θ ‖v_0‖ u (u: g Gram-Schmidt against v_0)."""
    v0 = v0.double()
    if spec.kind == "scale":
        return spec.lam * v0
    g = rotation_direction(spec.seed, layer, n_kv, v0.shape[0])[kv]
    n0 = math.sqrt(sum(float(x) ** 2 for x in v0))
    u = g - sum(float(a) * float(b) for a, b in zip(g, v0)) / n0**2 * v0
    u = u / math.sqrt(sum(float(x) ** 2 for x in u))
    t = math.radians(spec.degrees)
    return math.cos(t) * v0 + math.sin(t) * n0 * u


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
            torch.testing.assert_close(r0[b, k], _naive_v0(v[b, 0, k], spec, 1, k, v.shape[2]), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(r[:, 1:], v[:, 1:])
    if degrees == 90.0:  # the earlier rotate control is the 90° rotation in the same plane
        _, r90 = _values(model, tokens, sink_edit(model, SinkEditSpec("rotate", seed=4), layers=[1]).fwd_hooks)
        torch.testing.assert_close(r90, r, rtol=1e-5, atol=1e-6)


def test_doses_of_the_protocol_match_at_one():
    p = DoseProtocol()
    assert [edit_dose(SinkEditSpec("scale", x)) for x in p.lambdas] == [1.0, 0.5, 0.5, 1.0]
    assert [edit_dose(SinkEditSpec("rotate", degrees=a)) for a in p.degrees] == pytest.approx(
        [0.517638090205, 1.0, 1.414213562373, 2.0]
    )
    assert p.matched_lambdas == (0.0, 2.0) and p.matched_degrees == (60.0,)
    assert [len(p.seeds(a)) for a in p.degrees] == [5, 20, 5, 5] and p.seeds(60.0) == tuple(range(20))
    assert len(p.edits()) == 4 + 35 and p.layers(18) == [0, 6, 12]


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
        v0_new = _naive_v0(v[b, 0, 0], spec, 0, 0, v.shape[2])
        for i in range(T):
            ref = sum(float(pattern[b, 0, i, j]) * (v0_new if j == 0 else v[b, j, 0].double()) for j in range(i + 1))
            torch.testing.assert_close(z[b, i, 0].double(), ref, rtol=1e-5, atol=1e-6)
    # layer 1: heads 2 and 3 edited (kv head 1 under GQA), heads 0 and 1 as their input makes them
    z1, pattern1, v1 = _capture(model, tokens, edit.fwd_hooks, 1)
    for h in range(H):
        k = h // group
        for b in range(tokens.shape[0]):
            v0_new = _naive_v0(v1[b, 0, k], spec, 1, k, v1.shape[2]) if h in (2, 3) else v1[b, 0, k].double()
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


def _hand_built(model, window, spec, layers, heads):
    """(NLL, KL) of one edit by a hand-built forward: at each edited layer, v_0 (all heads: at hook_v)
    or z of the chosen heads (Σ_j α_ij v_j with v_0 replaced, loops) by hand; KL and NLL in float64
    from explicit per-position sums."""
    store = {}

    def v_hook(layer):
        def hook(v, hook=None):
            store[layer] = v
            if heads is not None:
                return v
            out = v.clone()
            for k in range(v.shape[2]):
                out[0, 0, k] = _naive_v0(v[0, 0, k], spec, layer, k, v.shape[2]).to(v.dtype)
            return out

        return hook

    def p_hook(layer):
        def hook(p, hook=None):
            store[("p", layer)] = p

        return hook

    def z_hook(layer):
        def hook(z, hook=None):
            v, p = store[layer], store[("p", layer)]
            out = z.clone()
            group = p.shape[1] // v.shape[2]
            for h in heads.get(layer, ()):
                k = h // group
                v0_new = _naive_v0(v[0, 0, k], spec, layer, k, v.shape[2])
                for i in range(z.shape[1]):
                    out[0, i, h] = sum(
                        float(p[0, h, i, j]) * (v0_new if j == 0 else v[0, j, k].double()) for j in range(i + 1)
                    ).to(z.dtype)
            return out

        return hook

    hooks = [(hook_name(l, V), v_hook(l)) for l in layers]
    if heads is not None:
        hooks += [(hook_name(l, "attn.hook_pattern"), p_hook(l)) for l in layers] + [
            (hook_name(l, "attn.hook_z"), z_hook(l)) for l in layers
        ]
    with torch.no_grad():
        clean = model(window, return_type="logits")[0].double()
        with applied(model, hooks):
            edited = model(window, return_type="logits")[0].double()
    T = window.shape[1]
    nll_c = nll_e = kl = 0.0
    for i in range(T - 1):
        lc = clean[i] - math.log(float(clean[i].exp().sum()))
        le = edited[i] - math.log(float(edited[i].exp().sum()))
        t = int(window[0, i + 1])
        nll_c -= float(lc[t]) / (T - 1)
        nll_e -= float(le[t]) / (T - 1)
        kl += float((lc.exp() * (lc - le)).sum()) / (T - 1)
    return nll_c, nll_e, kl


@pytest.mark.parametrize("kind", TINY_KINDS)
@pytest.mark.parametrize("scope", ["all_heads", "sink_heads"])
def test_dose_window_equals_hand_built_forwards(kind, scope):
    model = make_tiny(kind, n_layers=7)  # edited layers 0 and 6
    window = tiny_tokens(model, TEXTS[:1], length=10)
    specs = [
        SinkEditSpec("scale", 0.0),
        SinkEditSpec("scale", 1.5),
        SinkEditSpec("rotate", seed=0, degrees=60.0),
        SinkEditSpec("rotate", seed=3, degrees=180.0),
        SinkEditSpec("scale", 2.0),
    ]
    heads = None if scope == "all_heads" else {0: (1,), 6: (0, 3)}
    res = dose_window(
        model, window, specs, [0, 6], heads=heads, rows_per_forward=2
    )  # three batched forwards, one row alone
    for r, spec in enumerate(specs):
        nll_c, nll_e, kl = _hand_built(model, window, spec, [0, 6], heads)
        assert res.nll_clean == pytest.approx(nll_c, rel=1e-6)
        assert res.nll[r] == pytest.approx(nll_e, rel=1e-5)
        assert res.kl[r] == pytest.approx(kl, rel=1e-3, abs=1e-7)
        assert res.delta_ppl[r] == pytest.approx(math.exp(nll_e) - math.exp(nll_c), rel=1e-3, abs=1e-6)
    assert (res.kl > 0).all()
    assert active_hook_count(model) == 0


def test_sink_heads_follow_the_gu_criterion():
    model = make_tiny("gqa", n_layers=3)
    tokens = tiny_tokens(model, TEXTS, length=9)
    table = gu_sink_heads(model, tokens, [0, 2], eps=0.2, share=0.5)
    names = [hook_name(l, "attn.hook_pattern") for l in (0, 2)]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
    T = tokens.shape[1]
    for _, row in table.iterrows():
        head = int(row["head"])
        pattern = cache[hook_name(int(row["layer"]), "attn.hook_pattern")]
        hits = [sum(float(pattern[b, head, i, 0]) for i in range(T)) / T > 0.2 for b in range(tokens.shape[0])]
        assert row["gu_sink_share"] == pytest.approx(sum(hits) / len(hits))
        assert row["sink_head"] == (sum(hits) / len(hits) > 0.5)
        assert row["kv_head"] == head // 2
    assert sorted(set(table.layer)) == [0, 2] and len(table) == 2 * model.cfg.n_heads


def test_controls_sample_takes_the_first_two_windows_of_each_long_document():
    model = make_tiny("gqa")
    tokens, documents = controls_sample(model, DOCS, seq_len=12, n_documents=3)
    assert documents.tolist() == [0, 0, 2, 2, 3, 3]  # documents 1 ("no") and 5 are too short; 4 is not needed
    from geolens.data import token_windows

    for d in (0, 2, 3):
        expected = token_windows(model, [DOCS[d]], 12)[:2]
        assert torch.equal(tokens[documents == d], expected)
    ids = model.tokenizer(DOCS[0], add_special_tokens=False)["input_ids"]
    assert tokens[1, 1:].tolist() == ids[11:22] and tokens[0, 0] == model.tokenizer.bos_token_id
    with pytest.raises(ValueError, match="only 4 of 6 documents have at least 22 tokens; 5 are needed"):
        controls_sample(model, DOCS, seq_len=12, n_documents=5)


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


def _small_run(model, tmp_path=None, **kwargs):
    tokens, documents = controls_sample(model, DOCS, seq_len=SMALL.seq_len, n_documents=SMALL.n_documents)
    kw = dict(sink_heads={0: (1,), 6: (0, 3)}, verdicts=False, rows_per_forward=4)
    kw.update(kwargs)
    return dose_controls(model, tokens, documents, SMALL, **kw), tokens, documents


@pytest.fixture(scope="module")
def seven_layers():
    return make_tiny("gqa", n_layers=7)


def test_dose_controls_tables_follow_their_definitions(seven_layers, tmp_path):
    model = seven_layers
    res, tokens, documents = _small_run(model)
    W = tokens.shape[0]
    n_edits = len(SMALL.edits())
    assert len(res.windows) == W * 2 * n_edits and res.layers == [0, 6]
    w1 = res.windows[(res.windows.window == 1) & (res.windows.scope == "sink_heads")]
    direct = dose_window(model, tokens[1:2], SMALL.edits(), [0, 6], heads={0: (1,), 6: (0, 3)})
    np.testing.assert_allclose(w1.kl.to_numpy(), direct.kl, rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(w1.delta_ppl.to_numpy(), direct.delta_ppl, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(
        res.windows.delta_ppl, np.exp(res.windows.nll) - np.exp(res.windows.nll_clean), rtol=1e-13, atol=1e-13
    )
    rows = res.dose_response
    assert len(rows) == 2 * (len(SMALL.lambdas) + len(SMALL.degrees))
    r = rows[(rows.scope == "all_heads") & (rows.edit == "rotate") & (rows.degrees == 60.0)].iloc[0]
    sub = res.windows[(res.windows.scope == "all_heads") & (res.windows.degrees == 60.0)]
    assert r.kl == pytest.approx(sub.kl.mean(), rel=1e-12) and r.n_seeds == 3 and r.dose == 1.0
    assert (rows.kl_low <= rows.kl).all() and (rows.kl <= rows.kl_high).all()
    summary = res.summary()
    assert (
        summary["sink_heads"] == {"0": [1], "6": [0, 3]}
        and summary["n_windows"] == W == 4
        and summary["n_documents"] == 2
    )
    assert all(p["verdict"] == "not decided (exploratory)" for p in summary["pairs"])  # verdicts=False: exploratory
    # the summary recomputes exactly from the saved table
    write_windows(res.windows, tmp_path / "w.csv")
    again = dose_summary(read_windows(tmp_path / "w.csv"), SMALL, verdicts=False)
    assert again == res.statistics
    json.dumps(summary)  # JSON-ready
    # no sink head at all: that scope is not run and not testable
    none, _, _ = _small_run(model, sink_heads={0: (), 6: ()})
    assert set(none.windows.scope) == {"all_heads"}
    assert {p["scope"]: p["verdict"] for p in none.statistics["pairs"]}["sink_heads"] == "not testable"
    assert active_hook_count(model) == 0


def test_checkpoint_resumes_to_the_same_numbers_and_refuses_another_run(seven_layers, tmp_path):
    model = seven_layers
    ck = tmp_path / "ck.json"
    full, tokens, documents = _small_run(model, checkpoint=ck)
    state = json.loads(ck.read_text())
    assert sorted(state["windows"], key=int) == [str(w) for w in range(tokens.shape[0])]
    for w in ("2", "3"):  # as if interrupted after two windows (the checkpoint as it was written then)
        del state["windows"][w]
    windows = state.pop("windows")
    state.pop("records")
    write_records(ck, state, {"windows": windows})
    edited = json.loads(ck.read_text())
    edited["windows"]["1"]["nll_clean"] += 1e-9  # an edited record is refused, not resumed
    ck.write_text(json.dumps(edited))
    with pytest.raises(CheckpointMismatch, match="a record was edited"):
        _small_run(model, checkpoint=ck, resume=True)
    write_records(ck, state, {"windows": windows})
    resumed, _, _ = _small_run(model, checkpoint=ck, resume=True)
    assert resumed.statistics == full.statistics
    pd.testing.assert_frame_equal(resumed.windows, full.windows)
    with pytest.raises(CheckpointMismatch, match="sink_heads"):
        _small_run(model, checkpoint=ck, resume=True, sink_heads={0: (2,), 6: ()})
    with pytest.raises(CheckpointMismatch, match="rows_per_forward"):
        _small_run(model, checkpoint=ck, resume=True, rows_per_forward=5)
    ck.write_text("{}")
    with pytest.raises(CheckpointMismatch, match="not a checkpoint"):
        _small_run(model, checkpoint=ck, resume=True)
    ck.write_text('{"format": "geolens sink dose controls checkpoint 1", "windo')  # truncated by a crash
    with pytest.raises(CheckpointMismatch, match="unreadable"):
        _small_run(model, checkpoint=ck, resume=True)


def test_read_protocol_reads_the_registered_block(tmp_path):
    import hashlib

    protocol, info = read_protocol(PROTOCOL_DIR / "protocol.json")
    assert protocol == DoseProtocol()  # the defaults are the pre-registered settings
    assert DoseProtocol.from_dict(json.loads(json.dumps(SMALL.to_dict()))) == SMALL
    assert info["protocol_sha256"] == hashlib.sha256((PROTOCOL_DIR / "PROTOCOL.md").read_bytes()).hexdigest()
    assert info["pre_registered"] and info["protocol_version"] == 2
    assert protocol_deviations(protocol, protocol, info, model="smollm2-135m", mode="bridge", dtype="float32") == []
    small = replace(protocol, n_documents=5)
    reasons = protocol_deviations(small, protocol, info, model="tiny-gqa", mode="hooked", dtype="float32")
    assert any("n_documents 5 instead of 50" in r for r in reasons) and any("tiny-gqa" in r for r in reasons)
    assert any("hooked" in r for r in reasons) and any("fewer than 100" in r for r in reasons)
    # a copy with an edited text is no longer the pre-registered protocol
    raw = json.loads((PROTOCOL_DIR / "protocol.json").read_text())
    (tmp_path / "PROTOCOL.md").write_text("another text")
    (tmp_path / "REGISTERED.json").write_text((PROTOCOL_DIR / "REGISTERED.json").read_text())
    (tmp_path / "protocol.json").write_text(json.dumps(raw))
    _, copied = read_protocol(tmp_path / "protocol.json")
    assert not copied["pre_registered"]
    bad = {
        "missing.json": None,
        "nojson.json": "{",
        "noblock.json": json.dumps({"version": 2}),
        "nolayers.json": json.dumps(
            {**raw, "sink_controls": {k: v for k, v in raw["sink_controls"].items() if k != "layers"}}
        ),
        "layers.json": json.dumps({**raw, "sink_controls": {**raw["sink_controls"], "layers": "some layers"}}),
        "windows.json": json.dumps({**raw, "sink_controls": {**raw["sink_controls"], "n_windows": 99}}),
        "lambdas.json": json.dumps({**raw, "sink_controls": {**raw["sink_controls"], "lambdas": [0.5, 1.5]}}),
    }
    messages = {
        "missing.json": "no such file",
        "nojson.json": "not valid JSON",
        "noblock.json": 'no "sink_controls" block',
        "nolayers.json": "has no 'layers'",
        "layers.json": "every <ordinal> layer",
        "windows.json": "whole number of windows",
        "lambdas.json": "norm edit and a rotation of dose 1",
    }
    for name, text in bad.items():
        if text is not None:
            (tmp_path / name).write_text(text)
        with pytest.raises(ValueError, match=messages[name]):
            read_protocol(tmp_path / name)


def test_bad_dose_inputs_raise_one_line_errors(seven_layers):
    model = seven_layers
    with pytest.raises(ValueError, match="degrees= is the angle of a rotation"):
        SinkEditSpec("scale", 0.0, degrees=30)
    with pytest.raises(ValueError, match="random_token"):
        sink_edit_query_heads(model, SinkEditSpec("random_token", 0.0), layers=[0])
    with pytest.raises(IndexError, match="query heads \\[7\\]"):
        sink_edit_query_heads(model, SinkEditSpec("scale", 0.0), layers=[0], heads={0: [7]})
    with pytest.raises(ValueError, match="does not touch"):
        sink_edit_query_heads(model, SinkEditSpec("scale", 0.0), layers=[0], heads={3: [1]})
    with pytest.raises(ValueError, match="depends on the data"):
        edit_dose(SinkEditSpec("mean_tail"))
    with pytest.raises(ValueError, match="λ = 1 edits nothing"):
        DoseProtocol(lambdas=(0.0, 1.0))
    with pytest.raises(ValueError, match="scopes"):
        DoseProtocol(scopes=("all",))
    window = tiny_tokens(model, TEXTS[:1], length=8)
    with pytest.raises(ValueError, match="selects no head"):
        dose_window(model, window, [SinkEditSpec("scale", 0.0)], [0, 6], heads={0: (), 6: ()})
    with pytest.raises(ValueError, match="one sequence"):
        dose_window(model, window.expand(2, -1), [SinkEditSpec("scale", 0.0)], [0])
    with pytest.raises(ValueError, match="not edited"):
        dose_controls(model, window.expand(2, -1), [0, 0], SMALL, sink_heads={3: (1,)})
    with pytest.raises(ValueError, match="one document per window"):
        dose_controls(model, window.expand(2, -1), [0], SMALL)
    assert active_hook_count(model) == 0


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
