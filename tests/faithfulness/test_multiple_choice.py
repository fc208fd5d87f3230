"""Multiple-choice scoring by log-likelihood, clean and under masks."""

from __future__ import annotations

import json

import pytest
import torch
from constructed import mc_per_question

from geolens.multiple_choice import Question, choice_tokens, score_questions


def test_replot_multiple_choice_from_a_partial_run(tmp_path, capsys):
    """--replot on a multiple-choice folder (no language-modelling files) rewrites mc.csv,
    mc_pairs.csv, mc_protocol.json and mc.png from the questions answered so far."""
    from geolens.cli import main

    per_q = mc_per_question(n=12)
    per_q.to_csv(tmp_path / "mc_questions.csv", index=False)
    protocol = dict(
        layers=[0, 1], ranking="query", allow_sink=True, allow_current=True, mode="inter", fractions=[0.1, 0.5]
    )
    (tmp_path / "mc_progress.json").write_text(
        json.dumps(
            dict(
                task="bigbench:t",
                n_questions=30,
                protocol=protocol,
                metrics=["raw_attention", "contribution", "random"],
                seed=0,
            )
        )
    )
    assert main(["faithfulness", "--replot", "--out", str(tmp_path)]) == 0
    info = json.loads((tmp_path / "mc_protocol.json").read_text())
    assert info["n_questions"] == 12 and info["n_questions_planned"] == 30 and info["complete"] is False
    for name in ("mc.csv", "mc_pairs.csv", "mc.png"):
        assert (tmp_path / name).is_file(), name
    assert "12 of 30 questions" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# Multiple choice under the pre-registered protocol (PROTOCOL.md §5): geolens.faithfulness.multiple_choice

PROTOCOL_JSON = __import__("pathlib").Path(__file__).resolve().parents[2] / "docs" / "faithfulness" / "protocol.json"
SIX = (
    "raw_attention",
    "value_weighted",
    "output_normalized_intra",
    "output_normalized_inter",
    "contribution",
    "contribution_abs",
)


def _naive_query_mask(scores, terms, k):
    """[head, query, key] bool: for each query i, its terms (h, j) with α_ij^h ≠ 0 sorted by score
    descending, ties by source then head, the first ⌈k·n⌉ removed (exact rational k·n)."""
    import math
    from fractions import Fraction

    n_h, n_q, n_k = terms.shape
    out = torch.zeros(n_h, n_q, n_k, dtype=torch.bool)
    for i in range(n_q):
        units = [(-float(scores[h, i, j]), j, h) for j in range(n_k) for h in range(n_h) if terms[h, i, j]]
        n = math.ceil(Fraction(str(k)) * len(units))
        for _, j, h in sorted(units)[:n]:
            out[h, i, j] = True
    return out


def _argmax_questions(model, questions):
    """The questions with the answer replaced by the model's own choice-normalised arg-max: clean
    accuracy 1, so the task is eligible even on a random model."""
    import dataclasses

    rows = score_questions(model, questions, normalize="mean")
    return [dataclasses.replace(q, answer=int(p)) for q, p in zip(questions, rows.predicted)]


@pytest.mark.parametrize("kind", ["gqa", "mha"])
def test_masked_margin_equals_hand_built_full_forward(kind):
    """Every (metric, layer, k, choice) score of masked_scores (choices sharing a masked row, forwards
    started at the layer) equals a full forward of BOS + prompt + choice with α = 0 at the naive
    mask's terms of that layer only (float64 log-softmax, mean over the choice tokens)."""
    from conftest import make_tiny

    from geolens.adapter import get_attention_layer, names_filter
    from geolens.faithfulness.layer_masking import masking_scores
    from geolens.faithfulness.multiple_choice import masked_scores
    from geolens.interventions.base import active_hook_count

    model = make_tiny(kind, n_layers=3)
    q = Question("the cat sat on", ("mat", "ab", "ac"), 1, task="t")  # " ab" and " ac" share the masked row " a"
    layers, fractions = [0, 2], (0.2, 0.5)
    with torch.no_grad():
        model.run_with_cache(choice_tokens(model, q)[0][0])  # TransformerLens 4 keeps its cache hooks registered
    hooks = active_hook_count(model)
    got, same = masked_scores(model, q, layers, SIX, fractions)
    assert got.shape == (6, 2, 2, 3) and active_hook_count(model) == hooks  # the masks' hooks are gone
    for c, (tokens, n) in enumerate(choice_tokens(model, q)):
        with torch.no_grad():
            _, cache = model.run_with_cache(tokens, names_filter=names_filter(model, layers))
        for li, layer in enumerate(layers):
            view = get_attention_layer(model, cache, layer)
            scores = masking_scores(view, SIX)  # the section-3 scores, tested against naive loops in test_layer_masking
            for mi, name in enumerate(SIX):
                for ki, k in enumerate(fractions):
                    mask = _naive_query_mask(scores[name], view.pattern[0] != 0, k)

                    def zero(pattern, hook, mask=mask):
                        return pattern.masked_fill(mask[None].to(pattern.device), 0.0)

                    with torch.no_grad():
                        logits = model.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{layer}.attn.hook_pattern", zero)])
                    logp = torch.log_softmax(logits[0].double(), -1)
                    L = tokens.shape[1]
                    want = sum(float(logp[t - 1, tokens[0, t]]) for t in range(L - n, L)) / n
                    assert got[mi, li, ki, c] == pytest.approx(want, abs=2e-5), (name, layer, k, c)
    i = {m: SIX.index(m) for m in SIX}
    assert same[i["value_weighted"], i["output_normalized_inter"]]  # one ‖o_i‖ per query: the same ranking
    assert not same[i["raw_attention"], i["contribution"]] and same.diagonal().all()


