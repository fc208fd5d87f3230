"""Protocol 3's per-term endpoint (docs/faithfulness/v3/PROTOCOL.md): what a metric predicts about
the effect of removing one attention term that the norm of the removed term does not.

Protocol 2 (:mod:`geolens.faithfulness.ground_truth`) scored each metric by its Spearman correlation
with the exact KL of removing each term α_ij^h ṽ_j^h. Value-weighted attention α‖ṽ‖ is the norm
n = ‖α_ij^h ṽ_j^h‖ of the removed vector and the KL of a small removal is second order in it, so
that correlation mostly ranks the norm. Here, per position (layer, query):

- every effect is measured in float64 (the model cast to float64 inside
  :func:`geolens.per_term.float64_exact`), with the position's numerical floor
  (:func:`geolens.per_term.numerical_floor`): a term is *resolvable* when its KL ≥ 10³ × floor;
- the outcomes are the KL (primary) and Δ log p of the actual next token (signed, and its magnitude);
- the primary statistic is the **partial Spearman** correlation of a metric with the KL given the
  norm (:func:`partial_spearman`), averaged over positions; value-weighted and output-normalised
  inter rank as the norm does, so theirs is 0 by construction.

:func:`norm_controlled_document` measures one document (every term of every position: its
``terms`` table; one row per position: ``positions``); :func:`position_statistics` gives each
analysis's per-position value of every metric; :func:`norm_controlled_summary` turns all of it into
per-metric means with document-cluster bootstrap intervals, the pre-registered pairs as one Holm
family (:func:`geolens.stats.holm_family`) and the exploratory analyses; :func:`norm_controlled_stage`
runs it under the protocol, resumable per document (:func:`geolens.resume.run_document_stage`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from geolens.faithfulness.ground_truth import MIN_TERMS, TERM_METRICS, _average_ranks, draw_positions, spearman
from geolens.stats import cluster_bootstrap_indices, holm_family, percentile_ci, resample_means

SEED = 3  # numpy.random.default_rng([3, document_index]) draws the positions (PROTOCOL.md §2)
DEGENERATE = 1e-12  # 1 − r² at or below this: the ranks are (anti-)identical
STORED = (
    "raw_attention",
    "norm",
    "output_normalized_intra",
    "output_normalized_inter",
    "contribution",
    "grad_x_act",
    "grad_x_act_next",
    "random",
)
"""The scores kept per term in ``per_term_terms.csv.gz``; value-weighted is ``norm`` and
|contribution| is derived."""
ANALYSES = (
    "norm_controlled",
    "plain",
    "strata",
    "resolvable_partial",
    "resolvable_plain",
    "top_decile_partial",
    "top_decile_plain",
    "signed_partial",
    "signed_plain",
    "magnitude_partial",
    "magnitude_plain",
)


# ---------------------------------------------------------------------------------------------
# The statistic


def _rank_corr(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a - a.mean(), b - b.mean()
    return float((a * b).sum() / np.sqrt((a * a).sum() * (b * b).sum()))


def partial_spearman(scores, effects, norm) -> float:
    """The partial Spearman correlation of ``scores`` with ``effects`` given ``norm``: rank all three
    (average ranks for ties), take the Pearson correlations of the ranks r_se, r_sn, r_en, and
    return (r_se − r_sn r_en) / √((1 − r_sn²)(1 − r_en²)).

    0.0 when the scores are constant or rank as the norm does (1 − r_sn² ≤ 10⁻¹²: nothing beyond
    the norm); NaN when the effects or the norm are constant or the effects rank as the norm does
    (undefined: the position is excluded).

    >>> n = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    >>> partial_spearman(n * 2, np.array([0.1, 0.3, 0.2, 0.5, 0.4]), n)  # ranks as the norm: 0
    0.0
    >>> round(partial_spearman(np.array([0.0, 1, 0, 1, 0]), np.array([1.0, 3, 2, 5, 4]), n), 3)
    0.962
    """
    s, e, n = (np.asarray(x, dtype=np.float64) for x in (scores, effects, norm))
    if np.ptp(e) == 0 or np.ptp(n) == 0:
        return float("nan")
    rn, re_ = _average_ranks(n), _average_ranks(e)
    r_en = _rank_corr(re_, rn)
    if 1.0 - r_en * r_en <= DEGENERATE:
        return float("nan")
    if np.ptp(s) == 0:
        return 0.0
    rs = _average_ranks(s)
    r_sn = _rank_corr(rs, rn)
    if 1.0 - r_sn * r_sn <= DEGENERATE:
        return 0.0
    r_se = _rank_corr(rs, re_)
    return float((r_se - r_sn * r_en) / np.sqrt((1.0 - r_sn * r_sn) * (1.0 - r_en * r_en)))


def strata_spearman(scores, effects, norm, n_strata: int = 5, min_terms: int = MIN_TERMS) -> float:
    """The plain Spearman correlation within strata of equal counts by the rank of ``norm`` (the
    last stratum takes the remainder), averaged over the strata with at least ``min_terms`` terms
    and unequal effects, weighted by their counts; NaN when no stratum qualifies.

    >>> n = np.arange(10.0)
    >>> strata_spearman(n, n, n, n_strata=2)
    1.0
    """
    s, e, n = (np.asarray(x, dtype=np.float64) for x in (scores, effects, norm))
    order = np.argsort(n, kind="stable")
    size = len(order) // n_strata
    if size == 0:
        return float("nan")
    total = weight = 0.0
    for k in range(n_strata):
        part = order[k * size : (k + 1) * size if k < n_strata - 1 else len(order)]
        if len(part) < min_terms or np.ptp(e[part]) == 0:
            continue
        total += len(part) * spearman(s[part], e[part])
        weight += len(part)
    return total / weight if weight else float("nan")


def metric_scores(terms: pd.DataFrame) -> dict[str, np.ndarray]:
    """Each metric's scores (KL orientation) from a ``terms`` table: value-weighted is the norm,
    |contribution| its absolute value, gradient × activation (top-1) by |·|."""
    scores = {m: terms[m].to_numpy(np.float64) for m in TERM_METRICS if m in terms and m != "grad_x_act"}
    scores["value_weighted"] = terms["norm"].to_numpy(np.float64)
    scores["contribution_abs"] = np.abs(terms["contribution"].to_numpy(np.float64))
    scores["grad_x_act"] = np.abs(terms["grad_x_act"].to_numpy(np.float64))
    return {m: scores[m] for m in TERM_METRICS}


def position_statistics(terms: pd.DataFrame, floor: float, *, resolvable_factor: float = 1e3) -> dict:
    """``{analysis: {metric: value}}`` of one position's ``terms`` (PROTOCOL.md §5, §7); NaN where
    the position is excluded from that analysis (fewer than 5 terms, constant effects, ...)."""
    scores = metric_scores(terms)
    kl = terms["kl"].to_numpy(np.float64)
    norm = terms["norm"].to_numpy(np.float64)
    dlogp = terms["delta_logp_next"].to_numpy(np.float64)
    signed = dict(scores, grad_x_act=-terms["grad_x_act_next"].to_numpy(np.float64))
    magnitude = dict(scores, grad_x_act=np.abs(terms["grad_x_act_next"].to_numpy(np.float64)))
    nan = float("nan")

    def both(name: str, keep: np.ndarray | None, table: dict, effect: np.ndarray) -> dict:
        sel = np.ones(len(effect), bool) if keep is None else keep
        out = {f"{name}_partial": {}, f"{name}_plain": {}}
        ok = sel.sum() >= MIN_TERMS and np.ptp(effect[sel]) > 0
        for m, s in table.items():
            out[f"{name}_partial"][m] = partial_spearman(s[sel], effect[sel], norm[sel]) if ok else nan
            out[f"{name}_plain"][m] = spearman(s[sel], effect[sel]) if ok else nan
        return out

    enough = len(kl) >= MIN_TERMS and np.ptp(kl) > 0
    result = {
        "norm_controlled": {m: partial_spearman(s, kl, norm) if enough else nan for m, s in scores.items()},
        "plain": {m: spearman(s, kl) if enough else nan for m, s in scores.items()},
        "strata": {m: strata_spearman(s, kl, norm) if enough else nan for m, s in scores.items()},
    }
    result.update(both("resolvable", kl >= resolvable_factor * floor, scores, kl))
    top = kl >= np.quantile(kl, 0.9) if len(kl) else np.zeros(0, bool)
    result.update(both("top_decile", top, scores, kl))
    result.update(both("signed", None, signed, -dlogp))
    result.update(both("magnitude", None, magnitude, np.abs(dlogp)))
    return result


# ---------------------------------------------------------------------------------------------
# Measuring one document


def norm_controlled_document(
    model,
    tokens: torch.Tensor,
    document_index: int,
    *,
    n_positions: int = 2,
    queries: tuple[int, int] = (8, 126),
    batch_size: int = 128,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(terms, positions)`` of one window ``[1, pos]`` (PROTOCOL.md §2-4): every term of every
    drawn position (document, position, layer, query, head, source, KL, Δ log p(next), the norm
    and the scores of :data:`STORED`), and one row per position (its floors, counts, the next
    token, the clean top-1 probability). The model should be float64 inside
    :func:`geolens.per_term.float64_exact` (:func:`norm_controlled_stage` does that); the metrics'
    inputs are read in the model's dtype."""
    from geolens.adapter import adapter_for, get_attention_layer, names_filter
    from geolens.faithfulness.ground_truth import term_scores
    from geolens.metrics import LayerInputs
    from geolens.per_term import _state_dtype, position_effects

    if tokens.ndim != 2 or tokens.shape[0] != 1:
        raise ValueError(f"tokens must be one window [1, pos], got shape {tuple(tokens.shape)}")
    n_pos = tokens.shape[1]
    if not 0 <= queries[0] <= queries[1] < n_pos - 1:
        raise ValueError(f"queries {queries} do not fit a window of {n_pos} tokens (each needs a next token)")
    drawn = draw_positions(document_index, model.cfg.n_layers, n_positions, queries, seed=SEED)
    layers = sorted({l for l, _ in drawn})
    adapter = adapter_for(model)
    wanted = names_filter(model, layers)
    resid = {adapter.resid_pre_hook(l) for l in layers}
    dtype = _state_dtype(model)
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens, names_filter=lambda name: wanted(name) or name in resid)
        kv = adapter.prefix_kv_cache(tokens)
        inputs = {}
        for l in layers:
            view = get_attention_layer(model, cache, l, dtype=dtype)
            inputs[l] = (LayerInputs.from_layer(view, "inter"), LayerInputs.from_layer(view, "intra"))
    measured = {}
    terms, positions = [], []
    for p, (l, q) in enumerate(drawn):
        target = int(tokens[0, q + 1])
        if (l, q) not in measured:
            measured[(l, q)] = position_effects(
                model,
                tokens,
                l,
                q,
                clean_run=(logits, cache),
                kv_cache=kv,
                outcome=("kl",),
                batch_size=batch_size,
                target=target,
                scopes=("term",),
            )
        e = measured[(l, q)]
        scores = term_scores(*inputs[l], e, np.random.default_rng([SEED, int(document_index), p, 1]))
        ran = e.term.ran.numpy()
        heads, sources = np.nonzero(ran)
        frame = pd.DataFrame(
            dict(
                document=int(document_index),
                position=p,
                layer=l,
                query=q,
                head=heads,
                source=sources,
                kl=e.term.kl.numpy()[ran],
                delta_logp_next=e.term.delta_logp_target.numpy()[ran],
                norm=scores["value_weighted"][ran],
                raw_attention=scores["raw_attention"][ran],
                output_normalized_intra=scores["output_normalized_intra"][ran],
                output_normalized_inter=scores["output_normalized_inter"][ran],
                contribution=scores["contribution"][ran],
                grad_x_act=e.grad_x_act.numpy()[ran],
                grad_x_act_next=e.grad_x_act_target.numpy()[ran],
                random=scores["random"][ran],
            )
        )
        terms.append(frame)
        kl = frame.kl.to_numpy()
        positions.append(
            dict(
                document=int(document_index),
                position=p,
                layer=l,
                query=q,
                n_terms=len(frame),
                next_token=target,
                clean_top_prob=e.term.clean_prob,
                floor=e.term.floor,
                reference_kl=e.term.reference_kl,
                floor_delta_logp_next=e.term.target_floor,
                kl_max=float(kl.max()) if len(kl) else 0.0,
                kl_min=float(kl.min()) if len(kl) else 0.0,
                kl_sum=float(kl.sum()),
                n_resolvable=int((kl >= 1e3 * (e.term.floor or 0.0)).sum()),
            )
        )
    return pd.concat(terms, ignore_index=True), pd.DataFrame(positions)


