"""Human column names (with units) and one-line legends for the report's tables.

The tables keep their machine column names in ``report.json``; the HTML page shows
:func:`header` for each column and, under each table, :func:`legend`: one line that says what
each column holds. A column that is not listed here keeps its name (and the report's tests fail
on any header that still looks like an identifier).
"""

from __future__ import annotations

import re

import numpy as np

# machine name -> (header shown, what the column holds)
COLUMNS: dict[str, tuple[str, str]] = {
    # shared
    "layer": ("layer", "layer index l (0 = first)"),
    "head": ("head", "query-head index h"),
    "N": ("N", "size of the selected source set"),
    "direction": ("direction", "comprehensiveness removes the top-k terms, sufficiency the bottom-k"),
    "quantity": ("quantity", "ΔPPL = masked − clean perplexity; Δ log-prob = masked − clean mean log p(target)"),
    "n_sequences": ("documents", "held-out windows behind the number"),
    "n_boot": ("bootstrap samples", "resamples of the documents for the 95% CI"),
    "ci_low": ("95% CI low", "lower end of the bootstrap 95% CI"),
    "ci_high": ("95% CI high", "upper end of the bootstrap 95% CI"),
    "n_queries": ("queries", "(window, query) samples counted for the head"),
    # contributions: per layer
    "sink_attention": ("attention to sink α_i0", "mean attention a query pays to position 0"),
    "sink_contribution": ("sink contribution c_i0", "mean intra-head contribution weight of position 0"),
    "top1_agreement": ("top-1 agreement (share)", "share of queries whose top source by α is also the top source by c"),
    "negative_share": ("negative c_ij (share)", "share of visible (query, source) pairs with c_ij < 0"),
    # sinks: geometry per layer
    "sink_rate": ("sink rate α_i0", "mean attention to position 0 over queries i ≥ 1"),
    "sink_rate_std": ("sink rate SD", "standard deviation of α_i0 over queries"),
    "gu_score": ("first-token attention (Gu et al.)", "mean attention to the first token, query 0 included"),
    "gu_sink_share": (
        "sink heads (share, ε = 0.3)",
        "share of heads whose first-token attention exceeds ε (Gu et al. 2024)",
    ),
    "value_norm_ratio": (
        "‖v_0‖ / mean‖v_j‖",
        "sink value norm over the mean non-sink value norm (value space; < 1: smaller sink)",
    ),
    "proj_norm_ratio": ("‖ṽ_0‖ / mean‖ṽ_j‖", "the same ratio for projected values ṽ = v W_O"),
    "value_cos_tail": ("cos(v_0, v_j)", "mean cosine of the sink value with each non-sink value j > 0"),
    "proj_cos_tail": ("cos(ṽ_0, ṽ_j)", "the same cosine for projected values"),
    "value_cos_negative": ("cos(v_0, v_j) < 0 (share)", "share of non-sink values anti-aligned with the sink value"),
    "proj_cos_negative": ("cos(ṽ_0, ṽ_j) < 0 (share)", "the same share for projected values"),
    "value_cos_mean_dir": (
        "cos(v_0, mean v_j)",
        "cosine of the sink value with the mean non-sink value (the semantic cone's direction)",
    ),
    "proj_cos_mean_dir": ("cos(ṽ_0, mean ṽ_j)", "the same cosine for projected values"),
    # sinks: decomposition
    "source": ("source type", "sink (position 0) or tail (every other source)"),
    "share_attention": ("attention share of Var", "signed share of Var(log|c_ij|) due to log α_ij"),
    "share_relnorm": ("relative-norm share of Var", "signed share due to log ‖ṽ_j‖/‖o_i‖"),
    "share_cosine": (
        "alignment share of Var",
        "signed share due to log |cos(o_i, ṽ_j)| (the three shares add up to 1)",
    ),
    "mean_log_attention": ("mean log α_ij", "mean natural log of the attention factor"),
    "mean_log_relnorm": ("mean log ‖ṽ_j‖/‖o_i‖", "mean natural log of the relative-norm factor"),
    "mean_log_cosine": ("mean log |cos|", "mean natural log of the alignment factor"),
    # sinks: drift
    "lambda": ("λ", "scale of the sink value, v_0 ← λ v_0 (λ = 1: unchanged)"),
    "nll": ("NLL (nats/token)", "mean next-token negative log-likelihood"),
    "ppl": ("PPL", "perplexity exp(NLL)"),
    "delta_ppl": ("ΔPPL", "perplexity change against λ = 1"),
    "out_norm_low_norm": ("‖o_i^h‖, low-norm heads", "mean head-output norm over the low-norm heads"),
    "cos_cone_low_norm": (
        "cos to cone, low-norm heads",
        "mean cosine of the head output with the semantic cone, low-norm heads",
    ),
    "relative_out_norm_low_norm": (
        "‖o_i^h‖/mean‖ṽ_j‖, low-norm heads",
        "head-output norm relative to the mean projected-value norm, low-norm heads",
    ),
    "out_norm_other": ("‖o_i^h‖, other heads", "mean head-output norm over the other heads"),
    "cos_cone_other": ("cos to cone, other heads", "mean cosine with the semantic cone, other heads"),
    "relative_out_norm_other": ("‖o_i^h‖/mean‖ṽ_j‖, other heads", "relative head-output norm, other heads"),
    # selection
    "condition": ("condition", "space / distance / ranking / sink rule of the scores"),
    "n_docs": ("documents", "windows with a score"),
    "top": ("F_N top-N", "document-mean F_N of the top-N set"),
    "top_lo": ("top-N CI low", "lower end of its bootstrap 95% CI"),
    "top_hi": ("top-N CI high", "upper end of its bootstrap 95% CI"),
    "random": ("F_N random", "document-mean F_N of random N-sets"),
    "random_lo": ("random CI low", "lower end of its 95% CI"),
    "random_hi": ("random CI high", "upper end of its 95% CI"),
    "diff": ("top − random", "paired difference of the two F_N"),
    "diff_lo": ("difference CI low", "lower end of its 95% CI"),
    "diff_hi": ("difference CI high", "upper end of its 95% CI"),
    "win_share": ("top-N wins (share)", "share of (layer, head) cases where top-N beats the random mean"),
    "win_lo": ("wins CI low", "lower end of its 95% CI"),
    "win_hi": ("wins CI high", "upper end of its 95% CI"),
    "tie_share": ("ties (share)", "share of cases with equal F_N"),
    # taxonomy
    "Mixer": ("Mixer", "heads (or share of heads) whose winners are mostly the sink"),
    "Retriever": ("Retriever", "heads (or share) whose winners are mostly the current token"),
    "Reset": ("Reset", "heads (or share) whose winners are mostly other tokens"),
    "regime": ("regime", "largest winner share of the head"),
    "label": ("label", "regime with its dominant offset"),
    "share_other": (
        "'other' winners (share)",
        "share of the head's queries won by neither the sink nor the current token",
    ),
    "top_offset": ("top offset w_i − i", "most frequent relative position of the 'other' winners"),
    "top_offset_share": ("top offset (share of queries)", "share of all the head's queries won at that offset"),
    "top_offset_share_of_other": ("top offset (share of 'other')", "share of the 'other' winners at that offset"),
    "prefix_length": ("prefix (tokens)", "length of the window prefix re-counted"),
    "n_windows": ("windows", "windows long enough for the prefix"),
    "n_queries_per_head": ("queries per head", "queries counted per head on the prefixes"),
    "share_sink": ("sink winners (share)", "mean over heads of the share of queries won by the sink"),
    "share_current": ("current-token winners (share)", "mean share won by the current token"),
    "changed_vs_full": ("regime changed (share)", "share of heads whose regime differs from the full windows'"),
    # faithfulness
    "a": ("metric a", "first metric of the pair"),
    "b": ("metric b", "second metric of the pair"),
    "auc_diff": ("AUC difference b − a", "paired difference of the areas under the curves (+ = b more faithful)"),
    "verdict": (
        "verdict",
        "holds / tie / reversed by the interval; not testable when both sides coincide by construction; "
        "indicative (n = …) below the minimum sample of the claims rule",
    ),
    "claimed": ("in the claimed order", "whether the pair is a step of the claimed order"),
    "metric": ("metric", "attribution metric that ranks the terms"),
    "auc": ("AUC", "area under the curve over k (trapezoid rule)"),
    # faithfulness, per-term endpoint (protocol 2)
    "scope": (
        "scope",
        "term: one head's term α_ij^h ṽ_j^h removed; source: source j removed from every head of the layer",
    ),
    "outcome": (
        "outcome",
        "KL(clean ‖ removed) of the next-token distribution, or the drop of the clean top-1 probability",
    ),
    "spearman": (
        "mean Spearman ρ",
        "mean over positions of the rank correlation between the metric's scores and the measured effects",
    ),
    "top5": (
        "top-5 overlap",
        "mean share of the 5 terms with the largest effect that the metric also ranks in its top 5",
    ),
    # faithfulness, per-term endpoint controlled for the norm (protocol 3)
    "partial_spearman": (
        "mean partial ρ given the norm",
        "mean over positions of the Spearman correlation between the metric's scores and the measured KL given the "
        "norm ‖α ṽ‖ of the removed term (what the metric predicts beyond the norm; 0 by construction for a metric "
        "that ranks as the norm does)",
    ),
    "plain_spearman": (
        "plain ρ (protocol 2)",
        "mean over positions of the plain Spearman correlation with the same float64 KLs, protocol 2's statistic",
    ),
    "plain_ci_low": ("plain ρ 95% CI low", "lower end of the plain ρ's bootstrap 95% CI"),
    "plain_ci_high": ("plain ρ 95% CI high", "upper end of the plain ρ's bootstrap 95% CI"),
    "plain_estimate": (
        "plain Δ b − a (protocol 2)",
        "the same pair's difference of the plain means, exploratory: it decides nothing",
    ),
    "n_excluded_positions": (
        "excluded positions",
        "positions left out: fewer than 5 terms, equal KLs, or KLs ranked exactly as the norms",
    ),
    "n_positions": ("positions", "(layer, query) positions behind the number"),
    "n_documents": ("documents", "documents (here: windows) behind the number, the clusters of the bootstrap"),
    "estimate": ("Δ b − a", "paired difference of the means (+ = b better)"),
    "level": ("CI level", "confidence level of the interval: the pair's Holm level"),
    "p": ("p", "two-sided bootstrap p-value"),
    "p_adj": ("Holm p", "p-value adjusted by Holm's step-down within the family"),
    # contribution flow
    "method": ("method", "attribution method ranking the input tokens"),
    "method_a": ("method a", "first method of the pair"),
    "method_b": ("method b", "second method of the pair"),
    "erasure": (
        "erasure",
        "comprehensiveness erases the top-ranked input tokens, sufficiency every erasable token but those",
    ),
    "naopc": (
        "nAOPC",
        "normalised AOPC: mean over the fractions of KL(clean ‖ erased) / KL with every erasable token erased",
    ),
    "delta": ("Δ b − a", "paired nAOPC difference, signed so that + = b more faithful"),
    "rank": ("rank", "1 = the largest share"),
    "position": ("position", "input position (0 = BOS)"),
    "token": ("token", "the input token at that position"),
    "share": ("share", "share of the prediction's residual stream coming from that position (rows sum to 1)"),
    "queries_checked": ("queries", "second occurrences checked"),
    "passed": (
        "passed",
        "queries whose largest share outside the query is on the token that followed the first occurrence",
    ),
    "passed_no_bos": ("passed without BOS", "the same, with BOS left out of the comparison"),
    "median_rank_target": (
        "median rank of that token",
        "median rank of the expected source among the query's sources (1 = top)",
    ),
    "median_gap_when_failing": (
        "median miss",
        "median gap between the largest share and the expected source's share, over the failing queries",
    ),
    # pruning
    "order": ("order", "pruning order (random: a random permutation of the heads with that seed)"),
}