def test_run_multiple_choice_masks_eligible_tasks_only_and_resumes(tmp_path, monkeypatch):
    """The whole run: excluded tasks are never masked; a run interrupted after two masked
    questions resumes from its checkpoint to the same tables, masking only the rest."""
    import dataclasses

    import numpy as np
    import pandas as pd
    from conftest import make_tiny

    import geolens.faithfulness.multiple_choice as fmc

    model = make_tiny("gqa", n_layers=4)
    base = [
        Question("the cat sat on", ("mat", "dog", "sky"), 0, task="good"),
        Question("a dog ran", ("far", "cat"), 0, task="good"),
        Question("one two", ("three", "a b"), 0, task="good"),
        Question("we go", ("home", "now"), 0, task="good"),
    ]
    good = _argmax_questions(model, base)
    bad = [
        dataclasses.replace(q, task="bad", answer=1 - q.answer if len(q.choices) == 2 else (q.answer + 1) % 3)
        for q in good
    ]
    questions = good + bad
    settings = fmc.MCSettings(n_boot=200)
    whole = fmc.run_multiple_choice(model, questions, settings)
    assert list(whole.tasks.eligible) == [True, False] and whole.n_masked == 4 and whole.layers == (0, 3)
    assert whole.questions.filter(like="margin:").iloc[4:].isna().all().all()
    assert len(whole.pairs) == 5 and (whole.pairs.n_questions == 4).all()
    summary = whole.summary()
    assert [t["task"] for t in summary["excluded_tasks"]] == ["bad"] and summary["excluded_tasks"][0]["accuracy"] == 0.0
    assert (
        summary["n_questions_by_task"] == {"good": 4, "bad": 4}
        and summary["scoring"] == "choice_normalized_mean_logprob"
    )
    # the outcome: mean over layers and k of clean margin − masked margin
    row = whole.questions.iloc[0]
    cols = [c for c in whole.questions if c.startswith("margin:contribution:")]
    assert len(cols) == 4 and row["margin_drop:contribution"] == pytest.approx(
        row.margin - np.mean([row[c] for c in cols])
    )

    calls = []
    real = fmc.masked_scores

    def interrupted(*a, **k):
        calls.append(a[1].prompt)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(fmc, "masked_scores", interrupted)
    path = tmp_path / fmc.CHECKPOINT
    with pytest.raises(KeyboardInterrupt):
        fmc.run_multiple_choice(
            model, questions, settings, checkpoint=fmc.MCCheckpoint.open(path, settings, resume=False)
        )
    saved = fmc.MCCheckpoint.open(path, settings, resume=True)
    assert len(saved.clean) == 8 and len(saved.masked) == 2
    calls.clear()
    monkeypatch.setattr(fmc, "masked_scores", lambda *a, **k: calls.append(a[1].prompt) or real(*a, **k))
    again = fmc.run_multiple_choice(model, questions, settings, checkpoint=saved)
    assert calls == [q.prompt for q in good[2:]]
    pd.testing.assert_frame_equal(again.questions, whole.questions, rtol=1e-9)
    pd.testing.assert_frame_equal(again.pairs, whole.pairs)
    with pytest.raises(ValueError, match="fractions"):
        fmc.MCCheckpoint.open(path, fmc.MCSettings(fractions=(0.1,)), resume=True)
    with pytest.raises(ValueError, match="another question"):
        fmc.run_multiple_choice(
            model, [dataclasses.replace(good[0], prompt="other")] + questions[1:], settings, checkpoint=saved
        )


