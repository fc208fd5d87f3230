"""The dose-response sink controls (geolens.sinks.controls_dose, docs/method.md §4.5): dose windows
against hand-built forwards, the Gu sink-head criterion, the document sample, the tables,
checkpoints and bad input."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import (
    TINY_KINDS,
    make_tiny,
)
from reference import naive_v0

from geolens.adapter import hook_name
from geolens.interventions import active_hook_count, applied
from geolens.interventions.sink_values import (
    SinkEditSpec,
    sink_edit_query_heads,
)
from geolens.resume import write_records
from geolens.sinks.controls_dose import (
    CheckpointMismatch,
    controls_sample,
    dose_controls,
    dose_window,
    gu_sink_heads,
    read_windows,
    write_windows,
)
from geolens.sinks.controls_protocol import DoseProtocol, edit_dose
from geolens.sinks.controls_summary import dose_summary
from geolens.testing import tiny_tokens
from sinks.conftest import SMALL

V = "attn.hook_v"


TEXTS = ("the cat sat on the mat.", "a dog ran far away!!", "one two three four five", "big red boxes fly high")


DOCS = [
    "the cat sat on the mat, then it ran off.",
    "no",
    "a dog ran far away!! it came back at noon.",
    "one two three four five six seven",
    "big red boxes fly high over the hills.",
    "short",
]


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
                out[0, 0, k] = naive_v0(v[0, 0, k], spec, layer, k, v.shape[2]).to(v.dtype)
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
                v0_new = naive_v0(v[0, 0, k], spec, layer, k, v.shape[2])
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
    assert state["writer"]["weights_fingerprint"]  # the checkpoint names the weights that wrote it
    write_records(ck, dict(state, writer=dict(state["writer"], weights_fingerprint="0" * 16)), {"windows": windows})
    with pytest.raises(CheckpointMismatch, match="it was written by a model with other weights"):
        _small_run(model, checkpoint=ck, resume=True)
    ck.write_text("{}")  # no records, no digests: never trusted
    with pytest.raises(CheckpointMismatch, match="has no digests of its records"):
        _small_run(model, checkpoint=ck, resume=True)
    write_records(ck, dict(state, format="another checkpoint"), {"windows": windows})
    with pytest.raises(CheckpointMismatch, match="not a checkpoint"):
        _small_run(model, checkpoint=ck, resume=True)
    ck.write_text('{"format": "geolens sink dose controls checkpoint 1", "windo')  # truncated by a crash
    with pytest.raises(CheckpointMismatch, match="unreadable"):
        _small_run(model, checkpoint=ck, resume=True)


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
