"""Multiple-choice curves under the masks (geolens.faithfulness.mc_curves): a choice's log-likelihood
against a naive sum of log-probabilities, no removal equal to the clean accuracy, the paired
verdicts of the pairs against a hand computation (and no range when random masks do not move the
answer), and questions in blocks resuming to one call."""

from __future__ import annotations

import pytest
import torch
from constructed import QUESTIONS, mc_per_question

from geolens.faithfulness import MaskingConfig
from geolens.faithfulness.mc_curves import choice_loglik, mc_conditions, mc_under_masks_per_question
from geolens.multiple_choice import Question, choice_tokens, score_questions


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
    clean = float(score_questions(model, QUESTIONS).correct.mean())
    protocol = MaskingConfig(layers=(0, 1), fractions=(0.0, 0.5))
    per_q = mc_under_masks_per_question(
        model, QUESTIONS, protocol, ["raw_attention", "value_zeroing", "random"], progress=False
    )
    df = mc_conditions(per_q)
    assert df[df.metric == "clean"].accuracy.item() == pytest.approx(clean)
    zero = df[df.fraction == 0.0]
    assert (zero[zero.metric != "clean"].accuracy == clean).all()
    assert len(df) == 1 + 3 * 2 * 2


def test_mc_pairs_paired_verdicts_against_hand_computation():
    import numpy as np

    from geolens.faithfulness.mc_curves import mc_pairs

    per_q = mc_per_question()
    pairs = mc_pairs(per_q, pairs=[("raw_attention", "contribution")], n_boot=500)
    comp = pairs[(pairs.direction == "comprehensiveness")].set_index("fraction")
    # + = b (contribution) more faithful: it lowers log p(correct) by k more than raw attention
    assert np.allclose(comp["diff"].to_numpy(), [0.1, 0.5])
    assert list(comp.verdict) == ["holds", "holds"]
    assert np.allclose(comp.accuracy_diff, 1.0)  # contribution's masks flip every answer: + = more faithful
    suff = pairs[pairs.direction == "sufficiency"]
    assert np.allclose(suff["diff"], 0) and set(suff.verdict) == {"tie"}
    assert pairs.n_questions.eq(40).all()
    assert np.isclose(pairs.random_delta_logprob.iloc[0], -0.25)  # −0.5 · k at k = 0.5


def test_mc_pairs_no_range_when_random_masks_do_not_move_the_answer():
    from geolens.faithfulness.mc_curves import mc_pairs

    pairs = mc_pairs(mc_per_question(random_shift=0.0), pairs=[("raw_attention", "contribution")], n_boot=200)
    assert set(pairs.verdict) == {"no range"}


def test_mc_blocks_resume_equals_one_call(tiny_gqa, tmp_path):
    """Blocks of questions, saved as they land and resumed, give the rows of one call."""
    from types import SimpleNamespace

    import pandas as pd

    from geolens.faithfulness.mc_curves import questions_in_blocks
    from geolens.resume import ResumeRefused as ResumeError

    model, _, _ = tiny_gqa
    qs = [Question(q.prompt, q.choices, q.answer, task=t) for t in ("a", "b") for q in QUESTIONS]
    protocol = MaskingConfig(layers=(0, 1), fractions=(0.5,))
    metrics = ["raw_attention", "random"]
    whole = mc_under_masks_per_question(model, qs, protocol, metrics, progress=False)
    args = SimpleNamespace(mc_task="x", seed=0, block=2, mc_chunk_size=18, resume=False)  # blocks of 2 questions
    calls = []

    def run_block(*a, **kw):
        calls.append(kw["first_question"])
        if len(calls) == 3 and not args.resume:
            raise KeyboardInterrupt  # interrupted after two saved blocks
        return mc_under_masks_per_question(*a, progress=False, **kw)

    def blocks(metrics):
        return questions_in_blocks(
            run_block,
            model,
            qs,
            protocol,
            metrics,
            tmp_path,
            task=args.mc_task,
            seed=args.seed,
            chunk_size=args.mc_chunk_size,
            block=args.block,
            resume=args.resume,
            progress=lambda text: None,
        )

    with pytest.raises(KeyboardInterrupt):
        blocks(metrics)
    assert pd.read_csv(tmp_path / "mc_questions.csv").query("metric == 'clean'").shape[0] == 4
    args.resume = True
    got = blocks(metrics)
    assert calls == [0, 2, 4, 4]
    cols = ["task", "qid", "metric", "direction", "fraction", "logprob_correct", "correct"]
    pd.testing.assert_frame_equal(
        got[cols].reset_index(drop=True), whole[cols].reset_index(drop=True), check_dtype=False, rtol=1e-6
    )
    with pytest.raises(ResumeError, match="other tasks, metrics or protocol"):
        blocks(["raw_attention"])
