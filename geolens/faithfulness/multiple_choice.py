"""Multiple choice under the pre-registered faithfulness protocol (docs/faithfulness/PROTOCOL.md §5).

- **Scoring**: each choice's score is its mean per-token log-probability given the prompt,
  (1/n) Σ_t log p(c_t | BOS, prompt, c_<t) (:func:`geolens.multiple_choice.choice_scores`,
  ``normalize="mean"``); the prediction is the arg-max choice and the **answer margin** is
  score(correct) − max score(other choices) (:func:`geolens.multiple_choice.answer_margin`).
- **Eligibility** (:func:`~geolens.faithfulness.mc_stats.eligibility`): a task takes part in
  verdicts only if the 95% CI of its clean accuracy lies entirely above chance (mean 1/#choices);
  the other tasks are listed as excluded, with accuracy, CI and chance.
- **Masking** (:func:`masked_scores`), eligible tasks only: one layer at a time, every third layer
  (0, 3, 6, …), comprehensiveness, with the masks of the per-layer endpoint (PROTOCOL.md §3,
  :mod:`geolens.faithfulness.layer_masking`): each sequence BOS + prompt + choice gets each
  metric's scores at that layer (:func:`~geolens.faithfulness.layer_masking.masking_scores`:
  ``output_normalized_intra`` α‖ṽ_j‖/‖o_i^h‖, every other metric in inter mode) and, for every
  query, the top ⌈k·n⌉ of its n terms (h, j) with α_ij^h ≠ 0, pooled over heads
  (:func:`~geolens.faithfulness.layer_masking.query_masks`, ties by source then head), are removed
  by setting α_ij^h = 0 in that layer's ``hook_pattern``, not renormalised, on prompt and choice
  tokens alike; the masked forwards start at that layer from the clean residual stream.
- **Outcome** per question and metric: the mean over layers and k of the margin's drop,
  margin(clean) − margin(masked); larger means the metric found terms the answer depends on.
- **Pairs** (:func:`~geolens.faithfulness.mc_stats.pair_tests`), pairs 1–5 of §4 (:data:`DEFAULT_PAIRS`): Δ = mean drop(b) −
  mean drop(a) over questions (Δ > 0: b more faithful), its bootstrap distribution from
  task-stratified resamples (:func:`~geolens.faithfulness.mc_stats.stratified_indices`: questions resampled within each task,
  so each task keeps its question count), B = 2000, seed 0, one Holm family
  (:func:`geolens.stats.holm_family`: raw and adjusted p, interval at the pair's Holm level,
  verdict). A pair whose two metrics gave identical masks in every condition is ``not testable``.

:func:`run_multiple_choice` runs all of it; with an :class:`MCCheckpoint` every question's record
is saved atomically (:func:`geolens.checkpoint.atomic_write_bytes`) as soon as it is computed,
so an interrupted run resumes where it stopped (:mod:`geolens.faithfulness.mc_checkpoint`). :func:`mc_protocol` reads the settings of
``protocol.json`` and :func:`differences` says where a run departs from them (the run is then
labelled ``exploratory`` and gets no verdicts).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from geolens.faithfulness.layer_masking import MASKING_METRICS, Condition, distinct_masks, masking_scores, query_masks
from geolens.faithfulness.mc_checkpoint import CHECKPOINT, MCCheckpoint, keep_record, question_key, question_sha
from geolens.faithfulness.mc_stats import eligibility, pair_tests, stratified_indices
from geolens.interventions.masking import pattern_mask_hooks
from geolens.metrics import find_metric
from geolens.multiple_choice import (
    Question,
    choice_logliks,
    choice_scores,
    positions_from,
    prompt_and_choice_ids,
    question_row,
)
from geolens.preregistration import Preregistered, load_protocol, preregistration, withhold_verdicts
from geolens.stats import percentile_ci, resample_means

DEFAULT_PAIRS: tuple[tuple[str, str], ...] = (
    ("raw_attention", "value_weighted"),
    ("value_weighted", "output_normalized_intra"),
    ("output_normalized_inter", "contribution"),
    ("raw_attention", "contribution"),
    ("contribution", "contribution_abs"),
)
"""Pairs 1–5 of docs/faithfulness/PROTOCOL.md §4, (a, b): "b is more faithful than a"."""
SCORING = {"mean": "choice_normalized_mean_logprob", "sum": "summed_logprob"}
_LAYER_STEPS = {"every layer": 1, "every second layer": 2, "every third layer": 3}


# ---------------------------------------------------------------------------------------------
# Settings and the protocol file


@dataclass(frozen=True)
class MCSettings:
    """How questions are scored, masked and compared (the defaults are the protocol's §5).

    Attributes:
        normalize: choice score, ``mean`` (choice-normalised, the protocol) or ``sum``.
        layer_step: masked layers 0, step, 2·step, … (3: every third layer).
        fractions: the k of the comprehensiveness masks (⌈k·n⌉ terms of each query removed).
        pairs: the (a, b) metric pairs of the Holm family.
        n_boot, seed: bootstrap resamples and the seed of every draw (eligibility and pairs).
        alpha: the family-wise error rate of the Holm family.
        mask_tasks: ``eligible`` (protocol 2: only the tasks whose clean accuracy is above chance
            are masked) or ``all`` (protocol 3's addendum: every task of a fixed set, eligibility
            reported only).
    """

    normalize: str = "mean"
    layer_step: int = 3
    fractions: tuple[float, ...] = (0.05, 0.2)
    pairs: tuple[tuple[str, str], ...] = DEFAULT_PAIRS
    n_boot: int = 2000
    seed: int = 0
    alpha: float = 0.05
    mask_tasks: str = "eligible"

    def __post_init__(self) -> None:
        if self.mask_tasks not in ("eligible", "all"):
            raise ValueError(f"mask_tasks must be 'eligible' or 'all', got {self.mask_tasks!r}")
        if self.normalize not in SCORING:
            raise ValueError(f"normalize must be 'sum' or 'mean', got {self.normalize!r}")
        if isinstance(self.layer_step, bool) or int(self.layer_step) != self.layer_step or self.layer_step < 1:
            raise ValueError(f"layer_step must be an integer ≥ 1, got {self.layer_step!r}")
        fr = tuple(float(k) for k in self.fractions)
        if not fr or any(not 0.0 < k <= 1.0 for k in fr) or list(fr) != sorted(set(fr)):
            raise ValueError(f"fractions must be distinct, increasing and in (0, 1], got {list(self.fractions)}")
        object.__setattr__(self, "fractions", fr)
        pairs = tuple((str(a), str(b)) for a, b in self.pairs)
        if not pairs or any(a == b for a, b in pairs):
            raise ValueError(f"pairs must name two different metrics each, got {list(self.pairs)}")
        object.__setattr__(self, "pairs", pairs)
        for name in self.metrics:
            metric = find_metric(name)
            if name not in MASKING_METRICS or (metric is not None and not metric.per_layer):
                raise ValueError(
                    f"metric {name!r}: multiple choice masks with the per-layer metrics of {list(MASKING_METRICS)}"
                )
        if int(self.n_boot) < 1:
            raise ValueError(f"n_boot must be ≥ 1, got {self.n_boot}")
        if not 0.0 < self.alpha < 1.0:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha}")

    @property
    def metrics(self) -> tuple[str, ...]:
        """The metrics of the pairs, in order of first appearance."""
        return tuple(dict.fromkeys(m for pair in self.pairs for m in pair))

    def layers(self, n_layers: int) -> tuple[int, ...]:
        """The masked layers of a model of ``n_layers`` layers: 0, step, 2·step, …"""
        return tuple(range(0, int(n_layers), int(self.layer_step)))

    def fingerprint(self) -> dict:
        """What a checkpoint's records depend on (the statistics are recomputed on resume)."""
        return dict(
            normalize=self.normalize,
            layer_step=int(self.layer_step),
            fractions=list(self.fractions),
            metrics=list(self.metrics),
        )


@dataclass(frozen=True)
class MCProtocol:
    """The multiple-choice part of a pre-registered protocol
    (:func:`geolens.faithfulness.preregistered.load_protocol`: the twin and its text's hash)."""

    preregistered: Preregistered
    tasks: tuple[str, ...]
    settings: MCSettings
    records: dict = field(default_factory=dict)  # model → {path, sha256}: stored records a re-analysis reads
    source: str | None = None  # what the records are (protocol 3's addendum: a re-analysis)


def mc_protocol(path) -> MCProtocol:
    """The tasks and :class:`MCSettings` of ``protocol.json``'s ``multiple_choice`` block (pairs
    ``i-j`` of its ``pairs``, seed and α of its ``statistics``). ValueError in one line when the
    protocol is missing or asks for something this module does not implement.

    >>> from pathlib import Path
    >>> p = mc_protocol(Path(__file__).parents[2] / "docs" / "faithfulness" / "protocol.json")
    >>> p.settings.layer_step, p.settings.fractions, len(p.settings.pairs), len(p.preregistered.sha256)
    (3, (0.05, 0.2), 5, 64)
    """
    pre = load_protocol(path)
    try:
        mc, spec = pre["multiple_choice"], pre.settings
        fixed = {
            "scoring": "choice_normalized_mean_logprob",
            "outcome": "answer_margin_drop",
            "direction": "comprehensiveness",
            "multiple_comparison": "holm",
            "masking": ("eligible tasks only", "every task of the set"),
            "layers": tuple(_LAYER_STEPS),
        }
        for key, value in fixed.items():
            if mc.get(key) not in (value if isinstance(value, tuple) else (value,)):
                raise ValueError(f"multiple_choice.{key} = {mc.get(key)!r}; this version of geolens runs {value!r}")
        match = re.fullmatch(r"pairs (\d+)-(\d+)", str(mc.get("pairs")))
        if (
            "task-stratified" not in str(mc.get("bootstrap"))
            or not match
            or not 1 <= int(match[1]) <= int(match[2]) <= len(spec["pairs"])
        ):
            raise ValueError(
                f"multiple_choice: bootstrap {mc.get('bootstrap')!r} and pairs {mc.get('pairs')!r}: expected a "
                f"task-stratified bootstrap and 'pairs i-j' of the protocol's {len(spec['pairs'])} pairs"
            )
        settings = MCSettings(
            normalize="mean",
            layer_step=_LAYER_STEPS[mc["layers"]],
            fractions=tuple(mc["fractions"]),
            pairs=tuple(tuple(p) for p in spec["pairs"][int(match[1]) - 1 : int(match[2])]),
            n_boot=int(mc["n_boot"]),
            seed=int(spec["statistics"]["seed"]),
            alpha=float(spec["statistics"]["alpha"]),
            mask_tasks="all" if mc["masking"] == "every task of the set" else "eligible",
        )
        return MCProtocol(pre, tuple(mc["tasks"]), settings, dict(mc.get("records", {})), mc.get("source"))
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(
            f"protocol {path}: {err if isinstance(err, ValueError) else f'missing or malformed field {err}'}"
        ) from None


def differences(
    protocol: MCProtocol,
    *,
    tasks: Sequence[str],
    max_questions: int,
    settings: MCSettings,
    model: str,
    model_mode: str,
    dtype: str | None = None,
) -> list[str]:
    """Where a run departs from ``protocol``, one line each (empty: the pre-registered run).

    >>> from pathlib import Path
    >>> p = mc_protocol(Path(__file__).parents[2] / "docs" / "faithfulness" / "protocol.json")
    >>> differences(p, tasks=p.tasks, max_questions=0, settings=p.settings, model="smollm2-135m", model_mode="bridge")
    []
    >>> differences(p, tasks=p.tasks[:1], max_questions=0, settings=p.settings, model="tiny-gqa", model_mode="bridge")[0]
    "model tiny-gqa is not one of the protocol's ['smollm2-135m', 'gemma3-270m']"
    """
    data = protocol.preregistered.settings.get("data", {})
    out = []
    if model not in data.get("models", ()):
        out.append(f"model {model} is not one of the protocol's {data.get('models')}")
    if data.get("model_mode") and model_mode != data["model_mode"]:
        out.append(f"model mode {model_mode}, not {data['model_mode']}")
    if dtype is not None and data.get("dtype") and dtype != data["dtype"]:
        out.append(f"dtype {dtype}, not {data['dtype']}")
    if tuple(tasks) != protocol.tasks:
        out.append(f"tasks {list(tasks)}, not {list(protocol.tasks)}")
    if max_questions:
        out.append(f"the first {max_questions} questions of each task, not all")
    for key in ("normalize", "layer_step", "fractions", "pairs", "n_boot", "seed", "alpha", "mask_tasks"):
        got, want = getattr(settings, key), getattr(protocol.settings, key)
        if got != want:
            out.append(f"{key} = {got}, not {want}")
    return sorted(out)


# ---------------------------------------------------------------------------------------------
# Masked scores


def masked_scores(
    model,
    question: Question,
    layers: Sequence[int],
    metrics: Sequence[str],
    fractions: Sequence[float],
    *,
    normalize: str = "mean",
    chunk_size: int = 16,
) -> tuple[np.ndarray, np.ndarray]:
    """Every choice's score under every (metric, layer, k) mask, and which metrics masked alike.

    Returns ``scores`` ``[metric, layer, k, choice]`` (float64; :func:`~geolens.multiple_choice.choice_scores`
    of the masked log-likelihoods) and ``same`` ``[metric, metric]``: True where two metrics' masks
    were identical for every choice, layer and k.

    The sequence of choice c is BOS + prompt + c without its last token (predicted, never read:
    causal attention keeps it from acting on any scored position), so choices whose sequences
    coincide (every single-token choice: the prompt alone) share one clean run and one masked run.
    Each masked forward starts at the masked layer from the clean residual stream
    (:meth:`~geolens.adapter.ModelAdapter.forward_from_layer`), identical masks run once,
    ``chunk_size`` masks per forward, and only the positions predicting choice tokens are unembedded.
    """
    from geolens.adapter import adapter_for, get_attention_layer, names_filter, unembed_input_hook
    from geolens.interventions.base import applied

    layers = [int(l) for l in layers]
    fractions = [float(k) for k in fractions]
    n_m, n_k = len(metrics), len(fractions)
    prompt, choices = prompt_and_choice_ids(model, question)
    scores = np.zeros((n_m, len(layers), n_k, len(choices)))
    same = np.ones((n_m, n_m), dtype=bool)
    adapter = adapter_for(model)
    device = next(model.parameters()).device
    wanted, resid_names = names_filter(model, layers), {adapter.resid_pre_hook(l) for l in layers}
    rows: dict[tuple[int, ...], list[int]] = {}
    for c, ids in enumerate(choices):
        rows.setdefault(tuple(prompt + ids[:-1]), []).append(c)
    for row, members in rows.items():
        tokens = torch.tensor([row], device=device)
        n = len(choices[members[0]])  # the row predicts its choices' n tokens from its last n positions
        with torch.no_grad():
            _, cache = model.run_with_cache(tokens, names_filter=lambda name: wanted(name) or name in resid_names)
        for li, layer in enumerate(layers):
            view = get_attention_layer(model, cache, layer)
            by_metric = masking_scores(view, metrics)
            terms = view.pattern[0] != 0
            conditions = [
                Condition(m, "comprehensiveness", k, mask)
                for m in metrics
                for k, mask in zip(fractions, query_masks(by_metric[m], terms, fractions))
            ]
            _, unique, which = distinct_masks(conditions)  # [distinct, head, query, key]; which: [metric·k]
            which = np.asarray(which)
            resid = cache[adapter.resid_pre_hook(layer)]
            logp = []
            for start in range(0, len(unique), chunk_size):
                chunk = unique[start : start + chunk_size]
                hooks = list(pattern_mask_hooks(model, chunk[None], [layer])) + [
                    (unembed_input_hook(model), positions_from(len(row) - n))
                ]
                with torch.no_grad(), applied(model, hooks):
                    logits = adapter.forward_from_layer(resid.expand(len(chunk), -1, -1).contiguous(), layer)
                logp.append(torch.log_softmax(logits.to(torch.float64), dim=-1).cpu())  # [chunk, n, vocab]
            logp = torch.cat(logp)
            for c in members:
                loglik = logp[:, torch.arange(n), torch.tensor(choices[c])].sum(-1).tolist()
                s = np.asarray(choice_scores(loglik, [n] * len(loglik), normalize))
                scores[:, li, :, c] = s[which].reshape(n_m, n_k)
            w = which.reshape(n_m, n_k)
            same &= (w[:, None, :] == w[None, :, :]).all(-1)
        del cache
    return scores, same


# ---------------------------------------------------------------------------------------------
# Statistics


@dataclass
class MCResult:
    """What :func:`run_multiple_choice` found; :meth:`summary` is the JSON record."""

    settings: MCSettings
    layers: tuple[int, ...]
    questions: pd.DataFrame  # one row per question: clean columns, per-condition margins, drops
    tasks: pd.DataFrame  # eligibility per task
    metrics: pd.DataFrame  # mean margin drop per metric [CI]
    pairs: pd.DataFrame
    n_masked: int  # questions masked (those of the eligible tasks)

    def summary(self) -> dict:
        s = self.settings
        tasks = self.tasks.to_dict(orient="records")
        return dict(
            scoring=SCORING[s.normalize],
            outcome="answer_margin_drop",
            direction="comprehensiveness",
            ranking="query",
            removed_per_query="ceil(k * n) of the query's n (head, source) terms",
            layers=list(self.layers),
            fractions=list(s.fractions),
            metrics=list(s.metrics),
            n_questions=int(len(self.questions)),
            n_questions_by_task={t["task"]: int(t["n_questions"]) for t in tasks},
            tasks=tasks,
            eligible_tasks=[t for t in tasks if t["eligible"]],
            excluded_tasks=[t for t in tasks if not t["eligible"]],
            eligibility="clean accuracy 95% percentile bootstrap CI over questions entirely above chance (mean 1/#choices)"
            + ("" if s.mask_tasks == "eligible" else "; reported only, every task of the set is masked"),
            n_questions_masked=int(self.n_masked),
            bootstrap="task-stratified over questions",
            n_boot=int(s.n_boot),
            seed=int(s.seed),
            alpha=float(s.alpha),
            multiple_comparison="holm",
            metric_drops=self.metrics.to_dict(orient="records"),
            pairs=self.pairs.to_dict(orient="records"),
        ) | ({"tasks_used": [t["task"] for t in tasks]} if s.mask_tasks == "all" else {})


def run_multiple_choice(
    model,
    questions: Sequence[Question],
    settings: MCSettings = MCSettings(),
    *,
    masks: bool = True,
    checkpoint: MCCheckpoint | None = None,
    chunk_size: int = 16,
    progress: bool = False,
) -> MCResult:
    """Clean scoring and eligibility of every task, then (``masks``) masking of the eligible tasks'
    questions, margin drops and the Holm family of :attr:`MCSettings.pairs`.

    ``checkpoint`` keeps every question's record and is saved after each new one; records already
    in it (a resumed run) are reused, once the checkpoint's weights are checked against ``model``'s
    (:meth:`~geolens.faithfulness.mc_checkpoint.MCCheckpoint.check_writer`). Questions are keyed by
    task and index within the task.
    """
    ckpt = checkpoint if checkpoint is not None else MCCheckpoint(None, settings.fingerprint())
    ckpt.check_writer(model)  # other weights than the checkpoint's: refused before any question
    layers = settings.layers(model.cfg.n_layers)
    metrics = settings.metrics
    seen: dict[str, int] = {}
    keyed = []
    for q in questions:
        keyed.append((question_key(q, seen.get(q.task, 0)), seen.get(q.task, 0), q))
        seen[q.task] = seen.get(q.task, 0) + 1
    if not keyed:
        raise ValueError("no questions to score")

    def clean(q, qid):
        ll, lengths = choice_logliks(model, q)
        return dict(
            question_row(q, qid, ll, lengths, settings.normalize), scores=choice_scores(ll, lengths, settings.normalize)
        )

    rows = []
    for key, qid, q in tqdm(keyed, desc="multiple choice, clean", disable=not progress):
        row, new = keep_record(ckpt.clean, key, question_sha(q), lambda: clean(q, qid))
        if new:
            ckpt.save()
        rows.append(row)
    table = pd.DataFrame(rows).drop(columns=["sha"])
    tasks = eligibility(table, n_boot=settings.n_boot, seed=settings.seed)
    table["clean_scores"] = [";".join(f"{x:.6g}" for x in s) for s in table.pop("scores")]
    eligible = set(tasks.task if settings.mask_tasks == "all" else tasks.task[tasks.eligible])
    todo = [(i, key, q) for i, (key, _, q) in enumerate(keyed) if q.task in eligible] if masks else []
    drops = {m: np.full(len(keyed), np.nan) for m in metrics}
    margins = {}
    identical = np.ones((len(metrics), len(metrics)), dtype=bool)
    for i, key, q in tqdm(todo, desc="multiple choice, masked", disable=not progress):

        def compute(q=q):
            s, same = masked_scores(
                model, q, layers, metrics, settings.fractions, normalize=settings.normalize, chunk_size=chunk_size
            )
            return dict(scores=s.tolist(), same=same.tolist())

        rec, new = keep_record(ckpt.masked, key, question_sha(q), compute)
        if new:
            ckpt.save()
        s = np.asarray(rec["scores"], dtype=np.float64)  # [metric, layer, k, choice]
        identical &= np.asarray(rec["same"], dtype=bool)
        m = s[..., q.answer] - np.delete(s, q.answer, axis=-1).max(-1)  # answer margins [metric, layer, k]
        for mi, name in enumerate(metrics):
            drops[name][i] = float(table.margin.iloc[i] - m[mi].mean())
            for li, layer in enumerate(layers):
                for ki, k in enumerate(settings.fractions):
                    margins.setdefault(f"margin:{name}:L{layer}:k{k:g}", np.full(len(keyed), np.nan))[i] = m[mi, li, ki]
    if todo:
        table = pd.concat(
            [table, pd.DataFrame(margins), pd.DataFrame({f"margin_drop:{m}": v for m, v in drops.items()})], axis=1
        )
    idx = [i for i, _, _ in todo]
    same = {(a, b) for a, b in settings.pairs if identical[metrics.index(a), metrics.index(b)]}
    if idx:
        unit_tasks = table.task.to_numpy()[idx]
        pairs = pair_tests(
            {m: v[idx] for m, v in drops.items()},
            unit_tasks,
            settings.pairs,
            identical=same,
            n_boot=settings.n_boot,
            seed=settings.seed,
            alpha=settings.alpha,
        )
        metric_rows = _metric_drops({m: v[idx] for m, v in drops.items()}, unit_tasks, settings)
    else:
        pairs, metric_rows = pd.DataFrame(), pd.DataFrame()
    return MCResult(settings, layers, table, tasks, metric_rows, pairs, len(idx))


def _metric_drops(drops: Mapping[str, np.ndarray], tasks: np.ndarray, settings: MCSettings) -> pd.DataFrame:
    """Mean margin drop per metric with its 95% interval on the pairs' stratified resamples."""
    idx = stratified_indices(tasks, settings.n_boot, settings.seed)
    by_task = {str(t): int((tasks == t).sum()) for t in dict.fromkeys(tasks.tolist())}
    rows = []
    for m, d in drops.items():
        lo, hi = percentile_ci(resample_means(d, idx), 0.95)
        rows.append(
            dict(
                metric=m,
                margin_drop=float(np.mean(d)),
                ci_low=float(lo),
                ci_high=float(hi),
                n_questions=int(len(d)),
                n_questions_by_task=by_task,
            )
        )
    return pd.DataFrame(rows)


def seed_from_records(protocol: MCProtocol | None, model_name: str, out: Path) -> str | None:
    """Copy the stored per-question records that ``protocol`` names for ``model_name``
    (``multiple_choice.records``, protocol 3's re-analysis) into ``out`` as its checkpoint, after
    checking their SHA-256, unless ``out`` already holds a checkpoint; returns the path copied
    (None when the protocol names no records for this model or the checkpoint exists).
    ValueError in one line when the records are missing or changed."""
    entry = (protocol.records if protocol is not None else {}).get(model_name)
    target = Path(out) / CHECKPOINT
    if not entry or target.exists():
        return None
    source = Path(entry["path"])
    if not source.is_file():
        raise ValueError(f"the protocol's records for {model_name}, {source}, do not exist")
    data = source.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry["sha256"]:
        raise ValueError(f"{source} has SHA-256 {digest[:16]}…, not the protocol's {entry['sha256'][:16]}…")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return str(source)


def labelled(summary: dict, protocol: MCProtocol | None, differences: Sequence[str]) -> dict:
    """``summary`` with ``protocol_version``, ``protocol_sha256``, ``label`` and ``differences``
    (:func:`geolens.preregistration.preregistration`: ``pre-registered`` when the protocol's files
    are the registered ones and the run has no difference from it, else ``exploratory`` with the
    reasons) and the whole ``preregistration`` record. An exploratory run decides nothing
    (PROTOCOL.md): its pairs keep estimates, intervals and p-values, and their verdict is
    ``not decided (exploratory)`` (:func:`geolens.preregistration.withhold_verdicts`)."""
    pre = protocol.preregistered if protocol is not None else None
    if protocol is None:
        registration = preregistration(None)
        registration["reasons"] = ["not run under a pre-registered protocol (--protocol)"]
    else:
        registration = preregistration(pre, differences)
    label = registration["status"]
    if protocol is not None and protocol.source:
        summary = dict(summary, source=protocol.source, records=protocol.records)
    out = dict(
        protocol_version=pre.version if pre else None,
        protocol_sha256=pre.sha256 if pre else None,
        label=label,
        differences=registration["reasons"],
        preregistration=registration,
        **summary,
    )
    if label != "pre-registered":
        out["pairs"] = withhold_verdicts(out["pairs"])
        out["note"] = "exploratory: " + "; ".join(registration["reasons"]) + ", so no verdict is given"
    return out


__all__ = [
    "CHECKPOINT",
    "DEFAULT_PAIRS",
    "MCCheckpoint",
    "MCProtocol",
    "MCResult",
    "MCSettings",
    "SCORING",
    "differences",
    "eligibility",
    "labelled",
    "masked_scores",
    "mc_protocol",
    "pair_tests",
    "question_key",
    "question_sha",
    "run_multiple_choice",
    "seed_from_records",
    "stratified_indices",
]
