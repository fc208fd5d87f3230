"""Multiple-choice scoring by log-likelihood, clean and under masks."""

from __future__ import annotations

import json

import pytest
import torch

from geolens.faithfulness import Protocol
from geolens.multiple_choice import (
    Question,
    choice_loglik,
    choice_tokens,
    load_questions,
    mc_accuracy,
    mc_accuracy_under_masks,
)

QUESTIONS = [
    Question("the cat sat on the", ("mat", "dog", "sky"), 0),
    Question("a dog ran far", ("away", "cat"), 0),
    Question("one two three", ("four", "ten", "a"), 1),
]


def test_choice_loglik_matches_naive(tiny_gqa):
    model, _, _ = tiny_gqa
    tokens, n = choice_tokens(model, QUESTIONS[0])[0]
    with torch.no_grad():
        logp = torch.log_softmax(model(tokens, return_type="logits")[0].double(), -1)
    L = tokens.shape[1]
    want = sum(float(logp[t - 1, tokens[0, t]]) for t in range(L - n, L))
    assert choice_loglik(model, tokens, n) == pytest.approx(want, rel=1e-5)
    assert tokens[0, 0].item() == model.tokenizer.bos_token_id


def test_mc_under_no_removal_equals_clean(tiny_gqa):
    model, _, _ = tiny_gqa
    clean = mc_accuracy(model, QUESTIONS)
    protocol = Protocol(layers=(0, 1), fractions=(0.0, 0.5))
    df = mc_accuracy_under_masks(model, QUESTIONS, protocol, ["raw_attention", "value_zeroing", "random"], progress=False)
    assert df[df.metric == "clean"].accuracy.item() == pytest.approx(clean)
    zero = df[df.fraction == 0.0]
    assert (zero[zero.metric != "clean"].accuracy == clean).all()
    assert len(df) == 1 + 3 * 2 * 2


def test_load_questions_jsonl_and_errors(tmp_path):
    path = tmp_path / "mc.jsonl"
    path.write_text("\n".join(json.dumps(dict(prompt=q.prompt, choices=list(q.choices), answer=q.answer)) for q in QUESTIONS))
    assert load_questions(str(path)) == QUESTIONS
    assert load_questions(str(path), max_questions=2) == QUESTIONS[:2]
    with pytest.raises(FileNotFoundError):
        load_questions(str(tmp_path / "missing.jsonl"))


def test_bigbench_task_offline():
    """The shipped general_knowledge task loads without the bigbench package (never skipped)."""
    qs = load_questions("bigbench:general_knowledge")
    assert len(qs) >= 50 and all(0 <= q.answer < len(q.choices) for q in qs)
    assert qs[0].prompt.endswith("A:") and "horses" in qs[0].prompt
