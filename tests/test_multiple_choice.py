"""Multiple choice at scale: shipped BIG-bench tasks, one-forward choice scoring, bootstrap CIs."""

from __future__ import annotations

import importlib.util
import json
import math

import constructed
import numpy as np
import pandas as pd
import pytest
import torch

import geolens.multiple_choice as mc
from geolens.faithfulness import MaskingConfig
from geolens.faithfulness.mc_curves import mc_under_masks_per_question
from geolens.multiple_choice import (
    DEFAULT_TASKS,
    MC_TASKS,
    SHIPPED_BIGBENCH,
    Question,
    answer_margin,
    choice_logliks,
    choice_scores,
    load_questions,
    mc_summary,
    paired_difference,
    score_questions,
)

QUESTIONS = [
    Question("the cat sat on the", ("mat", "dog house", "sky"), 0, task="t1"),
    Question("a dog ran far", ("away", "cat"), 1, task="t1"),
    Question("one two three", ("four", "ten", "a b c d"), 1, task="t2"),
]


def _naive_logliks(model, question):
    """log p(choice | prompt): one separate forward per choice, explicit sum over its tokens, float64."""
    prompt = model.to_tokens(question.prompt, prepend_bos=True)[0].tolist()
    out = []
    for c in question.choices:
        ids = model.tokenizer(" " + c.strip(), add_special_tokens=False)["input_ids"]
        tokens = torch.tensor([prompt + ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(tokens, return_type="logits")[0].double(), -1)
        P = len(prompt)
        out.append(sum(float(logp[P - 1 + t, ids[t]]) for t in range(len(ids))))
    return out


def test_shipped_tasks_load_without_the_bigbench_package():
    counts = {t: len(load_questions(f"bigbench:{t}")) for t in DEFAULT_TASKS}
    assert counts == {"general_knowledge": 69, "hindu_knowledge": 174, "disambiguation_qa": 258, "causal_judgment": 190}
    assert sum(counts.values()) >= 500 and len(counts) >= 3 and set(MC_TASKS) == set(DEFAULT_TASKS)
    for t in DEFAULT_TASKS:
        qs = load_questions(f"bigbench:{t}", max_questions=5)
        assert len(qs) == 5 and all(q.task == t and 0 <= q.answer < len(q.choices) for q in qs)
    dq = load_questions("bigbench:disambiguation_qa", max_questions=1)[0]
    assert dq.prompt.startswith("In the following sentences") and dq.prompt.endswith("Pronoun identification:")
    cj = load_questions("bigbench:causal_judgment", max_questions=1)[0]
    assert set(cj.choices) == {"Yes", "No"} and "causation" in cj.prompt and cj.prompt.endswith("A:")


def test_shipped_data_is_small_and_licensed():
    files = [p for p in SHIPPED_BIGBENCH.rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) < 5_000_000
    assert (
        "Apache License" in (SHIPPED_BIGBENCH / "LICENSE").read_text()
        and "Version 2.0" in (SHIPPED_BIGBENCH / "LICENSE").read_text()
    )
    readme = (SHIPPED_BIGBENCH / "README.md").read_text()
    assert all(t in readme for t in DEFAULT_TASKS) and "Apache" in readme


def test_unshipped_task_needs_the_sdist():
    if importlib.util.find_spec("bigbench") is None:
        with pytest.raises(ModuleNotFoundError, match="not shipped with geolens"):
            load_questions("bigbench:strategyqa")
    else:
        with pytest.raises(FileNotFoundError):
            load_questions("bigbench:no_such_task_xyz")


def test_choice_logliks_equal_naive_per_choice_forwards(tiny):
    model, _, _ = tiny
    for q in QUESTIONS:
        got, lengths = choice_logliks(model, q)
        want = _naive_logliks(model, q)
        assert lengths == [len(model.tokenizer(" " + c, add_special_tokens=False)["input_ids"]) for c in q.choices]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_choice_normalised_scores_prediction_and_margin_equal_naive_loop(tiny):
    """Each choice's mean per-token log p given the prompt, the arg-max prediction and the answer
    margin score(correct) − max score(other) against one float64 forward per choice and loops."""
    model, _, _ = tiny
    df = score_questions(model, QUESTIONS, normalize="mean")
    for (_, row), q in zip(df.iterrows(), QUESTIONS):
        lengths = [len(model.tokenizer(" " + c, add_special_tokens=False)["input_ids"]) for c in q.choices]
        means = [s / n for s, n in zip(_naive_logliks(model, q), lengths)]
        best = 0
        for k in range(len(means)):
            if means[k] > means[best]:
                best = k
        others = max(means[k] for k in range(len(means)) if k != q.answer)
        assert row.predicted == best and row.correct == (best == q.answer)
        assert row.margin == pytest.approx(means[q.answer] - others, abs=1e-5)
        ll, n = choice_logliks(model, q)
        np.testing.assert_allclose(choice_scores(ll, n, "mean"), means, rtol=1e-5, atol=1e-6)
        assert (row.margin > 0) == row.correct  # a positive margin is exactly a correct arg-max


def test_answer_margin_and_choice_scores_by_hand():
    assert answer_margin([-2.0, -1.0, -4.0], 1) == 1.0 and answer_margin([-2.0, -1.0, -4.0], 0) == -1.0
    assert choice_scores([-6.0, -2.0], [3, 2], "mean") == [-2.0, -1.0] and choice_scores(
        [-6.0, -2.0], [3, 2], "sum"
    ) == [-6.0, -2.0]
    with pytest.raises(ValueError, match="two choices"):
        answer_margin([-1.0], 0)
    with pytest.raises(ValueError, match="normalize"):
        choice_scores([-1.0], [1], "max")


def test_single_token_choices_use_one_prompt_forward(tiny_gqa, monkeypatch):
    """With one token per choice only the prompt is run; still equal to per-choice forwards."""
    model, _, _ = tiny_gqa
    prompt = model.to_tokens("the cat sat on the", prepend_bos=True)[0].tolist()
    choice_ids = [[17], [5], [30], [9]]
    monkeypatch.setattr(mc, "prompt_and_choice_ids", lambda m, q: (prompt, choice_ids))
    calls = []
    orig = model.forward

    def counting(*a, **k):
        calls.append(a[0].shape if a else k["input"].shape)
        return orig(*a, **k)

    monkeypatch.setattr(model, "forward", counting)
    got, lengths = choice_logliks(model, Question("unused", ("a", "b", "c", "d"), 0))
    monkeypatch.undo()
    assert lengths == [1, 1, 1, 1] and len(calls) == 1 and tuple(calls[0]) == (1, len(prompt))
    with torch.no_grad():
        for c, g in zip(choice_ids, got):
            logp = torch.log_softmax(model(torch.tensor([prompt + c]), return_type="logits")[0].double(), -1)
            assert g == pytest.approx(float(logp[len(prompt) - 1, c[0]]), rel=1e-5, abs=1e-6)


def test_score_questions_table(tiny_gqa):
    model, _, _ = tiny_gqa
    df = score_questions(model, QUESTIONS)
    assert list(df.task) == ["t1", "t1", "t2"] and list(df.qid) == [0, 1, 0]
    for (_, row), q in zip(df.iterrows(), QUESTIONS):
        ll = _naive_logliks(model, q)
        assert row.predicted == int(np.argmax(ll)) and row.correct == (row.predicted == q.answer)
        assert row.logprob_correct == pytest.approx(ll[q.answer], rel=1e-5)
        assert row.logprob_correct_norm == pytest.approx(
            ll[q.answer] - math.log(sum(math.exp(x) for x in ll)), rel=1e-5
        )
        assert row.chance == pytest.approx(1 / len(q.choices))
    mean = score_questions(model, QUESTIONS, normalize="mean")
    for (_, row), q in zip(mean.iterrows(), QUESTIONS):
        ll, n = (
            _naive_logliks(model, q),
            [len(model.tokenizer(" " + c, add_special_tokens=False)["input_ids"]) for c in q.choices],
        )
        assert row.predicted == int(np.argmax([a / b for a, b in zip(ll, n)]))
    with pytest.raises(ValueError, match="normalize"):
        score_questions(model, QUESTIONS, normalize="median")
    with pytest.raises(ValueError, match="answer index 5"):
        score_questions(model, [Question("a b", ("c", "d"), 5)])


def _synthetic(n, p, seed, task="x"):
    rng = np.random.default_rng(seed)
    c = rng.random(n) < p
    return pd.DataFrame(
        dict(
            task=task,
            qid=np.arange(n),
            correct=c,
            logprob_correct=rng.normal(-3, 1, n),
            logprob_correct_norm=rng.normal(-1, 0.3, n),
            chance=0.25,
        )
    )


def test_mc_summary_means_and_bootstrap_widths():
    a = pd.concat([_synthetic(400, 0.5, 0, "x"), _synthetic(100, 0.8, 1, "y")], ignore_index=True)
    s = mc_summary(a, n_boot=2000).set_index("task")
    assert list(s.index) == ["x", "y", "all"] and s.loc["all", "n_questions"] == 500
    for t, g in (("x", a[a.task == "x"]), ("y", a[a.task == "y"]), ("all", a)):
        assert s.loc[t, "accuracy"] == pytest.approx(g.correct.mean())
        assert s.loc[t, "logprob_correct"] == pytest.approx(g.logprob_correct.mean())
        assert s.loc[t, "accuracy_lo"] <= s.loc[t, "accuracy"] <= s.loc[t, "accuracy_hi"]
    # binomial: the 95% CI half-width of a proportion is about 1.96 sqrt(p(1-p)/n)
    p = s.loc["x", "accuracy"]
    half = 1.96 * math.sqrt(p * (1 - p) / 400)
    assert (s.loc["x", "accuracy_hi"] - s.loc["x", "accuracy_lo"]) / 2 == pytest.approx(half, rel=0.2)
    const = a.assign(correct=True)
    sc = mc_summary(const).set_index("task")
    assert sc.loc["all", "accuracy_lo"] == sc.loc["all", "accuracy_hi"] == 1.0


def test_paired_difference_is_paired_and_checks_questions():
    a = _synthetic(200, 0.5, 0)
    b = a.copy()
    flip = np.flatnonzero(~a.correct.to_numpy())[:20]
    b.loc[flip, "correct"] = True
    d = paired_difference(a, b).iloc[0]
    assert d.accuracy_diff == pytest.approx(0.1) and d.accuracy_diff_lo > 0 and d.verdict == "b higher"
    assert d.logprob_correct_diff == 0 and d.logprob_correct_diff_lo == d.logprob_correct_diff_hi == 0
    # paired: an unpaired CI of two accuracies near 0.5 and 0.6 would overlap 0; the paired one does not
    assert paired_difference(b, a).iloc[0].verdict == "a higher"
    assert paired_difference(a, a).iloc[0].verdict == "tie"
    with pytest.raises(ValueError, match="same questions"):
        paired_difference(a, b.iloc[:150])


def test_masked_per_question_clean_rows_match_the_batched_scorer(tiny_gqa):
    model, _, _ = tiny_gqa
    protocol = MaskingConfig(layers=(0, 1), fractions=(0.0, 0.5))
    per_q = mc_under_masks_per_question(model, QUESTIONS, protocol, ["raw_attention", "random"], progress=False)
    clean = per_q[per_q.metric == "clean"].reset_index(drop=True)
    ref = score_questions(model, QUESTIONS)
    np.testing.assert_allclose(clean.logprob_correct, ref.logprob_correct, rtol=1e-5, atol=1e-5)
    assert list(clean.correct) == list(ref.correct)
    zero = per_q[(per_q.metric != "clean") & (per_q.fraction == 0.0)]
    for metric in ("raw_attention", "random"):
        for d in zero.direction.unique():
            z = zero[(zero.metric == metric) & (zero.direction == d)].reset_index(
                drop=True
            )  # removing nothing changes nothing
            np.testing.assert_allclose(z.logprob_correct, ref.logprob_correct, rtol=1e-4, atol=1e-4)
    assert len(per_q) == len(QUESTIONS) * (1 + 2 * 2 * 2)


def test_load_questions_jsonl_and_errors(tmp_path):
    path = tmp_path / "mc.jsonl"
    path.write_text(
        "\n".join(
            json.dumps(dict(prompt=q.prompt, choices=list(q.choices), answer=q.answer)) for q in constructed.QUESTIONS
        )
    )
    assert load_questions(str(path)) == constructed.QUESTIONS
    assert load_questions(str(path), max_questions=2) == constructed.QUESTIONS[:2]
    with pytest.raises(FileNotFoundError):
        load_questions(str(tmp_path / "missing.jsonl"))


def test_bigbench_task_offline():
    """The shipped general_knowledge task loads without the bigbench package (never skipped)."""
    qs = load_questions("bigbench:general_knowledge")
    assert len(qs) >= 50 and all(0 <= q.answer < len(q.choices) for q in qs)
    assert qs[0].prompt.endswith("A:") and "horses" in qs[0].prompt