# ---------------------------------------------------------------------------------------------
# Summary


def statistics_table(terms: pd.DataFrame, positions: pd.DataFrame, *, resolvable_factor: float = 1e3) -> pd.DataFrame:
    """One row per (document, position, analysis, metric) with its ``value`` (:func:`position_statistics`)."""
    floors = positions.set_index(["document", "position"])["floor"]
    rows = []
    for (d, p), part in terms.groupby(["document", "position"], sort=True):
        ids = positions[(positions.document == d) & (positions.position == p)].iloc[0]
        stats = position_statistics(part, float(floors.loc[(d, p)]), resolvable_factor=resolvable_factor)
        for analysis, values in stats.items():
            for metric, value in values.items():
                rows.append(
                    dict(
                        document=int(d),
                        position=int(p),
                        layer=int(ids.layer),
                        analysis=analysis,
                        metric=metric,
                        value=value,
                    )
                )
    return pd.DataFrame(rows)


def _means(table: pd.DataFrame, clusters, n_boot: int, seed: int):
    """Per-metric means of ``table`` (positions × metrics, no NaN) and their bootstrap samples."""
    indices = cluster_bootstrap_indices(clusters, n_boot, seed)
    return table.mean().to_numpy(), resample_means(table.to_numpy(), indices)


def _metric_entries(table: pd.DataFrame, boot: np.ndarray, n_excluded: int, extra: dict | None = None) -> list[dict]:
    lo, hi = percentile_ci(boot, 0.95)
    docs = table.index.get_level_values("document")
    return [
        dict(
            **(extra or {}),
            metric=m,
            mean=float(table[m].mean()),
            ci_low=float(lo[k]),
            ci_high=float(hi[k]),
            n_positions=int(len(table)),
            n_documents=int(docs.nunique()),
            n_excluded_positions=int(n_excluded),
        )
        for k, m in enumerate(table.columns)
    ]


