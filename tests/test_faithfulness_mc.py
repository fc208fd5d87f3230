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


def _per_question(n=40, seed=0, random_shift=-0.5):
    """Synthetic mc_under_masks_per_question rows: metric b lowers log p(correct) by 1 more than a
    under comprehensiveness at every k; under sufficiency they are equal."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    clean = rng.normal(-5, 1, n)
    rows = [dict(task="t", qid=q, metric="clean", direction="none", fraction=0.0, logprob_correct=clean[q], correct=1) for q in range(n)]
    for k in (0.1, 0.5):
        noise = rng.normal(0, 0.3, n)
        for metric, comp in (("raw_attention", -1.0), ("contribution", -2.0), ("random", random_shift)):
            for q in range(n):
                rows.append(dict(task="t", qid=q, metric=metric, direction="comprehensiveness", fraction=k,
                                 logprob_correct=clean[q] + comp * k + (noise[q] if metric != "random" else 0.0), correct=int(metric != "contribution")))
                rows.append(dict(task="t", qid=q, metric=metric, direction="sufficiency", fraction=k,
                                 logprob_correct=clean[q] - 0.1 + noise[q], correct=1))
    df = pd.DataFrame(rows)
    return df.assign(chance=1 / 3, logprob_correct_norm=df.logprob_correct, n_choices=3)


def test_mc_pairs_paired_verdicts_against_hand_computation():
    import numpy as np

    from geolens.multiple_choice import mc_pairs

    per_q = _per_question()
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
    from geolens.multiple_choice import mc_pairs

    pairs = mc_pairs(_per_question(random_shift=0.0), pairs=[("raw_attention", "contribution")], n_boot=200)
    assert set(pairs.verdict) == {"no range"}


def test_mc_task_option_takes_several_tasks():
    from geolens.commands._options import UsageError, check_multiple_choice

    both = check_multiple_choice("bigbench:general_knowledge,bigbench:disambiguation_qa")
    assert len(both) == 69 + 258 and {q.task for q in both} == {"general_knowledge", "disambiguation_qa"}
    with pytest.raises(UsageError, match="bigbench:nope"):
        check_multiple_choice("bigbench:general_knowledge,bigbench:nope")


def test_mc_blocks_resume_equals_one_call(tiny_gqa, tmp_path):
    """Blocks of questions, saved as they land and resumed, give the rows of one call."""
    from types import SimpleNamespace

    import pandas as pd

    from geolens.commands._options import UsageError
    from geolens.commands.faithfulness import _mc_blocks
    from geolens.multiple_choice import mc_under_masks_per_question

    model, _, _ = tiny_gqa
    qs = [Question(q.prompt, q.choices, q.answer, task=t) for t in ("a", "b") for q in QUESTIONS]
    protocol = Protocol(layers=(0, 1), fractions=(0.5,))
    metrics = ["raw_attention", "random"]
    whole = mc_under_masks_per_question(model, qs, protocol, metrics, progress=False)
    args = SimpleNamespace(mc_task="x", seed=0, block=2, mc_chunk_size=18, resume=False)  # blocks of 2 questions
    calls = []

    def run_block(*a, **kw):
        calls.append(kw["first_question"])
        if len(calls) == 3 and not args.resume:
            raise KeyboardInterrupt  # interrupted after two saved blocks
        return mc_under_masks_per_question(*a, progress=False, **kw)

    with pytest.raises(KeyboardInterrupt):
        _mc_blocks(model, qs, protocol, metrics, args, tmp_path, run_block)
    assert pd.read_csv(tmp_path / "mc_questions.csv").query("metric == 'clean'").shape[0] == 4
    args.resume = True
    got = _mc_blocks(model, qs, protocol, metrics, args, tmp_path, run_block)
    assert calls == [0, 2, 4, 4]
    cols = ["task", "qid", "metric", "direction", "fraction", "logprob_correct", "correct"]
    pd.testing.assert_frame_equal(got[cols].reset_index(drop=True), whole[cols].reset_index(drop=True), check_dtype=False, rtol=1e-6)
    with pytest.raises(UsageError, match="other tasks, metrics or protocol"):
        _mc_blocks(model, qs, protocol, ["raw_attention"], args, tmp_path, run_block)


def test_replot_multiple_choice_from_a_partial_run(tmp_path, capsys):
    """--replot on a multiple-choice folder (no language-modelling files) rewrites mc.csv,
    mc_pairs.csv, mc_protocol.json and mc.png from the questions answered so far."""
    from geolens.cli import main

    per_q = _per_question(n=12)
    per_q.to_csv(tmp_path / "mc_questions.csv", index=False)
    protocol = dict(layers=[0, 1], ranking="query", allow_sink=True, allow_current=True, mode="inter", fractions=[0.1, 0.5])
    (tmp_path / "mc_progress.json").write_text(json.dumps(dict(task="bigbench:t", n_questions=30, protocol=protocol, metrics=["raw_attention", "contribution", "random"], seed=0)))
    assert main(["faithfulness", "--replot", "--out", str(tmp_path)]) == 0
    info = json.loads((tmp_path / "mc_protocol.json").read_text())
    assert info["n_questions"] == 12 and info["n_questions_planned"] == 30 and info["complete"] is False
    for name in ("mc.csv", "mc_pairs.csv", "mc.png"):
        assert (tmp_path / name).is_file(), name
    assert "12 of 30 questions" in capsys.readouterr().out
