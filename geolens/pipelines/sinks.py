"""The sinks pipeline (docs/method.md §4): sink geometry, token-type decomposition and output-norm
curve in one corpus pass, then the semantic-drift experiment on the first windows.

``geolens sinks`` runs it with the command's options and writes its folder (:func:`save_sinks`);
the report's sinks section runs it with report-sized parameters (its corpus pass shared with the
other sections) and shows it. The command's other runs are here too, the command only parsing
options and printing (:mod:`geolens.pipelines.sinks_text`):

- the corpus pass (:func:`save_sinks`) writes CSV tables, ``summary.json`` (headline numbers,
  settings and the command line) and PNG figures;
- ``--controls-sequences N`` adds the sink-intervention controls (:mod:`geolens.sinks.controls`,
  :func:`save_controls`) on the first N windows: ``controls_conditions.csv``,
  ``controls_pairs.csv``, ``controls_scopes.csv``, ``controls_windows.csv``,
  ``controls_summary.json`` and ``controls.png``; ``--controls-only`` skips everything else;
- ``--controls-protocol PATH`` runs instead, and alone, the dose-matched sink controls of a
  pre-registered protocol (the ``"sink_controls"`` block of ``docs/faithfulness/protocol.json``,
  :func:`geolens.sinks.controls_dose.dose_controls`, :func:`save_dose_controls`) on the protocol's own
  sample: the corpus' documents cut into the protocol's windows. It writes
  ``controls_summary.json`` (with ``protocol_sha256``, the SHA-256 of the protocol's text, and
  ``label``: ``pre-registered``, or ``exploratory`` with its ``differences`` when anything differs
  from the protocol: ``--controls-documents``, ``--n-boot``, ``--corpus``, the model, ``--compat``;
  an exploratory run gets no verdicts), ``controls_windows.csv`` (every window × scope × edit ×
  seed; the summary recomputes exactly from it), ``controls_dose_response.csv``,
  ``controls_verdicts.csv`` and ``controls_sink_heads.csv``. It checkpoints after every window
  (``controls_checkpoint.json``, removed when the run completes), so an interrupted run resumes.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Sequence

import numpy as np

from geolens.adapter import model_mode
from geolens.checkpoint import json_default
from geolens.claims import Claim, sample_size
from geolens.pipelines import TopicRun, save_figures, streamed, write_tables
from geolens.preregistration import load_protocol, preregistration
from geolens.sinks import (
    DEFAULT_LAMBDAS,
    GU_EPSILON,
    NormCurve,
    SinkGeometry,
    TokenTypeDecomposition,
    default_conditions,
    semantic_drift,
    sink_controls,
)
from geolens.sinks.controls_dose import dose_controls, write_windows
from geolens.sinks.controls_protocol import protocol_deviations, read_protocol


@dataclass
class SinksParams:
    """Parameters of :func:`run_sinks` (the defaults are the analyses' own)."""

    eps: float = GU_EPSILON  # Gu et al. threshold on the mean first-token attention
    n_bins: int = 20  # sink-rate bins on [0, 1] (sink-rate histogram and norm curve)
    min_count: int = 20  # queries a bin needs to enter the norm curve's quadratic fit
    decomposition_sequences: int | None = None  # the decomposition uses only the first N windows (None: all)
    drift_sequences: int = 48  # first N windows of the semantic-drift experiment (0: skip it)
    lambdas: Sequence[float] = DEFAULT_LAMBDAS
    drift_layers: Sequence[int] | None = None  # layers whose v_0 is scaled (None: all)
    drift_kv_heads: Sequence[int] | None = None  # kv heads whose v_0 is scaled (None: all)
    low_norm_quantile: float = 0.25
    batch_size: int = 8


def sinks_analyses(model, tokens, params: SinksParams) -> dict:
    """The corpus analyses of the sinks pipeline (one pass over ``tokens``)."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    return {
        "geometry": SinkGeometry(L, H, eps=params.eps, n_bins=params.n_bins),
        "decomposition": TokenTypeDecomposition(L, H, max_sequences=params.decomposition_sequences),
        "norm_curve": NormCurve(L, H, n_bins=params.n_bins),
    }


@dataclass(kw_only=True)
class SinksRun(TopicRun):
    """:func:`run_sinks`'s result: the four result objects of :mod:`geolens.sinks` (``drift`` is
    None when ``drift_sequences`` is 0), their tables, figures and claims."""

    geometry: object
    decomposition: object
    norm_curve: object
    drift: object | None = None

    @property
    def figures(self) -> dict:
        from geolens.viz.sinks import decomposition_bars, drift_plot, norm_curve_plot, sink_layer_bars

        out = {
            "sink_layers": partial(sink_layer_bars, self.geometry),
            "decomposition": partial(decomposition_bars, self.decomposition),
            "norm_curve_layers": partial(norm_curve_plot, self.norm_curve),
        }
        if self.drift is not None:
            out["drift"] = partial(drift_plot, self.drift)
        return out

    def claims(self) -> list:
        return sink_claims(self.geometry, self.decomposition, self.norm_curve.summary(), self.drift)


def run_sinks(
    model,
    tokens,
    params: SinksParams = SinksParams(),
    *,
    analyses: dict | None = None,
    progress: bool = True,
    desc: str = "sinks: corpus pass",
) -> SinksRun:
    """The sinks pipeline over the windows ``tokens`` ``[n, seq]`` (BOS first, unpadded).

    ``analyses``: :func:`sinks_analyses` already run over ``tokens`` (then no corpus pass here).
    """
    analyses = streamed(
        model,
        tokens,
        analyses,
        lambda: sinks_analyses(model, tokens, params),
        batch_size=params.batch_size,
        progress=progress,
        desc=desc,
    )
    g, d = analyses["geometry"].result(), analyses["decomposition"].result()
    n = analyses["norm_curve"].result(min_count=params.min_count)
    tables = {
        "geometry_heads": g.heads,
        "geometry_layers": g.layers,
        "sink_rate_hist": g.sink_rate_hist,
        "decomposition_heads": d.heads,
        "decomposition_layers": d.layers,
        "decomposition_summary": d.summary,
        "norm_curves": n.curves,
        "norm_fits": n.fits,
    }
    drift = None
    if params.drift_sequences > 0:
        drift = semantic_drift(
            model,
            tokens[: params.drift_sequences],
            lambdas=params.lambdas,
            layers=params.drift_layers,
            kv_heads=params.drift_kv_heads,
            low_norm_quantile=params.low_norm_quantile,
            batch_size=params.batch_size,
            progress=progress,
        )
        tables.update(drift_heads=drift.heads, drift_summary=drift.summary)
    return SinksRun(parameters=asdict(params), tables=tables, geometry=g, decomposition=d, norm_curve=n, drift=drift)


def sink_claims(geometry, decomposition, norm_summary: dict, drift) -> list:
    """The sink claims of docs/method.md §4, each decided from this run's numbers."""
    h = geometry.heads
    value_ratio, proj_ratio = float(h.value_norm_ratio.median()), float(h.proj_norm_ratio.median())
    cos_mean = float(h.proj_cos_tail.mean())
    cos_neg = float((h.proj_cos_tail < 0).mean())
    s = decomposition.summary.set_index("source")
    sink_att, sink_geo = (
        float(s.loc["sink", "share_attention"]),
        float(s.loc["sink", "share_relnorm"] + s.loc["sink", "share_cosine"]),
    )
    tail_att_cos, tail_rel = (
        float(s.loc["tail", "share_attention"] + s.loc["tail", "share_cosine"]),
        float(s.loc["tail", "share_relnorm"]),
    )
    inside = norm_summary["head_share_convex_argmin_inside"]
    claims = [
        Claim(
            claim="The sink's value vector is 3–10× smaller than the other tokens' (value space)",
            source="paper B (docs/method.md §4; unconfirmed number)",
            measured=f"median over heads of ‖v_0‖/mean‖v_j‖ = {value_ratio:.3f} (projected ‖ṽ_0‖/mean‖ṽ_j‖ = {proj_ratio:.3f})",
            holds=bool(value_ratio <= 1 / 3),
            criterion="median value-space ratio ≤ 1/3",
            numbers={"value_norm_ratio_median": value_ratio, "proj_norm_ratio_median": proj_ratio},
        ),
        Claim(
            claim="The sink's projected value is anti-aligned with the other tokens': cos(ṽ_0, ṽ_j) < 0",
            source="papers A §3.2 and B",
            measured=f"mean cos(ṽ_0, ṽ_j) = {cos_mean:+.3f}; negative in {100 * cos_neg:.0f}% of heads",
            holds=bool(cos_mean < 0 and cos_neg > 0.5),
            criterion="mean < 0 and negative in most heads",
            numbers={"proj_cos_tail_mean": cos_mean, "share_heads_proj_cos_tail_negative": cos_neg},
        ),
        Claim(
            claim="Sink contributions are governed by value geometry, tail contributions by attention and alignment",
            source="paper A §3.2",
            measured=f"share of Var(log|c|): sink attention {sink_att:.2f} vs norm+cosine {sink_geo:.2f}; "
            f"tail attention+cosine {tail_att_cos:.2f} vs norm {tail_rel:.2f}",
            holds=bool(sink_att < sink_geo and tail_att_cos > tail_rel),
            criterion="sink: attention share < norm+cosine; tail: attention+cosine > norm",
            numbers={
                "sink_share_attention": sink_att,
                "sink_share_geometry": sink_geo,
                "tail_share_attention_cosine": tail_att_cos,
                "tail_share_relnorm": tail_rel,
            },
        ),
        Claim(
            claim="Head output norm vs sink rate is convex with its minimum at an intermediate sink rate",
            source="paper A §3.3",
            measured=f"{100 * inside:.0f}% of {norm_summary['head_n_fitted']} fitted head curves are convex with argmin in (0, 1)"
            if np.isfinite(inside)
            else "no head had enough queries per bin for a fit",
            holds=bool(inside > 0.5) if np.isfinite(inside) else None,
            criterion="more than half of the fitted head curves",
            numbers={k: v for k, v in norm_summary.items()},
        ),
    ]
    if drift is not None:
        sm = drift.summary.set_index("lambda")
        lo = float(sm.index.min())
        dppl = float(sm.loc[lo, "delta_ppl"])
        cos_lo, cos_1 = float(sm.loc[lo, "cos_cone_low_norm"]), float(sm.loc[1.0, "cos_cone_low_norm"])
        from geolens.stats import mean_ci

        layers = drift.edited["layers"]
        n_layers = int(h["layer"].max()) + 1  # the geometry covers every layer
        edited = "all layers" if len(layers) == n_layers else f"layers {', '.join(map(str, layers))}"
        d_loss, d_lo, d_hi = (float(v) for v in mean_ci(drift.row_nll[lo] - drift.row_nll[1.0], seed=0))
        claims.append(
            Claim(
                claim="Removing the sink's value norm collapses low-norm head outputs into the semantic cone and raises perplexity",
                source="paper A §3.3",
                measured=f"{edited} edited, λ = {lo:g}: Δloss {d_loss:+.4f} nats per token [{d_lo:+.4f}, {d_hi:+.4f}] "
                f"(95% interval over windows), ΔPPL = {dppl:+.3f}; cos(o, cone) of low-norm heads {cos_1:+.3f} (λ=1) → "
                f"{cos_lo:+.3f} ({drift.n_sequences} windows)",
                holds=bool(d_lo > 0 and cos_lo > cos_1),
                criterion="the 95% interval of Δloss(λ_min) over windows lies above 0, and the low-norm heads' cosine "
                "with the cone rises; whether it holds depends on the edited layers (docs/results.md, interventions)",
                numbers={
                    "lambda": lo,
                    "layers": list(layers),
                    "delta_loss": d_loss,
                    "delta_loss_ci": [d_lo, d_hi],
                    "delta_ppl": dppl,
                    "cos_cone_low_norm_lambda_min": cos_lo,
                    "cos_cone_low_norm_lambda_1": cos_1,
                    "sample": sample_size(drift.n_sequences),
                },
            )
        )
    return claims