def _pivot(stats: pd.DataFrame, analysis: str) -> tuple[pd.DataFrame, int]:
    part = stats[stats.analysis == analysis]
    table = part.pivot(index=["document", "position"], columns="metric", values="value")
    table = table[[m for m in TERM_METRICS if m in table.columns]]
    kept = table.dropna(how="any")
    return kept, int(len(table) - len(kept))


def _not_testable(settings: dict) -> set[tuple[str, str]]:
    return {tuple(e["pair"]) for e in settings.get("not_testable_by_construction", [])}


def norm_controlled_summary(terms: pd.DataFrame, positions: pd.DataFrame, settings: dict) -> dict:
    """``per_term_effects`` of a protocol-3 run (PROTOCOL.md §5-7, §10) from its ``terms`` and
    ``positions`` tables and the protocol's twin ``settings``."""
    st = settings["statistics"]
    n_boot, seed, alpha = int(st["n_boot"]), int(st["seed"]), float(st["alpha"])
    factor = float(settings["numerical_floor"]["resolvable_factor"])
    pairs = [tuple(p) for p in settings["pairs"]]
    stats = statistics_table(terms, positions, resolvable_factor=factor)

    # primary: the partial Spearman given the norm, one Holm family
    table, n_excl = _pivot(stats, "norm_controlled")
    docs = table.index.get_level_values("document").to_numpy()
    _, boot = _means(table, docs, n_boot, seed)
    columns = list(table.columns)
    zero = set(settings["primary"].get("zero_by_construction", []))
    tests, entries = [], []
    for a, b in pairs:
        ka, kb = columns.index(a), columns.index(b)
        both_zero = a in zero and b in zero
        entry = dict(endpoint="per_term_norm_controlled", outcome="kl", a=a, b=b, n_positions=int(len(table)))
        entry["n_documents"] = int(len(np.unique(docs)))
        tests.append((float(table[b].mean() - table[a].mean()), boot[:, kb] - boot[:, ka], not both_zero))
        entries.append(entry)
    decided = holm_family([t[0] for t in tests], [t[1] for t in tests], testable=[t[2] for t in tests], alpha=alpha)
    family = []
    for entry, result in zip(entries, decided):
        values = {k: (None if isinstance(v, float) and np.isnan(v) else v) for k, v in result._asdict().items()}
        family.append(dict(entry, **values))
    not_testable = [
        dict(a=e["pair"][0], b=e["pair"][1], verdict="not testable", why=e["why"])
        for e in settings.get("not_testable_by_construction", [])
    ]
    claimed = [family[i] for i in settings.get("claimed_order_pairs", [])]
    verdicts = [p["verdict"] for p in claimed]
    norm_controlled = dict(
        statistic="mean over positions of the partial Spearman correlation with the KL given ||alpha v~||",
        metrics=_metric_entries(table, boot, n_excl),
        zero_by_construction=sorted(zero),
        pairs=family,
        not_testable=not_testable,
        not_formed=settings.get("not_formed", []),
        claimed_order_beyond_norm=(
            "holds" if verdicts and all(v == "holds" for v in verdicts) else "does not hold" if verdicts else None
        ),
        n_boot=n_boot,
        seed=seed,
        multiple_comparison="holm",
    )

    def exploratory(analysis: str, with_pairs: bool = False) -> dict:
        t, excl = _pivot(stats, analysis)
        if t.empty:
            return dict(metrics=[], n_positions=0, n_excluded_positions=excl)
        d = t.index.get_level_values("document").to_numpy()
        _, b = _means(t, d, n_boot, seed)
        out = dict(metrics=_metric_entries(t, b, excl), n_positions=int(len(t)), n_excluded_positions=excl)
        if with_pairs:
            cols = list(t.columns)
            out["pairs"] = []
            for a, bb in pairs:
                delta = b[:, cols.index(bb)] - b[:, cols.index(a)]
                lo, hi = percentile_ci(delta, 0.95)
                out["pairs"].append(
                    dict(a=a, b=bb, estimate=float(t[bb].mean() - t[a].mean()), ci_low=float(lo), ci_high=float(hi))
                )
            out["note"] = "exploratory: 95% CIs, no family, no verdict"
        return out

    share = (
        terms.kl.to_numpy() >= factor * terms.merge(positions, on=["document", "position"]).floor.to_numpy()
    ).mean()
    resolvable = {
        "factor": factor,
        "share_of_terms": float(share),
        "n_terms": int(len(terms)),
        "partial": exploratory("resolvable_partial"),
        "plain": exploratory("resolvable_plain"),
    }
    per_layer = _per_layer(stats, n_boot, seed, int(positions.layer.max()) + 1 if len(positions) else 0, settings)
    floors = positions.floor.to_numpy(np.float64)
    q = np.quantile(floors, [0.0, 0.5, 0.9, 1.0]) if len(floors) else [np.nan] * 4
    return dict(
        outcome="kl",
        effects_dtype="float64",
        n_positions=int(len(positions)),
        n_documents=int(positions.document.nunique()),
        n_terms=int(len(terms)),
        norm_controlled=norm_controlled,
        pairs=family,
        plain=exploratory("plain", with_pairs=True),
        strata=exploratory("strata"),
        resolvable=resolvable,
        top_decile=dict(partial=exploratory("top_decile_partial"), plain=exploratory("top_decile_plain")),
        signed=dict(
            outcome="-delta_logp_next (the drop of log p of the actual next token)",
            partial=exploratory("signed_partial"),
            plain=exploratory("signed_plain"),
            magnitude=dict(partial=exploratory("magnitude_partial"), plain=exploratory("magnitude_plain")),
        ),
        per_layer=per_layer,
        numerical_floor=dict(
            definition=settings["numerical_floor"]["kl"],
            kl_floor_min=float(q[0]),
            kl_floor_median=float(q[1]),
            kl_floor_p90=float(q[2]),
            kl_floor_max=float(q[3]),
            reference_kl_max=float(positions.reference_kl.max()) if len(positions) else None,
            delta_logp_next_floor_median=float(positions.floor_delta_logp_next.median()) if len(positions) else None,
            kl_min_median=float(positions.kl_min.median()) if len(positions) else None,
            kl_max_median=float(positions.kl_max.median()) if len(positions) else None,
        ),
    )


