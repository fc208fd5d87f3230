"""Bring your own metric: score any term-level attribution method against the per-term ground truth
with protocol 3's statistics (docs/faithfulness/v3/PROTOCOL.md; the guide is docs/evaluate.md).

:func:`evaluate_attribution` measures, for a sample of (layer, query) positions of a few texts, the
exact effect of removing each attention term α_ij^h ṽ_j^h alone (its KL, in float64), and
correlates a method's scores of the same terms with those effects, per position:

- the **partial Spearman** correlation with the KL given the norm ‖α_ij^h ṽ_j^h‖ of the removed
  term (the primary statistic): the KL of a small removal is second order in that norm, so the
  plain correlation mostly ranks the norm; the partial asks what the method predicts beyond it;
- the plain Spearman correlation, the norm-matched strata, the resolvable terms, the top decile
  of the KLs and the signed endpoint (−Δ log p of the next token), as protocol 3's §7 defines them.

Nothing is re-implemented here: the positions and the per-term table come from
:func:`geolens.faithfulness.norm_controlled.norm_controlled_document` (positions drawn as protocol
3 draws them, ``numpy.random.default_rng([3, document_index])``), the per-position statistics from
:func:`~geolens.faithfulness.norm_controlled.statistics_table`, the intervals and the Holm family
from :mod:`geolens.stats`. The method's scores come from the metric registry
(:func:`geolens.register_metric`) and are read, like the protocol's, from the float64 model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import pandas as pd
from torch import Tensor

from geolens.adapter import model_mode
from geolens.faithfulness.effects_cache import effects_key, load_arrays, load_effects, save_arrays, save_effects
from geolens.faithfulness.method_scores import flat_caches, method_scores, stored_caches
from geolens.faithfulness.norm_controlled import ANALYSES, norm_controlled_document, statistics_table
from geolens.faithfulness.reference import check_norms, has_reference, layers_key, load_reference
from geolens.methods import Method, methods
from geolens.metrics import Metric, get_metric, mode_variant
from geolens.models import resolve_model
from geolens.per_term import float64_model
from geolens.stats import bootstrap_pvalue, cluster_bootstrap_indices, holm_family, percentile_ci, resample_means
from geolens.validation import checked_text_tokens, weights_fingerprint

REFERENCES = ("value_weighted", "raw_attention")
"""The reference rows of every evaluation: value-weighted attention (the norm itself: its partial is
0 by construction) and raw attention α."""
ROLES = ("method",) + REFERENCES
# statistics_table scores protocol 3's metrics from a terms table. The ``random`` metric's column
# passes unchanged through every analysis (no |·|, no sign: PROTOCOL.md §4, §7), so the method's
# scores ride in it and its statistics are the ones the protocol computes for any metric.
_CARRIER = "random"
LEE_WINDOWS = {"seq_len": 128, "min_document_tokens": 127}  # protocol 3's windows (PROTOCOL.md §1)
LEE_QUERIES = (8, 126)  # protocol 3's query range (PROTOCOL.md §2)


@dataclass
class AttributionEvaluation:
    """What :func:`evaluate_attribution` measured: per position, and as means with intervals.

    Attributes:
        method: the evaluated method's name (``mode``: the output o_i its inputs used).
        model_name: the model's name.
        summary: one row per (analysis, metric): ``mean`` over positions with its 95 % percentile
            interval from the document-cluster bootstrap (``ci_low``, ``ci_high``), ``n_positions``,
            ``n_documents``, ``n_excluded_positions``; ``role`` is ``"method"`` or ``"reference"``.
        differences: one row per (analysis, reference): Δ = mean(method) − mean(reference) on the
            same resamples. For the primary analysis (``norm_controlled``) the two differences form
            one Holm family (``p_adj``, the interval at the test's Holm level, ``verdict``); the
            others have plain 95 % intervals and decide nothing (``verdict`` ``"exploratory"``).
        positions: one row per drawn position (document, position, layer, query, its terms, its
            numerical floor, ...) and the method's value of each analysis (NaN: excluded there).
        statistics: one row per (document, position, analysis, metric) with its ``value``.
        terms: every term of every position: its KL, Δ log p(next), ``norm`` ‖α ṽ‖, the method's
            ``score`` and protocol 3's metrics' scores.
        n_boot: the bootstrap's resamples.
        seed: the bootstrap's seed.
        alpha: the Holm family's α.
        settings: the sample (documents, positions, terms, query ranges, how positions were drawn).

    >>> import geolens
    >>> from geolens.testing import tiny_bridge
    >>> texts = ["the cat sat on the mat.", "a dog ran far away!"]
    >>> result = geolens.evaluate_attribution("contribution_abs", tiny_bridge("gqa"), texts, n_boot=50)
    >>> result.method, len(result.positions), result.differences[["a", "b"]].iloc[0].tolist()  # 2 positions a text
    ('contribution_abs', 4, ['value_weighted', 'contribution_abs'])
    """

    method: str
    model_name: str
    mode: str
    summary: pd.DataFrame
    differences: pd.DataFrame
    positions: pd.DataFrame
    statistics: pd.DataFrame
    terms: pd.DataFrame
    n_boot: int
    seed: int
    alpha: float
    settings: dict = field(default_factory=dict)

    def to_dataframe(self) -> pd.DataFrame:
        """The summary table: one row per (analysis, metric), the method's rows first."""
        return self.summary.copy()

    def row(self, analysis: str = "norm_controlled", metric: str | None = None) -> dict:
        """One summary row as a dict (default: the method's mean partial Spearman)."""
        if analysis not in ANALYSES:
            raise ValueError(f"analysis must be one of {', '.join(ANALYSES)}, got {analysis!r}")
        role = "method" if metric in (None, self.method) else "reference"
        part = self.summary[(self.summary.analysis == analysis) & (self.summary.role == role)]
        if role == "reference":
            part = part[part.metric == metric]
            if part.empty:
                raise ValueError(f"metric must be {self.method!r} or one of {', '.join(REFERENCES)}, got {metric!r}")
        return part.iloc[0].to_dict()

    @property
    def partial(self) -> float:
        """The method's mean partial Spearman correlation with the KL given the norm."""
        return float(self.row()["mean"])

    def _lines(self) -> list[str]:
        s = self.settings
        head = (
            f"{self.method} on {self.model_name}: {s.get('n_positions')} positions of {s.get('n_documents')} "
            f"documents, {s.get('n_terms')} terms, float64 effects"
        )
        lines = [head, "mean partial Spearman with the KL given ||alpha v~|| [95% CI]:"]
        for r in self._rows("norm_controlled"):
            lines.append(f"  {r['metric']:<22} {_ci(r)}")
        for d in self.differences[self.differences.analysis == "norm_controlled"].itertuples():
            ci = "" if np.isnan(d.ci_low) else f" [{d.ci_low:+.3f}, {d.ci_high:+.3f}]"
            lines.append(f"  {d.b} - {d.a}: {d.estimate:+.3f}{ci} {d.verdict} (Holm)")
        lines.append(
            "plain Spearman (protocol 2's statistic): "
            + "; ".join(f"{r['metric']} {r['mean']:+.3f}" for r in self._rows("plain"))
        )
        return lines

    def _rows(self, analysis: str) -> list[dict]:
        return self.summary[self.summary.analysis == analysis].to_dict("records")

    def __repr__(self) -> str:
        return "AttributionEvaluation(" + "\n".join(self._lines()) + ")"

    def _repr_html_(self) -> str:
        frame = self.summary[self.summary.analysis.isin(["norm_controlled", "plain", "strata"])]
        table = frame.assign(value=[_ci(r) for r in frame.to_dict("records")]).pivot(
            index="metric", columns="analysis", values="value"
        )
        diffs = self.differences[self.differences.analysis == "norm_controlled"]
        return (
            f"<p><b>{self._lines()[0]}</b></p>"
            + table.reindex([self.method, *REFERENCES]).to_html(escape=True)
            + diffs[["a", "b", "estimate", "ci_low", "ci_high", "p_adj", "verdict"]].to_html(index=False)
        )


def _ci(row: dict) -> str:
    if row["n_positions"] == 0:
        return "–"
    return f"{row['mean']:+.3f} [{row['ci_low']:+.3f}, {row['ci_high']:+.3f}]"


# ---------------------------------------------------------------------------------------------
# Arguments


def term_level_methods() -> tuple[str, ...]:
    """The registered methods with a score per (head, query, key) term: the head-level metrics.

    >>> "contribution" in term_level_methods(), "alti" in term_level_methods()
    (True, False)
    """
    return tuple(m.name for m in methods("head") if m.family == "metric")


def _check_method(method, mode: str | None) -> tuple[Metric, str, str]:
    """(metric, mode, name) of a registered term-level method; a one-line ValueError otherwise."""
    allowed = term_level_methods()
    if isinstance(method, Method):
        name, key = method.name, method.key if method.family == "metric" else None
    elif isinstance(method, str):
        name = key = method
    elif callable(method):  # a metric's fn, unregistered: LayerInputs -> [batch, head, query, key]
        label = getattr(method, "__name__", type(method).__name__)
        name = label if label.isidentifier() else "callable"  # a lambda is "callable"
        return Metric(name=name, label=label, fn=method), mode or "inter", name
    else:
        raise ValueError(f"method must be a method name or a geolens Method, got {type(method).__name__}")
    qualified = mode_variant(name) if key not in allowed else None
    if qualified is not None:  # e.g. "output_normalized_intra": a metric in one mode
        metric, named_mode = qualified
        if mode is not None and mode != named_mode:
            raise ValueError(f"method {name!r} names mode {named_mode!r}, but mode={mode!r} was passed")
        mode = named_mode
        if metric.name not in allowed:
            key = None
    elif key in allowed:
        metric = get_metric(key)
    else:
        key = None
    if key is None:
        raise ValueError(
            f"method {name!r} has no term-level scores (one per head, query and key): choose one of "
            f"{', '.join(allowed)} (or register one with geolens.register_metric)"
        )
    if mode is None:
        mode = "inter"
    if mode not in ("inter", "intra"):
        raise ValueError(f"mode must be 'inter' or 'intra', got {mode!r}")
    return metric, mode, name


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _documents(model, texts, tokens, n_documents: int) -> list[Tensor]:
    """One unpadded window ``[1, pos]`` per document: the texts (BOS prepended), the rows of
    ``tokens``, or protocol 3's windows of the first ``n_documents`` Lee documents."""
    if texts is not None and tokens is not None:
        raise ValueError("pass texts or tokens, not both")
    if tokens is not None:
        rows = list(tokens) if isinstance(tokens, (list, tuple)) else [tokens]
        out = []
        for row in rows:
            if not isinstance(row, Tensor) or row.dtype.is_floating_point or row.ndim not in (1, 2):
                raise ValueError("tokens must be an integer tensor [pos] or [n, pos] (one unpadded text a row)")
            out += [r[None] for r in (row[None] if row.ndim == 1 else row)]
        return [r.cpu() for r in out]
    if texts is None:
        from geolens.data import load_corpus
        from geolens.faithfulness.preregistered import protocol_windows

        spec = {"data": dict(LEE_WINDOWS, n_documents=n_documents)}
        windows, _ = protocol_windows(model, spec, load_corpus("lee"), n_documents=n_documents)
        return [w[None] for w in windows]
    texts = [texts] if isinstance(texts, str) else list(texts)
    if not texts or not all(isinstance(t, str) and t for t in texts):
        raise ValueError("texts must be a non-empty string or a list of non-empty strings")
    return [checked_text_tokens(model, t)[0].cpu() for t in texts]


def _queries(windows: list[Tensor], queries: tuple[int, int]) -> list[tuple[int, int]]:
    """Each window's query range: ``queries`` cut to the positions that have a next token."""
    lo, hi = (int(q) for q in queries)
    if not 0 <= lo <= hi:
        raise ValueError(f"queries must be (low, high) with 0 <= low <= high, got {queries!r}")
    out = []
    for d, w in enumerate(windows):
        n = int(w.shape[1])
        if n - 2 < lo:
            raise ValueError(f"document {d} has {n} tokens: a query from position {lo} on needs at least {lo + 2}")
        out.append((lo, min(hi, n - 2)))
    return out


# ---------------------------------------------------------------------------------------------
# The method's scores of the measured terms


# ---------------------------------------------------------------------------------------------
# Means, intervals and differences


def _summaries(stats: pd.DataFrame, name: str, n_boot: int, seed: int, alpha: float):
    """(summary rows, difference rows) of every analysis: the same document-cluster resamples
    for the method and the references within an analysis."""
    summary, diffs = [], []
    for analysis in ANALYSES:
        part = stats[stats.analysis == analysis]
        table = part.pivot(index=["document", "position"], columns="role", values="value")[list(ROLES)]
        kept = table.dropna(how="any")
        n_excl = int(len(table) - len(kept))
        docs = kept.index.get_level_values("document").to_numpy()
        nan = float("nan")
        if len(kept):
            boot = resample_means(kept.to_numpy(), cluster_bootstrap_indices(docs, n_boot, seed))
            lo, hi = percentile_ci(boot, 0.95)
        for k, role in enumerate(ROLES):
            summary.append(
                dict(
                    analysis=analysis,
                    metric=name if role == "method" else role,
                    role="method" if role == "method" else "reference",
                    mean=float(kept[role].mean()) if len(kept) else nan,
                    ci_low=float(lo[k]) if len(kept) else nan,
                    ci_high=float(hi[k]) if len(kept) else nan,
                    n_positions=int(len(kept)),
                    n_documents=int(len(np.unique(docs))),
                    n_excluded_positions=n_excl,
                )
            )
        if not len(kept):
            continue
        estimates = [float(kept["method"].mean() - kept[r].mean()) for r in REFERENCES]
        samples = [boot[:, 0] - boot[:, 1 + k] for k in range(len(REFERENCES))]
        testable = [not np.array_equal(kept["method"].to_numpy(), kept[r].to_numpy()) for r in REFERENCES]
        if analysis == "norm_controlled":
            tests = [t._asdict() for t in holm_family(estimates, samples, testable=testable, alpha=alpha)]
        else:
            tests = []
            for est, sample, ok in zip(estimates, samples, testable):
                lo_d, hi_d = percentile_ci(sample, 0.95) if ok else (nan, nan)
                p = bootstrap_pvalue(sample) if ok else nan
                tests.append(
                    dict(estimate=est, ci_low=float(lo_d), ci_high=float(hi_d), level=0.95 if ok else nan, p=p)
                )
                tests[-1].update(p_adj=nan, verdict="exploratory" if ok else "not testable")
        for ref, test in zip(REFERENCES, tests):
            keep = ("estimate", "ci_low", "ci_high", "level", "p", "p_adj", "verdict")
            diffs.append(
                dict(analysis=analysis, a=ref, b=name, n_positions=int(len(kept)), **{k: test[k] for k in keep})
            )
    return pd.DataFrame(summary), pd.DataFrame(diffs)


# ---------------------------------------------------------------------------------------------
# The entry point


def evaluate_attribution(
    method: str | Method | Sequence[str | Method],
    model,
    texts: str | Sequence[str] | None = None,
    *,
    tokens: Tensor | Sequence[Tensor] | None = None,
    n_documents: int | None = None,
    n_positions: int | None = None,
    queries: tuple[int, int] | None = None,
    mode: str | None = None,
    n_boot: int = 1000,
    seed: int = 0,
    alpha: float = 0.05,
    batch_size: int = 128,
    progress: bool | Callable[[str], object] | None = True,
    reference: bool = True,
    cache: bool = True,
) -> AttributionEvaluation | list[AttributionEvaluation]:
    """Score a term-level attribution method against the exact effect of removing each attention
    term, with protocol 3's statistics (docs/faithfulness/v3/PROTOCOL.md; guide: docs/evaluate.md).

    For ``n_positions`` (layer, query) positions per document, drawn as protocol 3 draws them
    (``numpy.random.default_rng([3, document_index])``: the layer uniform over the stack, the
    query uniform in ``queries``, cut to the document's length), every term α_ij^h ṽ_j^h with
    α ≠ 0 is removed alone and its KL(p ‖ p̃) at the next-token prediction of the query measured
    in float64 (the model is cast to float64 and computes its softmax and norms in float64 for
    the call; its dtypes are restored afterwards, also after an exception). Per position, the
    method's scores of those terms are correlated with the KLs: the partial Spearman correlation
    given the norm ‖α ṽ‖ (the primary statistic), and protocol 3's secondary analyses. Means over
    positions get 95 % intervals from the document-cluster bootstrap; value-weighted attention
    (the norm: its partial is 0 by construction) and raw attention are the reference rows, and
    the differences method − reference on the same resamples form one Holm family.

    Args:
        method: a registered metric with a score per (head, query, key) term
            (:func:`term_level_methods`: the head-level metrics of :func:`geolens.list_methods`,
            including any added with :func:`geolens.register_metric`), its name, a mode-qualified
            name (``"output_normalized_intra"``) or its :class:`~geolens.methods.Method`. Its
            scores are compared as they are (an ``absolute`` metric's as |·|), a larger score
            predicting a larger KL. A list of them is scored against the same effects, measured
            once: the result is then a list, one evaluation per method, in order.
        model: a loaded TransformerLens model, or a name :func:`geolens.load_model` accepts.
        texts: a text or a list of texts, one document each (BOS prepended). Default: for
            ``"smollm2-135m"`` and ``"gemma3-270m"``, the shipped reference set (protocol 3's
            published effects of its 100 documents, :mod:`geolens.faithfulness.reference`: only the
            method's scores are computed, one forward a document); for other models, protocol 3's
            windows of the first ``n_documents`` documents of the Lee corpus.
        tokens: instead of ``texts``: token ids ``[pos]`` or ``[n, pos]`` (one unpadded document a
            row, BOS included), or a list of them.
        n_documents: with the reference set, its first ``n_documents`` documents (default: all
            100); else how many Lee documents when neither ``texts`` nor ``tokens`` is given
            (default 10).
        n_positions: positions drawn per document (default 2; protocol 3: 2 for SmolLM2, 1 for
            Gemma 3). The reference set has its own: passing this with it is refused.
        queries: the range of query positions (inclusive) drawn from (default (8, 126); refused
            with the reference set, as ``n_positions``).
        mode: the output o_i the method's inputs use (``"inter"``, the layer's, by default, as
            protocol 3's contribution weights; or ``"intra"``, the head's).
        n_boot: the bootstrap's resamples (protocol 3: 10 000).
        seed: the bootstrap's seed (protocol 3: 0), also a per-sequence metric's (``random``).
        alpha: the Holm family's α.
        batch_size: removals per batched forward.
        progress: True (the default): a progress bar over the documents (tqdm, in a terminal and
            in Jupyter); False or None: nothing; a callable: called with a line after each document.
        reference: False: measure the effects on the Lee windows even for a model with a shipped
            reference set.
        cache: keep measured effects on disk and reuse them (:mod:`geolens.faithfulness.effects_cache`:
            one file per document under ``$GEOLENS_CACHE/effects``, keyed by the weights, the
            protocol, the tokens and the positions), so that a second metric costs only its scores.

    Returns:
        :class:`AttributionEvaluation` (``.summary``, ``.differences``, ``.positions``, ...).

    >>> import geolens
    >>> from geolens.testing import tiny_bridge
    >>> model = tiny_bridge("gqa")
    >>> texts = ["the cat sat on the mat.", "a dog ran far away!", "seven wizards judge boxing"]
    >>> result = geolens.evaluate_attribution("contribution_abs", model, texts, n_boot=200)
    >>> result.row(metric="value_weighted")["mean"]  # the norm itself: 0 by construction
    0.0
    >>> len(result.positions), next(model.parameters()).dtype  # 2 positions a text; dtype restored
    (6, torch.float32)
    """
    several = isinstance(method, (list, tuple))
    if several and not method:
        raise ValueError("method: give at least one method")
    checked = [_check_method(m, mode) for m in (method if several else [method])]
    names = [name for _, _, name in checked]
    if len(set(names)) != len(names):
        raise ValueError(f"method: each method once, got {names}")
    for value, name in ((n_documents, "n_documents"), (n_positions, "n_positions")):
        if value is not None:
            _positive_int(value, name)
    n_boot = _positive_int(n_boot, "n_boot")
    if not 0.0 < float(alpha) < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    model, model_name = resolve_model(model, "transformer_lens")  # a name is loaded once and kept
    if model_mode(model) == "hf":
        raise ValueError(
            "evaluate_attribution needs a TransformerLens model (float64 per-term effects): "
            "load it with geolens.load_model(name) (backend='transformer_lens')"
        )
    use_reference = bool(reference) and texts is None and tokens is None and has_reference(model_name)
    if use_reference:
        if n_positions is not None or queries is not None:
            raise ValueError(
                f"the {model_name} reference set has its own positions (protocol 3's): pass texts to draw "
                "n_positions and queries yourself, or reference=False to measure on the Lee windows"
            )
        ref = load_reference(model_name)
        ref = ref if n_documents is None else ref.subset(n_documents)
        windows = [ref.tokens[d][None] for d in range(ref.n_documents)]
        ranges = [tuple(LEE_QUERIES)] * len(windows)
        n_positions = int(ref.positions.groupby("document").size().max())
    else:
        n_documents = _positive_int(10 if n_documents is None else n_documents, "n_documents")
        n_positions = _positive_int(2 if n_positions is None else n_positions, "n_positions")
        windows = _documents(model, texts, tokens, n_documents)
        ranges = _queries(windows, LEE_QUERIES if queries is None else queries)
    device = next(model.parameters()).device
    weights = weights_fingerprint(model)  # of the model as given (its dtype), before the float64 cast
    stored = load_arrays(layers_key(weights, ref)) if use_reference and cache else None
    new: dict = {}
    all_terms, all_positions = [], []
    desc = "scoring the reference terms" if use_reference else "per-term effects (float64)"
    bar = None
    if progress is True:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(windows), desc=desc, unit="document")
    try:
        with float64_model(model):
            for d, (window, q) in enumerate(zip(windows, ranges)):
                window = window.to(device)
                if use_reference:
                    terms, positions = ref.terms[ref.terms.document == d].reset_index(drop=True), None
                else:
                    terms, positions = _effects(model, window, d, n_positions, q, batch_size, weights, cache)
                known = stored_caches(stored, d) if use_reference else None
                scores, norms, caches = method_scores(model, checked, window, terms, seed, known)
                if use_reference:  # the model the effects were measured on, or refused in one line
                    check_norms(model_name, norms, terms["norm"].to_numpy())
                    positions = ref.positions[ref.positions.document == d]
                    if known is None and cache:
                        new.update(flat_caches(d, caches))
                terms = terms.assign(**{f"{_CARRIER}{i}": x for i, x in enumerate(scores)})
                all_terms.append(terms)
                all_positions.append(positions)
                if bar is not None:
                    bar.update(1)
                elif callable(progress):
                    progress(f"document {d + 1}/{len(windows)}: {len(positions)} positions, {len(terms)} terms")
    finally:
        if bar is not None:
            bar.close()
    if new:  # the hook tensors of this call's new documents, beside those already cached
        save_arrays(layers_key(weights, ref), {**(stored or {}), **new})
    terms = pd.concat(all_terms, ignore_index=True)
    positions = pd.concat(all_positions, ignore_index=True)
    source = (
        f"the {model_name} reference set (protocol 3's published effects, geolens.faithfulness.reference)"
        if use_reference
        else "measured here" + (" (or read from the effects cache)" if cache else "")
    )
    common = (model, model_name, windows, ranges, n_positions, n_boot, seed, alpha, source)
    results = [
        _evaluation(terms, positions, i, name, method_mode, *common) for i, (_, method_mode, name) in enumerate(checked)
    ]
    return results if several else results[0]


