"""Multiple-choice accuracy, clean and under the faithfulness masks (docs/method.md §3 downstream task).

Each question is a prompt and a list of choices with one correct answer. A choice is scored by
its log-likelihood given the prompt, log p(choice | prompt) = Σ_t log p(c_t | BOS, prompt,
c_<t) (``normalize="sum"``, the BIG-bench ``multiple_choice_grade``) or that sum divided by the
number of choice tokens (``"mean"``); the prediction is the best-scored choice.

Data, offline first:

- ``"bigbench:<task>"``: a ``task.json`` shipped in the ``bigbench`` sdist (PyPI, ~360 MB
  download; install it with ``pip install --no-deps bigbench``: geolens only reads the task
  files and never imports the package). Prompts follow the task's own ``task_prefix``,
  ``example_input_prefix`` (default ``"\\nQ: "``) and ``example_output_prefix`` (default
  ``"\\nA: "``) as BIG-bench formats its zero-shot JSON tasks.
- ``"hf:boolq"``, ``"hf:winogrande"``, ``"hf:mmlu[:subject]"``: HF ``datasets`` (network).
- a local ``.jsonl`` file with ``prompt``, ``choices`` and ``answer`` (index) fields.

Under masks, each (question, choice) sequence gets its own metric scores and masks
(:func:`geolens.faithfulness.metric_scores`, same protocol) and all masks of one sequence run
batched (:func:`geolens.interventions.masking.masked_token_nll`), scoring only the choice tokens.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import pandas as pd
import torch
from tqdm.auto import tqdm

from geolens.faithfulness import DIRECTIONS, Protocol, curve_masks, metric_scores
from geolens.interventions.masking import masked_token_nll, tail_nll


@dataclass(frozen=True)
class Question:
    prompt: str
    choices: tuple[str, ...]
    answer: int  # index of the correct choice


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
    path = bigbench_tasks_dir() / task / "task.json"
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
        out.append(Question(prompt=prompt, choices=choices, answer=[scores[c] for c in choices].index(1)))
    if not out:
        raise ValueError(f"BIG-bench task {task!r} has no multiple-choice example with one correct answer")
    return out[:max_questions] if max_questions else out


def _load_hf(name: str) -> list[Question]:
    from datasets import load_dataset  # network access (or a local HF cache)

    kind, _, sub = name.partition(":")
    if kind == "boolq":
        rows = load_dataset("google/boolq", split="validation")
        return [Question(f"{r['passage']}\nQuestion: {r['question']}?\nAnswer:", ("no", "yes"), int(r["answer"])) for r in rows]
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
            Question(f"{r['question']}\n" + "".join(f"{l}. {c}\n" for l, c in zip("ABCD", r["choices"])) + "Answer:", tuple("ABCD"), int(r["answer"]))
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


def choice_tokens(model, question: Question) -> list[torch.Tensor]:
    """``[1, pos]`` token rows BOS + prompt + " " + choice, one per choice, and the choice lengths."""
    tok = model.tokenizer
    prompt = model.to_tokens(question.prompt, prepend_bos=True)[0].tolist()
    rows = []
    for c in question.choices:
        ids = tok(" " + c.strip(), add_special_tokens=False)["input_ids"]
        if not ids:
            raise ValueError(f"choice {c!r} tokenises to nothing")
        rows.append((torch.tensor([prompt + ids]), len(ids)))
    return rows


def _predict(logliks: Sequence[float], lengths: Sequence[int], normalize: str) -> int:
    if normalize == "mean":
        logliks = [s / n for s, n in zip(logliks, lengths)]
    elif normalize != "sum":
        raise ValueError(f"normalize must be 'sum' or 'mean', got {normalize!r}")
    return int(max(range(len(logliks)), key=lambda k: logliks[k]))


def choice_loglik(model, tokens: torch.Tensor, n_choice: int) -> float:
    """log p(choice | prompt) = −Σ NLL of the last ``n_choice`` tokens of ``tokens`` ``[1, pos]``."""
    with torch.no_grad():
        logits = model(tokens, return_type="logits")
    return -float(tail_nll(logits[:, -1 - n_choice : -1], tokens).sum())


def mc_accuracy(model, questions: Sequence[Question], *, normalize: str = "sum", progress: bool = False) -> float:
    """Clean accuracy: the share of questions whose best log-likelihood choice is correct."""
    correct = 0
    for q in tqdm(questions, desc="multiple choice", disable=not progress):
        rows = choice_tokens(model, q)
        ll = [choice_loglik(model, t, n) for t, n in rows]
        correct += _predict(ll, [n for _, n in rows], normalize) == q.answer
    return correct / len(questions)


def mc_accuracy_under_masks(
    model,
    questions: Sequence[Question],
    protocol: Protocol,
    metrics: Sequence[str],
    *,
    normalize: str = "sum",
    seed: int = 0,
    chunk_size: int = 18,
    progress: bool = True,
) -> pd.DataFrame:
    """Accuracy per (metric, direction, fraction) under the protocol's masks, plus the clean row.

    Returns rows ``metric, direction, fraction, accuracy, n_questions`` (``metric="clean"`` for
    the unmasked model).
    """
    layers = protocol.resolved_layers(model)
    n_k = len(protocol.fractions)
    n_heads = model.cfg.n_heads
    correct = torch.zeros(len(metrics), 2, n_k)
    clean_correct = 0
    for qi, q in enumerate(tqdm(questions, desc="multiple choice", disable=not progress)):
        rows = choice_tokens(model, q)
        lengths = [n for _, n in rows]
        clean_ll, masked_ll = [], []
        for ci, (tokens, n) in enumerate(rows):
            clean_ll.append(choice_loglik(model, tokens, n))
            scores = metric_scores(model, tokens, protocol, metrics, seed=seed + 1000 * qi + ci)
            masks = torch.cat([curve_masks(scores[m], protocol).expand(-1, -1, n_heads, -1, -1) for m in metrics], dim=1)
            nll = masked_token_nll(model, tokens, masks, layers, chunk_size=chunk_size, n_scored=n)
            masked_ll.append(-nll.sum(-1).reshape(len(metrics), 2, n_k))
        clean_correct += _predict(clean_ll, lengths, normalize) == q.answer
        ll = torch.stack(masked_ll, dim=-1)  # [metric, direction, k, choice]
        if normalize == "mean":
            ll = ll / torch.tensor(lengths, dtype=ll.dtype)
        correct += (ll.argmax(-1) == q.answer).float()
    n = len(questions)
    out = [dict(metric="clean", direction="none", fraction=0.0, accuracy=clean_correct / n, n_questions=n)]
    for mi, m in enumerate(metrics):
        for di, d in enumerate(DIRECTIONS):
            for ki, k in enumerate(protocol.fractions):
                out.append(dict(metric=m, direction=d, fraction=k, accuracy=float(correct[mi, di, ki]) / n, n_questions=n))
    return pd.DataFrame(out)