# ---------------------------------------------------------------------------------------------
# The folders of ``geolens sinks``


def headline(geometry, decomposition, norm_curve, drift=None) -> dict:
    """The numbers the README quotes, from the result objects."""
    h = geometry.heads
    out = {
        "gu_sink_rate": geometry.gu_sink_rate,
        "mean_sink_rate": float(h.sink_rate.mean()),
        "value_norm_ratio_median": float(h.value_norm_ratio.median()),
        "proj_norm_ratio_median": float(h.proj_norm_ratio.median()),
        "share_heads_value_norm_ratio_below_1": float((h.value_norm_ratio < 1).mean()),
        "share_heads_value_norm_ratio_below_1_3": float((h.value_norm_ratio < 1 / 3).mean()),
        "share_heads_proj_norm_ratio_below_1": float((h.proj_norm_ratio < 1).mean()),
        "value_cos_tail_mean": float(h.value_cos_tail.mean()),
        "proj_cos_tail_mean": float(h.proj_cos_tail.mean()),
        "share_heads_value_cos_tail_negative": float((h.value_cos_tail < 0).mean()),
        "share_heads_proj_cos_tail_negative": float((h.proj_cos_tail < 0).mean()),
        "proj_cos_mean_dir_mean": float(h.proj_cos_mean_dir.mean()),
        "share_heads_proj_cos_mean_dir_negative": float((h.proj_cos_mean_dir < 0).mean()),
        "decomposition_mean_head_shares": {
            r.source: {k: float(v) for k, v in r.items() if k != "source"} for _, r in decomposition.summary.iterrows()
        },
        "norm_curve": norm_curve.summary(),
    }
    # heads that really sink (Gu et al. in most sequences): the claims concern them
    sinks = h[h.gu_sink_share > 0.5]
    out["n_gu_sink_heads"] = int(len(sinks))
    if len(sinks):
        out["sink_heads_proj_norm_ratio_median"] = float(sinks.proj_norm_ratio.median())
        out["sink_heads_value_norm_ratio_median"] = float(sinks.value_norm_ratio.median())
        out["sink_heads_share_proj_cos_tail_negative"] = float((sinks.proj_cos_tail < 0).mean())
    if drift is not None:
        out["drift"] = drift.summary.to_dict(orient="records")
        out["drift_edited"] = drift.edited
        out["drift_n_sequences"] = drift.n_sequences
    return out