def _per_layer(stats: pd.DataFrame, n_boot: int, seed: int, n_layers: int, settings: dict) -> dict:
    """The mean partial per metric per layer and per third of the stack, bootstrap over the
    (document, layer) clusters of each group (exploratory)."""
    table, _ = _pivot(stats, "norm_controlled")
    layer_of = stats[stats.analysis == "norm_controlled"].groupby(["document", "position"]).layer.first()
    layers = layer_of.reindex(table.index).to_numpy()
    n_layers = max(n_layers, int(settings.get("n_layers", 0)))
    groups = {f"layer {l}": layers == l for l in sorted(set(layers.tolist()))}
    third, two = n_layers // 3, (2 * n_layers) // 3
    groups.update(
        {
            f"layers 0-{third - 1}": layers < third,
            f"layers {third}-{two - 1}": (layers >= third) & (layers < two),
            f"layers {two}-{n_layers - 1}": layers >= two,
        }
    )
    out = []
    docs = table.index.get_level_values("document").to_numpy()
    for name, keep in groups.items():
        if keep.sum() == 0:
            continue
        sub = table[keep]
        clusters = [f"{d}/{l}" for d, l in zip(docs[keep], layers[keep])]
        _, boot = _means(sub, clusters, n_boot, seed)
        out += _metric_entries(sub, boot, 0, dict(group=name))
    return dict(statistic="partial Spearman with the KL given the norm", groups=out)


