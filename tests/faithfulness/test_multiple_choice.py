"""Multiple-choice scoring by log-likelihood, clean and under masks."""

from __future__ import annotations

import json

import pytest
import torch

from geolens.faithfulness import MaskingConfig
from geolens.faithfulness.mc_curves import choice_loglik, mc_conditions, mc_under_masks_per_question
from geolens.multiple_choice import Question, choice_tokens, load_questions, score_questions

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


def test_load_questions_jsonl_and_errors(tmp_path):
    path = tmp_path / "mc.jsonl"
    path.write_text(
        "\n".join(json.dumps(dict(prompt=q.prompt, choices=list(q.choices), answer=q.answer)) for q in QUESTIONS)
    )
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
    rows = [
        dict(task="t", qid=q, metric="clean", direction="none", fraction=0.0, logprob_correct=clean[q], correct=1)
        for q in range(n)
    ]
    for k in (0.1, 0.5):
        noise = rng.normal(0, 0.3, n)
        for metric, comp in (("raw_attention", -1.0), ("contribution", -2.0), ("random", random_shift)):
            for q in range(n):
                rows.append(
                    dict(
                        task="t",
                        qid=q,
                        metric=metric,
                        direction="comprehensiveness",
                        fraction=k,
                        logprob_correct=clean[q] + comp * k + (noise[q] if metric != "random" else 0.0),
                        correct=int(metric != "contribution"),
                    )
                )
                rows.append(
                    dict(
                        task="t",
                        qid=q,
                        metric=metric,
                        direction="sufficiency",
                        fraction=k,
                        logprob_correct=clean[q] - 0.1 + noise[q],
                        correct=1,
                    )
                )
    df = pd.DataFrame(rows)
    return df.assign(chance=1 / 3, logprob_correct_norm=df.logprob_correct, n_choices=3)


def test_mc_pairs_paired_verdicts_against_hand_computation():
    import numpy as np

    from geolens.faithfulness.mc_curves import mc_pairs

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
    from geolens.faithfulness.mc_curves import mc_pairs

    pairs = mc_pairs(_per_question(random_shift=0.0), pairs=[("raw_attention", "contribution")], n_boot=200)
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


def test_replot_multiple_choice_from_a_partial_run(tmp_path, capsys):
    """--replot on a multiple-choice folder (no language-modelling files) rewrites mc.csv,
    mc_pairs.csv, mc_protocol.json and mc.png from the questions answered so far."""
    from geolens.cli import main

    per_q = _per_question(n=12)
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


def test_eligibility_on_constructed_accuracies():
    """A task is eligible exactly when its accuracy CI lies above chance (mean 1/#choices)."""
    import numpy as np
    import pandas as pd

    from geolens.faithfulness.multiple_choice import eligibility
    from geolens.multiple_choice import mc_summary

    rng = np.random.default_rng(0)
    rows = []
    for task, n, p, n_choices in (
        ("clear", 120, 0.9, 2),
        ("chance", 150, 0.5, 2),
        ("four_way", 80, 0.3, 4),
        ("mixed", 60, 0.8, None),
    ):
        for i in range(n):
            k = n_choices or (2 if i % 2 else 5)
            rows.append(
                dict(
                    task=task,
                    qid=i,
                    correct=bool(rng.random() < p),
                    chance=1 / k,
                    logprob_correct=-1.0,
                    logprob_correct_norm=-0.5,
                )
            )
    per_q = pd.DataFrame(rows)
    e = eligibility(per_q, n_boot=2000, seed=0).set_index("task")
    s = mc_summary(per_q, n_boot=2000, seed=0).set_index("task")
    assert list(e.index) == ["clear", "chance", "four_way", "mixed"]
    for task in e.index:
        g = per_q[per_q.task == task]
        assert e.loc[task, "n_questions"] == len(g) and e.loc[task, "accuracy"] == pytest.approx(g.correct.mean())
        assert e.loc[task, "chance"] == pytest.approx(np.mean(g.chance))
        assert (e.loc[task, "ci_low"], e.loc[task, "ci_high"]) == (
            s.loc[task, "accuracy_lo"],
            s.loc[task, "accuracy_hi"],
        )
        assert e.loc[task, "eligible"] == (e.loc[task, "ci_low"] > e.loc[task, "chance"])
    assert e.loc["clear", "eligible"] and not e.loc["chance", "eligible"] and e.loc["mixed", "eligible"]
    assert e.loc["mixed", "chance"] == pytest.approx((1 / 2 + 1 / 5) / 2)


def test_stratified_bootstrap_keeps_each_task_count():
    import numpy as np

    from geolens.faithfulness.multiple_choice import stratified_indices
    from geolens.stats import bootstrap_indices

    tasks = np.array(["a"] * 5 + ["b"] * 3 + ["a"] * 2 + ["c"])
    idx = stratified_indices(tasks, 500, seed=3)
    assert idx.shape == (500, 11)
    for row in idx:
        for t in "abc":
            assert (tasks[row] == t).sum() == (tasks == t).sum()  # each task keeps its question count
        assert (tasks[row] == tasks).all()  # a task's positions hold its own questions
    # the draws are bootstrap_indices of one generator, tasks in order of first appearance
    rng = np.random.default_rng(3)
    a, b, c = (np.flatnonzero(tasks == t) for t in "abc")
    want = np.empty_like(idx)
    for rows in (a, b, c):
        want[:, rows] = rows[bootstrap_indices(len(rows), 500, rng)]
    np.testing.assert_array_equal(idx, want)
    assert len({tuple(r) for r in idx[:, a]}) > 400  # genuinely resampled


def test_pair_tests_one_holm_family_against_a_hand_computation():
    import numpy as np

    from geolens.faithfulness.multiple_choice import pair_tests, stratified_indices
    from geolens.stats import bootstrap_pvalue, holm

    rng = np.random.default_rng(1)
    tasks = np.array(["x"] * 40 + ["y"] * 25)
    base = rng.normal(0.2, 0.3, tasks.size)
    drops = {
        "a": base,
        "b": base + 0.5 + rng.normal(0, 0.1, tasks.size),
        "c": base + rng.normal(0, 0.3, tasks.size),
        "d": base - 0.4 + rng.normal(0, 0.1, tasks.size),
        "e": base.copy(),
    }
    pairs = [("a", "b"), ("a", "c"), ("a", "d"), ("a", "e")]
    got = pair_tests(drops, tasks, pairs, identical={("a", "e")}, n_boot=1000, seed=0).set_index("b")
    assert list(got.verdict) == ["holds", "tie", "reversed", "not testable"]
    idx = stratified_indices(tasks, 1000, seed=0)
    p = []
    for b in "bcd":
        d = drops[b] - drops["a"]
        samples = np.array([sum(d[j] for j in row) / len(row) for row in idx])  # loops: the stratified means
        assert got.loc[b, "estimate"] == pytest.approx(d.mean())
        p.append(bootstrap_pvalue(samples))
        assert got.loc[b, "p"] == pytest.approx(p[-1])
    np.testing.assert_allclose(got.loc[list("bcd"), "p_adj"], holm(p))
    assert got.loc["b", "ci_low"] > 0 and got.loc["d", "ci_high"] < 0
    assert got.loc["e", "identical_masks"] and np.isnan(got.loc["e", "p"])
    assert set(got.level.dropna()) <= {1 - 0.05 / 3, 1 - 0.05 / 2, 1 - 0.05}
    assert (got.n_questions == 65).all() and got.loc["b", "n_questions_by_task"] == {"x": 40, "y": 25}


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