@dataclass
class ControlsParams:
    """Parameters of :func:`save_controls` (:func:`geolens.sinks.sink_controls`'s)."""

    layers: Sequence[int]  # edited one at a time (and all at once)
    lambdas: Sequence[float] = (0.0, 2.0)  # of the scale and random-token edits
    seeds: Sequence[int] = (0, 1, 2)  # of the rotation control
    n_boot: int = 2000
    seed: int = 0  # the random non-sink positions and the bootstrap
    batch_size: int = 8
    n_windows: int | None = None  # the first N windows of the tokens (None: all)


def save_controls(model, tokens, params: ControlsParams, out: Path, *, dpi: int, meta: dict, t0: float):
    """The sink-intervention controls on ``tokens`` (the first ``params.n_windows``), written under
    ``out`` (``controls_*.csv``, ``controls.png``, ``controls_summary.json``: ``meta``, the seconds
    since ``t0``, the result's summary); returns (the
    :class:`~geolens.sinks.controls.ControlsResult`, the summary)."""
    from geolens.viz.sinks import controls_plot

    res = sink_controls(
        model,
        tokens[: params.n_windows],
        conditions=default_conditions(lambdas=params.lambdas, seeds=params.seeds),
        layers=params.layers,
        n_boot=params.n_boot,
        seed=params.seed,
        batch_size=params.batch_size,
        progress=True,
    )
    res.conditions.to_csv(out / "controls_conditions.csv", index=False, float_format="%.6g")
    res.pairs.to_csv(out / "controls_pairs.csv", index=False, float_format="%.6g")
    res.scopes.to_csv(out / "controls_scopes.csv", index=False)
    res.windows.to_csv(out / "controls_windows.csv", index=False, float_format="%.6g")
    view = controls_plot(res)
    view.save(out / "controls.png", dpi=dpi)
    view.close()
    summary = {**meta, "seconds": round(time.time() - t0, 1), **res.summary()}
    (out / "controls_summary.json").write_text(json.dumps(summary, indent=1, default=json_default), encoding="utf-8")
    return res, summary