# cell values that are identifiers too: column -> {value -> label}
QUANTITY_VALUES = {"delta_ppl": "ΔPPL", "delta_logprob": "Δ log-prob"}
_METRIC_COLUMNS = ("a", "b", "metric")

_IDENTIFIER = re.compile(r"^[a-z0-9]+(_[a-z0-9]+)+$")


def is_identifier(text: str) -> bool:
    """True for a raw snake_case name such as ``value_cos_mean_dir``."""
    return bool(_IDENTIFIER.match(str(text).strip()))


def header(name) -> str:
    """The header shown for column ``name``; a retention level like ``"0.8"`` reads "kept 80%"."""
    key = str(name)
    if key in COLUMNS:
        return COLUMNS[key][0]
    try:
        value = float(key)
    except ValueError:
        return key
    return f"ΔPPL at {value:.0%} kept" if 0 < value <= 1 else key


def legend(columns) -> str:
    """One line: "header: what it holds; …" for every column with a known meaning."""
    parts, retention = [], []
    for name in columns:
        key = str(name)
        if key in COLUMNS:
            head, what = COLUMNS[key]
            parts.append(f"{head}: {what}")
        elif header(key) != key:
            retention.append(key)
    if retention:
        parts.append("ΔPPL at r kept: perplexity change when a share r of the heads is kept (1 − r ablated)")
    return "; ".join(parts) + "." if parts else ""


def _metric_label(name: str) -> str:
    """A metric's label: the registry's (:func:`geolens.metrics.metric_label`, mode variants
    included), the per-term endpoint's for its own metrics, or the name."""
    from geolens.faithfulness.ground_truth import LABELS
    from geolens.metrics import metric_label

    return metric_label(name) or LABELS.get(name, name)


def humanise_values(df):
    """A copy of ``df`` whose metric and quantity cells read as labels (raw_attention → raw attention α)."""
    out = df.copy()
    for col in out.columns:
        key = str(col)
        if key == "quantity":
            out[col] = out[col].map(lambda v: QUANTITY_VALUES.get(v, v))
        elif key == "order":
            out[col] = out[col].map(
                lambda v: re.sub(r"^random_(\d+)$", r"random (seed \1)", v) if isinstance(v, str) else v
            )
        elif key in _METRIC_COLUMNS:
            out[col] = out[col].map(lambda v: _metric_label(v) if isinstance(v, str) else v)
        elif key == "claimed":
            out[col] = out[col].map(
                lambda v: {True: "yes", False: "no"}.get(v, v) if isinstance(v, (bool, np.bool_)) else v
            )
    return out