def _effects(model, window, d, n_positions, queries, batch_size, weights, cache) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One document's measured ``(terms, positions)``: from the on-disk cache when it holds them
    (``cache``), else measured (:func:`norm_controlled_document`) and cached."""
    key = effects_key(weights, window, d, n_positions, queries, batch_size) if cache else None
    found = load_effects(key) if cache else None
    if found is not None:
        return found
    terms, positions = norm_controlled_document(
        model, window, d, n_positions=n_positions, queries=queries, batch_size=batch_size
    )
    if cache:
        save_effects(key, terms, positions)
    return terms, positions


def _evaluation(
    terms, positions, i, name, mode, model, model_name, windows, ranges, n_positions, n_boot, seed, alpha, source
):
    """One method's :class:`AttributionEvaluation` from the shared terms (its scores in column ``_CARRIER{i}``)."""
    carriers = [c for c in terms.columns if c.startswith(_CARRIER)]
    terms = terms.drop(columns=[c for c in carriers if c != f"{_CARRIER}{i}"]).rename(
        columns={f"{_CARRIER}{i}": _CARRIER}
    )
    stats = statistics_table(terms, positions, metrics=(_CARRIER, *REFERENCES))
    stats["role"] = stats.metric.where(stats.metric != _CARRIER, "method")
    stats["metric"] = stats.metric.where(stats.metric != _CARRIER, name)
    summary, differences = _summaries(stats, name, n_boot, int(seed), float(alpha))
    own = stats[stats.role == "method"].pivot(index=["document", "position"], columns="analysis", values="value")
    per_position = positions.merge(own[list(ANALYSES)].reset_index(), on=["document", "position"], how="left")
    return AttributionEvaluation(
        method=name,
        model_name=model_name,
        mode=mode,
        summary=summary,
        differences=differences,
        positions=per_position,
        statistics=stats.reset_index(drop=True),
        terms=terms.rename(columns={_CARRIER: "score"}),
        n_boot=n_boot,
        seed=int(seed),
        alpha=float(alpha),
        settings=dict(
            n_documents=len(windows),
            n_positions=int(len(positions)),
            n_terms=int(len(terms)),
            positions_per_document=n_positions,
            queries=[list(q) for q in ranges],
            position_rng="numpy.random.default_rng([3, document_index])",
            effects_dtype="float64",
            effects=source,
            model_mode=model_mode(model),
        ),
    )


__all__ = ["REFERENCES", "AttributionEvaluation", "evaluate_attribution", "float64_model", "term_level_methods"]