def save_sinks(
    model,
    tokens,
    params: SinksParams,
    out: Path,
    *,
    dpi: int,
    meta: dict,
    t0: float,
    controls: ControlsParams | None = None,
    controls_meta: dict | None = None,
):
    """:func:`run_sinks` written under ``out``: its tables and figures, with ``controls`` the
    controls (:func:`save_controls`, with ``controls_meta``), and ``summary.json`` (``meta``, the
    sample, the seconds since ``t0``, :func:`headline`, the controls' main numbers). Returns (the
    run, the summary, the controls' result or None)."""
    result = run_sinks(model, tokens, params)
    g, d, n, drift = result.geometry, result.decomposition, result.norm_curve, result.drift
    write_tables(out, result.tables)
    save_figures(out, result.figures, dpi=dpi)
    res, done = None, None
    if controls is not None:
        res, done = save_controls(model, tokens, controls, out, dpi=dpi, meta=controls_meta or {}, t0=t0)
    summary = {
        **meta,
        "model_mode": g.model_mode,
        "n_sequences": int(tokens.shape[0]),
        "seq_len": int(tokens.shape[1]),
        "seconds": round(time.time() - t0, 1),
        "decomposition_n_sequences": d.n_sequences,
        **headline(g, d, n, drift),
    }
    if done is not None:
        summary["controls"] = {k: done[k] for k in ("n_windows", "seq_len", "claim_by_scope", "all_layers_pairs")}
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=json_default), encoding="utf-8")
    return result, summary, res