# ---------------------------------------------------------------------------------------------
# The stage


def positions_per_document(settings: dict, model_name: str) -> int:
    """The protocol's positions per document for ``model_name`` (a number, or one per model; a
    model the protocol does not name takes the first)."""
    value = settings["primary"]["positions_per_document"]
    if isinstance(value, dict):
        return int(value.get(model_name, next(iter(value.values()))))
    return int(value)


def norm_controlled_stage(
    model,
    windows: torch.Tensor,
    protocol,
    out: Path,
    *,
    corpus: str,
    model_name: str,
    resume: bool,
    progress=print,
) -> dict:
    """Protocol 3's per-term endpoint on ``windows``, one document at a time through
    :func:`geolens.resume.run_document_stage` (tables ``per_term_terms.csv.gz`` and
    ``per_term_positions.csv.gz``), then :func:`norm_controlled_summary`. The model is cast to
    float64 (in place) and run inside :func:`geolens.per_term.float64_exact`."""
    from geolens.per_term import float64_exact
    from geolens.resume import run_document_stage

    settings = protocol.settings
    queries = tuple(settings["data"]["scored_positions"])
    n_positions = positions_per_document(settings, model_name)
    model = model.to(torch.float64)
    fingerprint = dict(
        stage="per_term",
        protocol_sha256=protocol.sha256,
        model=model_name,
        corpus=corpus,
        n_documents=int(windows.shape[0]),
        positions_per_document=n_positions,
        queries=list(queries),
        dtype="float64",
    )

    def measure(d: int) -> dict:
        terms, positions = norm_controlled_document(
            model, windows[d : d + 1], d, n_positions=n_positions, queries=queries
        )
        return {"terms": terms, "positions": positions}

    with float64_exact(model):
        tables = run_document_stage(
            "per_term", out, fingerprint, int(windows.shape[0]), measure, resume=resume, progress=progress
        )
    part = norm_controlled_summary(tables["terms"], tables["positions"], dict(settings, n_layers=model.cfg.n_layers))
    part["positions_per_document"] = n_positions
    return part