def test_not_testable_when_two_metrics_mask_alike_everywhere():
    from conftest import make_tiny

    import geolens.faithfulness.multiple_choice as fmc

    model = make_tiny("mha")
    qs = _argmax_questions(
        model,
        [
            Question("the cat sat on", ("mat", "dog"), 0, task="t"),
            Question("a dog ran", ("far", "cat", "b"), 0, task="t"),
        ],
    )
    settings = fmc.MCSettings(
        pairs=(("value_weighted", "output_normalized_inter"), ("raw_attention", "contribution")),
        n_boot=100,
        layer_step=1,
    )
    pairs = fmc.run_multiple_choice(model, qs, settings).pairs
    assert list(pairs.verdict)[0] == "not testable" and pairs.identical_masks.tolist() == [True, False]
    assert list(pairs.verdict)[1] in ("holds", "reversed", "tie")


def test_mc_protocol_reads_the_frozen_protocol_and_lists_differences(tmp_path):
    import hashlib
    import json

    from geolens.faithfulness.multiple_choice import DEFAULT_PAIRS, MCSettings, differences, labelled, mc_protocol

    p = mc_protocol(PROTOCOL_JSON)
    spec = json.loads(PROTOCOL_JSON.read_text())
    sha = p.preregistered.sha256
    assert sha == hashlib.sha256((PROTOCOL_JSON.parent / "PROTOCOL.md").read_bytes()).hexdigest()
    assert sha == (PROTOCOL_JSON.parent / "PROTOCOL.sha256").read_text().strip()
    assert p.settings.pairs == DEFAULT_PAIRS == tuple(tuple(x) for x in spec["pairs"][:5])
    assert (
        p.settings == MCSettings() and p.tasks == tuple(spec["multiple_choice"]["tasks"]) and p.settings.n_boot == 2000
    )
    ok = dict(
        tasks=p.tasks, max_questions=0, settings=p.settings, model="gemma3-270m", model_mode="bridge", dtype="float32"
    )
    assert differences(p, **ok) == []
    for change, word in (
        (dict(max_questions=5), "first 5"),
        (dict(settings=MCSettings(fractions=(0.1, 0.2))), "fractions"),
        (dict(settings=MCSettings(normalize="sum")), "normalize"),
        (dict(model_mode="hooked"), "model mode"),
        (dict(settings=MCSettings(seed=1)), "seed"),
        (dict(tasks=p.tasks[::-1]), "tasks"),
        (dict(dtype="bfloat16"), "dtype"),
        (dict(settings=MCSettings(pairs=DEFAULT_PAIRS[:4])), "pairs"),
        (dict(settings=MCSettings(layer_step=1)), "layer_step"),
    ):
        diff = differences(p, **{**ok, **change})
        assert len(diff) == 1 and word in diff[0], (change, diff)
    summary = dict(pairs=[dict(a="x", b="y", verdict="holds", p_adj=0.01)])
    registered = labelled(summary, p, [])
    assert (
        registered["label"] == "pre-registered"
        and registered["protocol_sha256"] == sha
        and registered["pairs"][0]["verdict"] == "holds"
    )
    explore = labelled(summary, p, ["seed = 1, not 0"])
    assert (
        explore["label"] == "exploratory"
        and explore["pairs"][0]["verdict"] == "not decided (exploratory)"
        and explore["pairs"][0]["p_adj"] == 0.01
    )
    assert (
        labelled(summary, None, [])["label"] == "exploratory" and labelled(summary, None, [])["protocol_sha256"] is None
    )
    # a protocol this code does not implement, or a broken file: one-line ValueErrors
    bad = json.loads(PROTOCOL_JSON.read_text())
    bad["multiple_choice"]["scoring"] = "summed"
    (tmp_path / "protocol.json").write_text(json.dumps(bad))
    (tmp_path / "PROTOCOL.md").write_text("text")
    with pytest.raises(ValueError, match="scoring") as err:
        mc_protocol(tmp_path / "protocol.json")
    assert "\n" not in str(err.value)
    bad["multiple_choice"].update(scoring="choice_normalized_mean_logprob", pairs="pairs 4-9")
    (tmp_path / "protocol.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="pairs 4-9"):
        mc_protocol(tmp_path / "protocol.json")
    del bad["multiple_choice"]
    (tmp_path / "protocol.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="multiple_choice"):
        mc_protocol(tmp_path / "protocol.json")
    with pytest.raises(ValueError, match="no such file"):
        mc_protocol(tmp_path / "missing.json")
