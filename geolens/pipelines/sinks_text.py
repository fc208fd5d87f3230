"""The text ``geolens sinks`` prints, from what its runs return (:mod:`geolens.pipelines.sinks`):
the corpus pass's headline (:func:`sinks_text`), the sink-intervention controls
(:func:`controls_text`) and the dose-matched controls of a protocol (:func:`dose_header`,
:func:`dose_text`)."""

from __future__ import annotations


def _table(df) -> str:
    return df.to_string(index=False, float_format=lambda x: f"{x:.4g}")


def sinks_text(summary: dict, out, *, eps: float, drift=None) -> str:
    """The corpus pass in a few lines: where it wrote, the sink rate, the value-norm ratios, the
    sink's alignment, the norm curve and (``drift``, a :class:`~geolens.sinks.DriftResult`) the
    semantic drift's table; every number from ``summary`` (:func:`~geolens.pipelines.sinks.save_sinks`)."""
    hl, nc = summary, summary["norm_curve"]
    lines = [
        f"wrote {out}/ in {hl['seconds']} s",
        f"Gu et al. sink rate (ε={eps}): {hl['gu_sink_rate']:.3f}; mean α_i0 {hl['mean_sink_rate']:.3f}",
        f"median ‖ṽ_0‖/‖ṽ_j‖ {hl['proj_norm_ratio_median']:.3f}, ‖v_0‖/‖v_j‖ {hl['value_norm_ratio_median']:.3f}",
        f"mean cos(ṽ_0, ṽ_j) {hl['proj_cos_tail_mean']:+.3f}; heads with negative mean: {hl['share_heads_proj_cos_tail_negative']:.0%}",
        f"norm curve: convex with argmin in (0,1) for {nc['head_share_convex_argmin_inside']:.0%} of {nc['head_n_fitted']} heads",
    ]
    if drift is not None:
        lines.append(_table(drift.summary))
    return "\n".join(lines)


def controls_text(res) -> str:
    """The sink-intervention controls (a :class:`~geolens.sinks.controls.ControlsResult`): sample and
    clean perplexity, the all-layers edits and the claim per scope."""
    lines = [f"sink controls: {res.n_windows} windows × {res.seq_len} tokens, clean PPL {res.clean_ppl:.3f}"]
    a = res.conditions[res.conditions.scope == "all"]
    if len(a):
        lines.append(_table(a[["edit", "delta_ppl", "delta_ppl_lo", "delta_ppl_hi", "out_norm_ratio", "delta_cos"]]))
    lines.append(res.scopes.to_string(index=False))
    return "\n".join(lines)


def dose_header(info: dict, tokens, documents, registration: dict, *, threads: int) -> str:
    """What a dose-controls run is about to do: the protocol (version, file, hash), the sample
    (``tokens`` ``[window, pos]``, each window's document), its label and departures."""
    return (
        f"dose-matched sink controls, protocol v{info['protocol_version']} ({info['protocol_file']}, sha256 {info['protocol_sha256'][:12]}…): "
        f"{tokens.shape[0]} windows of {tokens.shape[1]} tokens from {len(set(documents.tolist()))} documents; {registration['status']}; "
        f"torch threads {threads}" + "".join(f"\n  differs: {d}" for d in registration["reasons"])
    )


def dose_text(res, summary: dict) -> str:
    """The dose-response table and one line per pair (estimate, interval at its level, p, p_adj,
    verdict) of a dose-controls run (:func:`~geolens.pipelines.sinks.save_dose_controls`)."""
    columns = ["scope", "edit", "lam", "degrees", "dose", "n_seeds", "delta_ppl", "delta_ppl_low", "delta_ppl_high"]
    lines = [_table(res.dose_response[columns + ["kl", "kl_low", "kl_high"]])]
    for pair in summary["pairs"] + summary["exploratory_pairs"]:
        ci = (
            ""
            if pair["ci_low"] is None
            else f" [{pair['ci_low']:+.4g}, {pair['ci_high']:+.4g}] at {pair['level']:.4f}, p {pair['p']:.3g}, p_adj {pair['p_adj']:.3g}"
        )
        est = "" if pair["estimate"] is None else f" {pair['estimate']:+.4g}"
        verdict = pair["verdict"] or ("exploratory" if pair["outcome"] != "kl" else summary["label"])
        lines.append(f"{pair['scope']}: {pair['statistic']}{est}{ci}: {verdict}")
    return "\n".join(lines)
