"""Multiple-choice questions and their scoring by log-likelihood (docs/method.md §3 downstream task).

Each question is a prompt and a list of choices with one correct answer. A choice is scored by
its log-likelihood given the prompt, log p(choice | prompt) = Σ_t log p(c_t | BOS, prompt,
c_<t) (``normalize="sum"``, the BIG-bench ``multiple_choice_grade``) or that sum divided by the
number of choice tokens (``"mean"``); the prediction is the best-scored choice.

Data, offline first:

- ``"bigbench:<task>"``: a BIG-bench ``task.json``. Four tasks ship with geolens
  (``geolens/mc_data/bigbench``, Apache-2.0, see its README), chosen as the closest to the
  MMLU, Winogrande and BoolQ of Cunningham & Muça Cirone 2026 (:data:`MC_TASKS`): ``general_knowledge`` and
  ``hindu_knowledge`` (knowledge QA), ``disambiguation_qa`` (pronoun resolution),
  ``causal_judgment`` (a story and a yes/no question); 691 questions. Other tasks are read from
  an installed ``bigbench`` sdist (``pip install --no-deps bigbench``, ~360 MB; never imported,
  only its files are read). Prompts follow the task's own ``task_prefix``,
  ``example_input_prefix`` (default ``"\\nQ: "``) and ``example_output_prefix`` (default
  ``"\\nA: "``) as BIG-bench formats its zero-shot JSON tasks.
- ``"hf:boolq"``, ``"hf:winogrande"``, ``"hf:mmlu[:subject]"``: HF ``datasets`` (network).
- a local ``.jsonl`` file with ``prompt``, ``choices`` and ``answer`` (index) fields.

Scoring (:func:`score_questions`): one forward pass per question scores every choice (the rows
prompt + choice_k share the prompt; a shorter choice is filled up with its own last token, which
causal attention never lets act on the scored positions, and only the positions that predict
choice tokens are unembedded; single-token choices need just the prompt). Per question: the
prediction, whether it is correct, log p(correct | prompt), its share among the choices
log softmax_k(log p(choice_k | prompt)) and the answer margin, score(correct) − max score(other
choices) (:func:`choice_scores`: summed log-prob, or per-token mean, the choice-normalised score
of docs/faithfulness/PROTOCOL.md §5). :func:`mc_summary` gives accuracy and mean log-prob with
bootstrap CIs over questions, :func:`paired_difference` the paired bootstrap of a difference
between two runs on the same questions.

Multiple choice under masks is in :mod:`geolens.faithfulness`, which builds on this module (this
one imports nothing of it): under the pre-registered protocol (eligibility, per-layer masks,
margin drops, Holm family; ``geolens mc``) :mod:`geolens.faithfulness.multiple_choice`, under
protocol 1's masking-curve masks :mod:`geolens.faithfulness.mc_curves`.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from geolens.stats import bootstrap_indices, mean_ci, paired_bootstrap
from geolens.stats import verdict as ci_verdict


@dataclass(frozen=True)
class Question:
    prompt: str
    choices: tuple[str, ...]
    answer: int  # index of the correct choice
    task: str = ""


SHIPPED_BIGBENCH = Path(__file__).parent / "mc_data" / "bigbench"
MC_TASKS: dict[str, str] = {
    "general_knowledge": "knowledge QA (closest to MMLU)",
    "hindu_knowledge": "knowledge QA, 4-way (closest to MMLU)",
    "disambiguation_qa": "pronoun resolution (closest to Winogrande)",
    "causal_judgment": "yes/no question about a story (closest to BoolQ)",
}
"""The BIG-bench tasks shipped with geolens and why each was chosen."""
DEFAULT_TASKS: tuple[str, ...] = tuple(MC_TASKS)


def bigbench_task_path(task: str) -> Path:
    """The shipped ``task.json`` of ``task``, else the one of an installed ``bigbench`` sdist."""
    shipped = SHIPPED_BIGBENCH / task / "task.json"
    if shipped.exists():
        return shipped
    try:
        return bigbench_tasks_dir() / task / "task.json"
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            f"BIG-bench task {task!r} is not shipped with geolens (shipped: {', '.join(sorted(MC_TASKS))}) "
            "and the bigbench sdist is not installed (pip install --no-deps bigbench)"
        ) from None


def bigbench_tasks_dir() -> Path:
    spec = importlib.util.find_spec("bigbench")  # never imported: only its data files are read
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "offline multiple-choice data come from the bigbench sdist: pip install --no-deps bigbench "
            "(about 360 MB), or use an 'hf:' data set with network access"
        )
    return Path(list(spec.submodule_search_locations)[0]) / "benchmark_tasks"


def load_bigbench_task(task: str, *, max_questions: int | None = None) -> list[Question]:
    """Questions of a BIG-bench JSON task with ``target_scores`` (one correct choice)."""
    path = bigbench_task_path(task)
    if not path.exists():
        raise FileNotFoundError(f"no BIG-bench JSON task {task!r} ({path} is missing)")
    spec = json.loads(path.read_text(encoding="utf-8"))
    prefix = spec.get("task_prefix", "")
    q_prefix = spec.get("example_input_prefix", "\nQ: ")
    a_prefix = spec.get("example_output_prefix", "\nA: ")
    out = []
    for ex in spec.get("examples", []):
        scores = ex.get("target_scores")
        if not scores or sum(1 for v in scores.values() if v == 1) != 1:
            continue
        choices = tuple(scores)
        prompt = (prefix + q_prefix + ex["input"]).strip() + a_prefix.rstrip(" ")
        out.append(Question(prompt=prompt, choices=choices, answer=[scores[c] for c in choices].index(1), task=task))
    if not out:
        raise ValueError(f"BIG-bench task {task!r} has no multiple-choice example with one correct answer")
    return out[:max_questions] if max_questions else out


def _load_hf(name: str) -> list[Question]:
    from datasets import load_dataset  # network access (or a local HF cache)

    kind, _, sub = name.partition(":")
    if kind == "boolq":
        rows = load_dataset("google/boolq", split="validation")
        return [
            Question(f"{r['passage']}\nQuestion: {r['question']}?\nAnswer:", ("no", "yes"), int(r["answer"]))
            for r in rows
        ]
    if kind == "winogrande":
        rows = load_dataset("allenai/winogrande", "winogrande_xl", split="validation")
        out = []
        for r in rows:
            pre, _, post = r["sentence"].partition("_")
            out.append(Question(pre.rstrip(), (f"{r['option1']}{post}", f"{r['option2']}{post}"), int(r["answer"]) - 1))
        return out
    if kind == "mmlu":
        rows = load_dataset("cais/mmlu", sub or "all", split="test")
        return [
            Question(
                f"{r['question']}\n" + "".join(f"{l}. {c}\n" for l, c in zip("ABCD", r["choices"])) + "Answer:",
                tuple("ABCD"),
                int(r["answer"]),
            )
            for r in rows
        ]
    raise ValueError(f"unknown HF multiple-choice set {name!r}: use boolq, winogrande or mmlu[:subject]")


def load_questions(name: str, *, max_questions: int | None = None) -> list[Question]:
    """``bigbench:<task>``, ``hf:boolq|winogrande|mmlu[:subject]`` or a local ``.jsonl`` file."""
    if name.startswith("bigbench:"):
        return load_bigbench_task(name.split(":", 1)[1], max_questions=max_questions)
    if name.startswith("hf:"):
        qs = _load_hf(name[3:])
    else:
        path = Path(name)
        if not path.exists():
            raise FileNotFoundError(f"multiple-choice set {name!r} is neither bigbench:<task>, hf:<name> nor a file")
        qs = []
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                r = json.loads(line)
                qs.append(Question(r["prompt"], tuple(r["choices"]), int(r["answer"])))
    return qs[:max_questions] if max_questions else qs


def prompt_and_choice_ids(model, question: Question) -> tuple[list[int], list[list[int]]]:
    """(BOS + prompt token ids, each choice's token ids, tokenised as " " + choice); ValueError for
    a question without choices, an answer index out of range or a choice that tokenises to nothing,
    and (a :class:`~geolens.errors.UsageError`, one line on the command line) for a prompt and choice
    longer than the model's context: the prompt is never cut."""
    from geolens.errors import UsageError
    from geolens.validation import _full_text_tokens

    if not question.choices:
        raise ValueError(f"question {question.prompt[:40]!r} has no choices")
    if not 0 <= question.answer < len(question.choices):
        raise ValueError(f"answer index {question.answer} out of range for {len(question.choices)} choices")
    tok = model.tokenizer
    prompt = _full_text_tokens(model, question.prompt, prepend_bos=True)[0][0].tolist()
    ids = []
    for c in question.choices:
        c_ids = tok(" " + c.strip(), add_special_tokens=False)["input_ids"]
        if not c_ids:
            raise ValueError(f"choice {c!r} tokenises to nothing")
        ids.append(list(c_ids))
    n_ctx = getattr(model.cfg, "n_ctx", None)
    longest = len(prompt) + max(len(c) for c in ids)
    if n_ctx is not None and longest > int(n_ctx):
        raise UsageError(
            f"question {question.prompt[:40]!r}: its prompt and longest choice are {longest} tokens (BOS included), "
            f"longer than the model's context of {int(n_ctx)} tokens; shorten it (a prompt is never cut)"
        )
    return prompt, ids


def choice_tokens(model, question: Question) -> list[tuple[torch.Tensor, int]]:
    """``[1, pos]`` token rows BOS + prompt + " " + choice, one per choice, and the choice lengths."""
    prompt, ids = prompt_and_choice_ids(model, question)
    return [(torch.tensor([prompt + c]), len(c)) for c in ids]


def positions_from(start: int):
    """A hook keeping positions ``start`` … of its activation (before the unembedding: fewer logits)."""

    def hook(x, hook=None):
        return x[:, start:].contiguous()

    return hook


def choice_logliks(model, question: Question, *, fwd_hooks=()) -> tuple[list[float], list[int]]:
    """log p(choice_k | prompt) = Σ_t log p(c_t | BOS, prompt, c_<t) for every choice, in one forward.

    Rows are prompt + choice_k[:-1] (the last choice token is predicted, never read), filled up
    to the longest choice with the row's own last token; causal attention keeps the fill from
    acting on the scored positions. Only positions P − 1 … (P = prompt length) are unembedded.
    ``fwd_hooks`` are applied to that forward (e.g. an intervention). Returns (log-likelihoods,
    choice lengths).
    """
    from geolens.adapter import unembed_input_hook
    from geolens.interventions.base import applied

    prompt, ids = prompt_and_choice_ids(model, question)
    P, n_max = len(prompt), max(len(c) for c in ids)
    if n_max == 1:
        rows = torch.tensor([prompt])
    else:
        rows = torch.tensor([prompt + (c + [c[-1]] * (n_max - len(c)))[: n_max - 1] for c in ids])
    hooks = list(fwd_hooks) + [(unembed_input_hook(model), positions_from(P - 1))]
    with torch.no_grad(), applied(model, hooks):
        logits = model(rows.to(next(model.parameters()).device), return_type="logits")
    logp = torch.log_softmax(logits.to(torch.float64), dim=-1)  # [rows, n_max, vocab]
    out = []
    for k, c in enumerate(ids):
        r = 0 if n_max == 1 else k
        out.append(float(sum(logp[r, t, c[t]] for t in range(len(c)))))
    return out, [len(c) for c in ids]


def choice_scores(logliks: Sequence[float], lengths: Sequence[int], normalize: str = "mean") -> list[float]:
    """Each choice's score from its log-likelihood: ``"mean"`` (choice-normalised) divides
    log p(choice | prompt) by the choice's token count, the mean per-token log-probability;
    ``"sum"`` keeps the sum (BIG-bench ``multiple_choice_grade``).

    >>> choice_scores([-6.0, -3.0], [3, 1]), choice_scores([-6.0, -3.0], [3, 1], "sum")
    ([-2.0, -3.0], [-6.0, -3.0])
    """
    if normalize == "mean":
        return [float(s) / int(n) for s, n in zip(logliks, lengths)]
    if normalize != "sum":
        raise ValueError(f"normalize must be 'sum' or 'mean', got {normalize!r}")
    return [float(s) for s in logliks]


def answer_margin(scores: Sequence[float], answer: int) -> float:
    """score(correct) − max score(other choices): > 0 exactly when the correct choice wins alone.

    >>> answer_margin([-1.0, -1.5, -3.0], 0), answer_margin([-1.0, -1.5, -3.0], 2)
    (0.5, -2.0)
    """
    if len(scores) < 2:
        raise ValueError(f"an answer margin needs at least two choices, got {len(scores)}")
    return float(scores[answer]) - max(float(s) for k, s in enumerate(scores) if k != answer)


def question_row(q: Question, qid: int, ll: Sequence[float], lengths: Sequence[int], normalize: str) -> dict:
    """The per-question columns of :func:`score_questions` from the choices' log-likelihoods:
    ``task, qid, n_choices, answer, predicted, correct, logprob_correct, logprob_correct_norm,
    margin, chance`` (``margin``: :func:`answer_margin` of the :func:`choice_scores`)."""
    scores = choice_scores(ll, lengths, normalize)
    pred = int(max(range(len(scores)), key=lambda k: scores[k]))
    lls = torch.tensor(ll, dtype=torch.float64)
    margin = answer_margin(scores, q.answer) if len(scores) > 1 else float("nan")
    return dict(
        task=q.task,
        qid=qid,
        n_choices=len(q.choices),
        answer=q.answer,
        predicted=pred,
        correct=bool(pred == q.answer),
        logprob_correct=float(lls[q.answer]),
        logprob_correct_norm=float(torch.log_softmax(lls, 0)[q.answer]),
        margin=margin,
        chance=1.0 / len(q.choices),
    )


def score_questions(
    model, questions: Sequence[Question], *, normalize: str = "sum", fwd_hooks=(), progress: bool = False
) -> pd.DataFrame:
    """One row per question: ``task, qid, n_choices, answer, predicted, correct, logprob_correct,
    logprob_correct_norm, margin, chance`` (:func:`question_row`; ``qid`` = index within its task).
    ``normalize`` picks the choice score (:func:`choice_scores`) that decides the prediction and
    the margin; the log-prob columns are always the summed log p(choice | prompt)."""
    if normalize not in ("sum", "mean"):
        raise ValueError(f"normalize must be 'sum' or 'mean', got {normalize!r}")
    rows, seen = [], {}
    for q in tqdm(questions, desc="multiple choice", disable=not progress):
        qid = seen.get(q.task, 0)
        seen[q.task] = qid + 1
        ll, lengths = choice_logliks(model, q, fwd_hooks=fwd_hooks)
        rows.append(question_row(q, qid, ll, lengths, normalize))
    return pd.DataFrame(rows)


def mc_summary(per_question: pd.DataFrame, *, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Per task and over all questions (``task="all"``): ``n_questions``, ``accuracy`` [95% CI],
    ``chance`` (mean 1/n_choices), mean ``logprob_correct`` and ``logprob_correct_norm`` [95% CI];
    percentile bootstrap over questions (:func:`geolens.stats.mean_ci`), resampled within the group,
    the groups' resamples drawn in turn from one generator seeded with ``seed``."""
    if per_question.empty:
        raise ValueError("no questions to summarise")
    groups = [(t, g) for t, g in per_question.groupby("task", sort=False)]
    if len(groups) > 1:
        groups.append(("all", per_question))
    rows = []
    rng = np.random.default_rng(seed)
    for task, g in groups:
        idx = bootstrap_indices(len(g), n_boot, rng)  # the same resamples for the three columns
        row = dict(task=task, n_questions=int(len(g)), chance=float(g.chance.mean()))
        for col, name in (
            ("correct", "accuracy"),
            ("logprob_correct", "logprob_correct"),
            ("logprob_correct_norm", "logprob_correct_norm"),
        ):
            m, lo, hi = mean_ci(g[col].astype(float), indices=idx)
            row.update({name: float(m), f"{name}_lo": float(lo), f"{name}_hi": float(hi)})
        rows.append(row)
    return pd.DataFrame(rows)


def paired_difference(a: pd.DataFrame, b: pd.DataFrame, *, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """b − a on the same questions (matched on ``task, qid``): accuracy and log-prob differences
    with paired bootstrap CIs over questions (:func:`geolens.stats.paired_bootstrap`), per task and
    over all; ``verdict`` says which run is higher in accuracy only when the CI excludes 0 (``tie``
    otherwise; :func:`geolens.stats.verdict`: ``b higher`` for holds, ``a higher`` for reversed)."""
    m = a.merge(b, on=["task", "qid"], suffixes=("_a", "_b"), validate="one_to_one")
    if len(m) != len(a) or len(m) != len(b):
        raise ValueError(f"the two runs must score the same questions: {len(a)} and {len(b)} rows, {len(m)} matched")
    groups = [(t, g) for t, g in m.groupby("task", sort=False)]
    if len(groups) > 1:
        groups.append(("all", m))
    rng = np.random.default_rng(seed)
    rows = []
    for task, g in groups:
        idx = bootstrap_indices(len(g), n_boot, rng)  # the same resamples for the three columns
        row = dict(task=task, n_questions=int(len(g)))
        for col in ("correct", "logprob_correct", "logprob_correct_norm"):
            mean, lo, hi = paired_bootstrap(g[f"{col}_a"].astype(float), g[f"{col}_b"].astype(float), indices=idx)
            name = "accuracy" if col == "correct" else col
            row.update({f"{name}_diff": float(mean), f"{name}_diff_lo": float(lo), f"{name}_diff_hi": float(hi)})
        v = ci_verdict(row["accuracy_diff_lo"], row["accuracy_diff_hi"])
        row["verdict"] = {"holds": "b higher", "reversed": "a higher"}.get(v, v)
        rows.append(row)
    return pd.DataFrame(rows)