def dose_protocol(path, *, n_documents: int | None, n_boot: int, corpus: str):
    """The dose-matched controls of the pre-registered protocol at ``path`` (its twin
    ``protocol.json``), run with ``n_documents`` (None: the protocol's), ``n_boot`` and ``corpus``:
    (the run's :class:`~geolens.sinks.controls_protocol.DoseProtocol`, the registered one, the
    provenance of :func:`~geolens.sinks.controls_protocol.read_protocol`, the twin). ValueError in
    one line for a missing or malformed protocol."""
    twin = load_protocol(path)
    registered, info = read_protocol(twin)
    protocol = replace(registered, n_documents=n_documents or registered.n_documents, n_boot=n_boot, corpus=corpus)
    return protocol, registered, info, twin


def dose_registration(model, protocol, registered, info: dict, twin, *, model_name: str) -> dict:
    """:func:`geolens.preregistration.preregistration` of a dose-controls run: ``status``
    (``pre-registered`` or ``exploratory``) and ``reasons``, the run's departures from the protocol
    (:func:`geolens.sinks.controls_protocol.protocol_deviations`: settings, model, mode, dtype)."""
    dtype = str(getattr(model.cfg, "dtype", "")).replace("torch.", "")
    deviations = protocol_deviations(protocol, registered, info, model=model_name, mode=model_mode(model), dtype=dtype)
    return preregistration(twin, deviations)


def save_dose_controls(
    model,
    tokens,
    documents,
    protocol,
    out: Path,
    *,
    registration: dict,
    info: dict,
    meta: dict,
    t0: float,
    resume: bool = False,
    rows_per_forward: int | None = None,
    batch_size: int = 8,
):
    """The dose-matched sink controls of a pre-registered protocol on its sample (``tokens``,
    ``documents``: :func:`geolens.sinks.controls_dose.controls_sample`), checkpointed in ``out``
    after every window (``resume``: from the checkpoint there; verdicts only for a run without
    departures, ``registration``'s reasons), written under ``out`` (module docstring); the
    checkpoint is removed once the summary is written. Returns (the result, the summary)."""
    checkpoint = out / "controls_checkpoint.json"
    res = dose_controls(
        model,
        tokens,
        documents,
        protocol,
        checkpoint=checkpoint,
        resume=resume,
        rows_per_forward=rows_per_forward,
        verdicts=not registration["reasons"],
        batch_size=batch_size,
        progress=True,
    )
    write_windows(res.windows, out / "controls_windows.csv")
    res.dose_response.to_csv(out / "controls_dose_response.csv", index=False, float_format="%.17g")
    res.pairs.to_csv(out / "controls_verdicts.csv", index=False, float_format="%.17g")
    res.sink_heads.to_csv(out / "controls_sink_heads.csv", index=False, float_format="%.17g")
    summary = {
        **meta,
        "label": registration["status"],
        "differences": registration["reasons"],
        "protocol_sha256": info["protocol_sha256"],
        "protocol_version": info["protocol_version"],
        "protocol_file": info["protocol_file"],
        "pre_registered_text": info["pre_registered"],
        "preregistration": registration,
        "seconds": round(time.time() - t0, 1),
        **res.summary(),
    }
    if checkpoint.is_file():  # resumed under another geolens version: said here
        from geolens.resume import read_json, versions_note

        summary.update(versions_note(read_json(checkpoint, "checkpoint").get("writer")))
    (out / "controls_summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    checkpoint.unlink(missing_ok=True)
    return res, summary