def summary_text(part: dict) -> str:
    """The primary statistic and its family as printed lines."""
    nc = part["norm_controlled"]
    lines = [
        f"per-term endpoint, protocol 3 ({part['n_positions']} positions, {part['n_documents']} documents, "
        f"{part['n_terms']} terms; float64): mean partial Spearman with the KL given ||alpha v~|| [95% CI]"
    ]
    for m in sorted(nc["metrics"], key=lambda m: -m["mean"]):
        lines.append(f"  {m['metric']:<26} {m['mean']:+.3f} [{m['ci_low']:+.3f}, {m['ci_high']:+.3f}]")
    lines.append("pairs (one Holm family):")
    for p in nc["pairs"]:
        ci = "" if p.get("ci_low") is None else f" [{p['ci_low']:+.3f}, {p['ci_high']:+.3f}]"
        lines.append(f"  {p['a']} -> {p['b']}: {p['estimate']:+.3f}{ci}  {p['verdict']}")
    return "\n".join(lines)


def _num(x: float) -> str:
    """``+0.123``; a value that rounds to ±0.000 but is not 0 keeps two significant digits (``+0.00021``)."""
    text = f"{x:+.3f}"
    return f"{x:+.2g}" if x != 0 and text in ("+0.000", "-0.000") else text


def _in_words(metrics: list[dict]) -> str:
    """One sentence sorting the metrics by where their mean partial ρ's 95 % interval lies."""
    above = [m["metric"] for m in metrics if m["ci_low"] > 0]
    below = [m["metric"] for m in metrics if m["ci_high"] < 0]
    zero = [m["metric"] for m in metrics if m["ci_low"] == m["ci_high"] == 0]
    other = [m["metric"] for m in metrics if m["metric"] not in above + below + zero]
    parts = [
        f"predict the KL beyond the norm (interval above 0): {', '.join(above) or 'none'}",
        f"rank against it once the norm is fixed (interval below 0): {', '.join(below) or 'none'}",
        f"cannot be told from 0: {', '.join(other) or 'none'}",
        f"0 by construction: {', '.join(zero) or 'none'}",
    ]
    return "In words (per-metric 95 % intervals, before any correction): " + "; ".join(parts) + "."


def summary_markdown(summary: dict) -> str:
    """README.md section of a protocol-3 run, in words and tables."""
    part = summary["per_term_effects"]
    nc = part["norm_controlled"]
    fl = part["numerical_floor"]
    lines = [
        "## Per-term endpoint, controlled for the norm (protocol 3)",
        "",
        f"{part['n_positions']} (layer, query) positions of {part['n_documents']} documents, {part['n_terms']} attention "
        f"terms, each removed alone and its effect measured in float64 (the model cast to float64, softmax and RMS "
        f"norms in float64). The question: what does a metric predict about a term's KL that the norm "
        f"‖α ṽ‖ of the removed term (value-weighted attention) does not? Statistic: per position, the partial "
        f"Spearman correlation of the metric with the KL given the norm; mean over positions, 95 % "
        f"document-cluster bootstrap intervals (B = {nc['n_boot']}). Value-weighted and output-normalised inter "
        f"rank as the norm does, so theirs is 0 by construction.",
        "",
        _in_words(nc["metrics"]),
        "",
        "| metric | mean partial ρ | 95 % CI | protocol 2's plain ρ (float64) |",
        "|---|---|---|---|",
    ]
    plain = {m["metric"]: m for m in part["plain"]["metrics"]}
    for m in sorted(nc["metrics"], key=lambda m: -m["mean"]):
        p = plain.get(m["metric"])
        ptxt = f"{p['mean']:+.3f} [{p['ci_low']:+.3f}, {p['ci_high']:+.3f}]" if p else "–"
        lines.append(f"| {m['metric']} | {m['mean']:+.3f} | [{m['ci_low']:+.3f}, {m['ci_high']:+.3f}] | {ptxt} |")
    lines += [
        "",
        f"Pre-registered pairs a → b (Δ = mean partial ρ(b) − ρ(a), + = b predicts more beyond the norm), one Holm "
        f"family, intervals at each pair's Holm level; verdicts from the intervals. The claimed order "
        f"(raw < value-weighted < output-normalised < contribution) beyond the norm: "
        f"**{nc['claimed_order_beyond_norm']}**.",
        "",
        "| pair | Δ | interval | p_adj | verdict |",
        "|---|---|---|---|---|",
    ]
    for p in nc["pairs"]:
        ci = "–" if p.get("ci_low") is None else f"[{_num(p['ci_low'])}, {_num(p['ci_high'])}]"
        padj = "–" if p.get("p_adj") is None else f"{p['p_adj']:.3g}"
        lines.append(f"| {p['a']} → {p['b']} | {p['estimate']:+.3f} | {ci} | {padj} | {p['verdict']} |")
    for p in nc["not_testable"]:
        lines.append(f"| {p['a']} → {p['b']} | – | – | – | not testable ({p['why']}) |")
    res = part["resolvable"]
    lines += [
        "",
        f"**Numerical floor.** Per position, the first-order bound on a computed KL's error from the in-batch clean "
        f"row: median {fl['kl_floor_median']:.2g} nats (max {fl['kl_floor_max']:.2g}); the smallest effect of a "
        f"position has median {fl['kl_min_median']:.2g}, the largest {fl['kl_max_median']:.2g}. "
        f"{100 * res['share_of_terms']:.1f} % of the {res['n_terms']} terms are resolvable (KL ≥ "
        f"{res['factor']:.0f} × floor).",
        "",
        "Exploratory analyses (95 % intervals, no family, no verdict):",
        "",
        "| metric | strata ρ | resolvable partial | top-decile partial | signed partial (−Δ log p next) | magnitude partial |",
        "|---|---|---|---|---|---|",
    ]

    def cell(block: dict, metric: str) -> str:
        for m in block.get("metrics", []):
            if m["metric"] == metric:
                return f"{m['mean']:+.3f} [{m['ci_low']:+.3f}, {m['ci_high']:+.3f}] (n={m['n_positions']})"
        return "–"

    for m in TERM_METRICS:
        lines.append(
            f"| {m} | {cell(part['strata'], m)} | {cell(res['partial'], m)} | {cell(part['top_decile']['partial'], m)} "
            f"| {cell(part['signed']['partial'], m)} | {cell(part['signed']['magnitude']['partial'], m)} |"
        )
    thirds = [g for g in part["per_layer"]["groups"] if g["group"].startswith("layers ")]
    names = list(dict.fromkeys(g["group"] for g in thirds))
    lines += [
        "",
        "Per third of the stack (mean partial ρ, 95 % interval from a bootstrap over the (document, layer) "
        "clusters of the third; exploratory; `per_layer` in summary.json has every layer):",
        "",
        "| metric | "
        + " | ".join(f"{n} (n={next(g['n_positions'] for g in thirds if g['group'] == n)})" for n in names)
        + " |",
        "|---|" + "---|" * len(names),
    ]
    for m in TERM_METRICS:
        row = {g["group"]: g for g in thirds if g["metric"] == m}
        cells = [
            f"{row[n]['mean']:+.3f} [{row[n]['ci_low']:+.3f}, {row[n]['ci_high']:+.3f}]" if n in row else "–"
            for n in names
        ]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


__all__ = [
    "ANALYSES",
    "norm_controlled_document",
    "norm_controlled_stage",
    "norm_controlled_summary",
    "partial_spearman",
    "position_statistics",
    "positions_per_document",
    "strata_spearman",
    "summary_markdown",
    "summary_text",
]
