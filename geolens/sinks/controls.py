"""Sink-intervention controls: does the sink's *norm* matter, or only its exact value? (docs/method.md §4.5)

This module holds the earlier controls (:func:`sink_controls`); the pre-registered dose-matched
controls of docs/faithfulness/PROTOCOL.md §6 are :mod:`geolens.sinks.controls_protocol` (what is
edited and measured), :mod:`geolens.sinks.controls_dose` (the measurement) and
:mod:`geolens.sinks.controls_summary` (the statistics and verdicts).

Scaling v_0 by λ in every layer at once raises perplexity for λ = 2 more than for λ = 0, which
shows that the model needs the sink value as it is, not that its small norm is what matters.
This experiment separates the two with edits of v_0 (:func:`geolens.interventions.sink_values.sink_edit`)
in one layer at a time and in all layers at once:

- norm edits (direction kept): ``scale`` v_0 ← λ v_0; ``rescale_mean_norm`` ‖v_0‖ ← mean_{j≥1}‖v_j‖;
- norm-preserving controls: ``rotate`` (‖v_0‖ kept, direction turned to a seeded random orthogonal
  one; several seeds, pooled), ``corpus_mean`` (v_0 ← its mean over the corpus' windows, computed in
  a first pass);
- token control: ``random_token`` v_j ← λ v_j for one random non-sink position j per window.

Measured per window, per scope (``all`` or one layer) and edit, in the edited forward pass:

- the mean next-token NLL over all predicted positions; PPL = exp(mean NLL over the windows),
  ΔPPL = PPL(edit) − PPL(clean);
- at the edited layer(s), over every query head and query i ≥ 1: the head output norm ‖o_i^h‖ and
  the cone cosine cos(o_i^h, s_i^h), s_i^h = (1/i) Σ_{1≤j≤i} ṽ_j^h the mean non-sink projected value
  the query can see (:func:`geolens.sinks.drift.head_cone_statistics`).

Confidence intervals: percentile bootstrap over windows (:mod:`geolens.stats`; the same resampled
windows for every edit and for the clean run, so differences are paired). A pair "norm edit vs control" compares
ΔPPL(norm edit) − ΔPPL(control): **norm edit larger** when its CI lies above 0, **control larger**
when below, **tie** otherwise. The controls of a norm edit are ``rotate`` (pooled over seeds) and
``corpus_mean``, and for ``scale λ`` also ``random_token λ``. "The sink's norm specifically
matters" in a scope **holds** only when every norm edit is larger than every one of its controls,
**fails** when any control is larger, and is **undecided** otherwise. Means are never compared
without their paired CI.

Note: with BOS at position 0, v_0 depends on no other token (position 0 attends only to itself),
so in a clean forward it is the same vector in every window and ``corpus_mean`` reproduces it (up to
float rounding): a check that the edit machinery does not perturb the model by itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from geolens.adapter import PATTERN, VALUE, get_attention_layer, hook_name, model_mode, n_kv_heads, sliding_window
from geolens.interventions.base import applied
from geolens.interventions.masking import branch_hook
from geolens.interventions.sink_values import NORM_EDIT_KINDS, SinkEditSpec, sink_edit
from geolens.sinks.drift import head_cone_statistics, next_token_nll
from geolens.stats import bootstrap_indices, percentile_ci, resample_means
from geolens.stats import verdict as ci_verdict

ALL = "all"
ROTATE_POOLED = "rotate (pooled)"


def default_conditions(lambdas: Sequence[float] = (0.0, 2.0), seeds: Sequence[int] = (0, 1, 2)) -> list[SinkEditSpec]:
    """scale λ, rescale_mean_norm, corpus_mean, rotate per seed, random_token λ (λ = 1 is dropped).

    >>> [spec.label for spec in default_conditions(lambdas=(0.0, 1.0), seeds=(0,))]
    ['scale λ=0', 'rescale_mean_norm', 'corpus_mean', 'rotate seed=0', 'random_token λ=0']
    """
    lambdas = [float(x) for x in lambdas if float(x) != 1.0]
    specs = [SinkEditSpec("scale", lam) for lam in lambdas]
    specs += [SinkEditSpec("rescale_mean_norm"), SinkEditSpec("corpus_mean")]
    specs += [SinkEditSpec("rotate", seed=int(s)) for s in seeds]
    specs += [SinkEditSpec("random_token", lam) for lam in lambdas]
    return specs


def _window_layer_stats(model, cache, layer: int) -> tuple[np.ndarray, np.ndarray]:
    """Per batch row: mean ‖o_i^h‖ and mean cos(o_i^h, s_i^h) over heads and queries i ≥ 1 that
    can see the sink (queries outside a sliding window are NaN and left out)."""
    norm, cos, _ = head_cone_statistics(
        get_attention_layer(model, cache, layer, dtype=torch.float64), window=sliding_window(model, layer)
    )
    b = norm.shape[0]
    return torch.nanmean(norm.reshape(b, -1), dim=1).cpu().numpy(), torch.nanmean(
        cos.reshape(b, -1), dim=1
    ).cpu().numpy()


def corpus_pass(model, tokens: torch.Tensor, *, batch_size: int = 8, progress: bool = False):
    """First pass: corpus mean of v_0 ``{layer: [n_kv, d_head]}`` (float64), clean per-window NLL
    ``[window]`` and clean head-output norm / cone cosine ``[window, layer]``."""
    L = int(model.cfg.n_layers)
    names = {hook_name(l, n) for l in range(L) for n in (PATTERN, VALUE)}
    sums = {l: 0.0 for l in range(L)}
    nll, norm, cos = [], [], []
    it = range(0, tokens.shape[0], batch_size)
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(it, desc="sink controls: clean pass")
    with torch.no_grad():
        for start in it:
            batch = tokens[start : start + batch_size]
            logits, cache = model.run_with_cache(batch, names_filter=lambda n: n in names)
            nll.append(next_token_nll(logits, batch).mean(1).cpu().numpy())
            n_l, c_l = [], []
            for l in range(L):
                sums[l] = sums[l] + cache[hook_name(l, VALUE)][:, 0].to(torch.float64).sum(0).cpu()
                a, b = _window_layer_stats(model, cache, l)
                n_l.append(a)
                c_l.append(b)
            norm.append(np.stack(n_l, 1))
            cos.append(np.stack(c_l, 1))
            del logits, cache
    means = {l: sums[l] / tokens.shape[0] for l in range(L)}
    return means, np.concatenate(nll), np.concatenate(norm), np.concatenate(cos)


def _capture_hooks(layers, store: dict):
    def make(name):
        def hook(x, hook=None):
            store[name] = x.detach()

        return hook

    return [(hook_name(l, n), make(hook_name(l, n))) for l in layers for n in (VALUE, PATTERN)]


def edited_window(
    model,
    window: torch.Tensor,
    specs: Sequence[SinkEditSpec],
    layers: Sequence[int],
    *,
    corpus_means=None,
    position=None,
):
    """One window ``[1, pos]`` under every spec (one row each, branched at the first edited layer).

    Returns per spec: mean next-token NLL, and mean ‖o_i^h‖ and cos(o_i^h, s_i^h) over the
    ``layers`` (all heads, queries i ≥ 1) in the edited forward pass, each ``[n_specs]``.
    """
    if window.ndim != 2 or window.shape[0] != 1:
        raise ValueError(f"window must be one sequence [1, pos], got shape {tuple(window.shape)}")
    layers = sorted(int(l) for l in layers)
    store: dict = {}
    edit = sink_edit(model, list(specs), layers=layers, corpus_means=corpus_means, position=position)
    hooks = [branch_hook(model, layers[0], len(specs))] + list(edit.fwd_hooks) + _capture_hooks(layers, store)
    with torch.no_grad(), applied(model, hooks):
        logits = model(window, return_type="logits")
    nll = next_token_nll(logits, window.expand(len(specs), -1)).mean(1).cpu().numpy()
    del logits
    norms, coss = [], []
    for l in layers:
        a, b = _window_layer_stats(model, store, l)
        norms.append(a)
        coss.append(b)
    return nll, np.mean(norms, 0), np.mean(coss, 0)


def _pct(x: np.ndarray, ci: float) -> tuple[np.ndarray, np.ndarray]:
    """The percentile interval over the bootstrap axis 0, NaN resamples left out (:func:`geolens.stats.percentile_ci`)."""
    return percentile_ci(x, ci, omit_nan=True)


@dataclass
class ControlsResult:
    """Tables of :func:`sink_controls` (see the module docstring).

    - ``conditions``: per (scope, edit): ``n_windows``, ``ppl``, ``delta_ppl`` [lo, hi], head output
      norm ``out_norm`` [lo, hi] with ``out_norm_clean`` and ``out_norm_ratio`` [lo, hi], cone cosine
      ``cos_cone`` [lo, hi] with ``cos_cone_clean`` and ``delta_cos`` [lo, hi];
    - ``pairs``: per (scope, norm edit, control): ``diff`` = ΔPPL(norm edit) − ΔPPL(control) [lo, hi]
      and ``verdict`` (norm edit larger / control larger / tie);
    - ``scopes``: per scope the claim "the sink's norm specifically matters" (holds / fails /
      undecided);
    - ``windows``: the per-window values everything is computed from.
    """

    conditions: pd.DataFrame
    pairs: pd.DataFrame
    scopes: pd.DataFrame
    windows: pd.DataFrame
    clean_ppl: float
    n_windows: int
    seq_len: int
    n_boot: int
    ci: float
    model_mode: str
    settings: dict = field(default_factory=dict)

    def summary(self) -> dict:
        held = self.scopes[self.scopes.scope != ALL]
        out = {
            "n_windows": self.n_windows,
            "seq_len": self.seq_len,
            "n_boot": self.n_boot,
            "ci": self.ci,
            "clean_ppl": self.clean_ppl,
            "model_mode": self.model_mode,
            **self.settings,
            "claim_by_scope": dict(zip(self.scopes.scope, self.scopes.claim)),
            "layers_claim_holds": [int(s) for s, c in zip(held.scope, held.claim) if c == "holds"],
            "layers_claim_fails": [int(s) for s, c in zip(held.scope, held.claim) if c == "fails"],
        }
        all_rows = self.conditions[self.conditions.scope == ALL]
        out["all_layers"] = all_rows[
            ["edit", "delta_ppl", "delta_ppl_lo", "delta_ppl_hi", "out_norm_ratio", "delta_cos"]
        ].to_dict(orient="records")
        out["all_layers_pairs"] = self.pairs[self.pairs.scope == ALL][
            ["norm_edit", "control", "diff", "diff_lo", "diff_hi", "verdict"]
        ].to_dict(orient="records")
        return out


def _verdict(lo: float, hi: float) -> str:
    """:func:`geolens.stats.verdict` of ΔPPL(norm edit) − ΔPPL(control), in this table's words."""
    v = ci_verdict(lo, hi)
    return {"holds": "norm edit larger", "reversed": "control larger"}.get(v, v)


def sink_controls(
    model,
    tokens: torch.Tensor,
    *,
    conditions: Sequence[SinkEditSpec] | None = None,
    layers: Sequence[int] | None = None,
    all_layers: bool = True,
    n_boot: int = 2000,
    ci: float = 0.95,
    seed: int = 0,
    batch_size: int = 8,
    progress: bool = False,
) -> ControlsResult:
    """Run the controls (module docstring) on ``tokens`` ``[window, pos]`` (BOS first, unpadded).

    ``conditions``: the edits (default :func:`default_conditions`); ``layers``: the layers edited
    one at a time (default every layer; ``[]`` for none); ``all_layers``: also edit all layers at
    once. ``seed`` draws the random non-sink position of each window and the bootstrap.
    """
    specs = list(default_conditions() if conditions is None else conditions)
    if not specs:
        raise ValueError("no edit conditions given")
    if not all(isinstance(s, SinkEditSpec) for s in specs):
        raise TypeError("conditions must be SinkEditSpec objects")
    L = int(model.cfg.n_layers)
    layers = list(range(L)) if layers is None else sorted({int(l) for l in layers})
    bad = [l for l in layers if not 0 <= l < L]
    if bad:
        raise IndexError(f"layers {bad} out of range for a model with {L} layers")
    scopes = ([ALL] if all_layers else []) + [str(l) for l in layers]
    if not scopes:
        raise ValueError("nothing to edit: no layers and all_layers=False")
    if tokens.ndim != 2 or tokens.shape[1] < 3:
        raise ValueError(f"tokens must be [window, pos] with pos ≥ 3, got shape {tuple(tokens.shape)}")
    if not 0 < ci < 1:
        raise ValueError(f"ci must be in (0, 1), got {ci}")
    W, T = int(tokens.shape[0]), int(tokens.shape[1])
    rng = np.random.default_rng(seed)
    positions = rng.integers(1, T, size=W)
    means, clean_nll, clean_norm, clean_cos = corpus_pass(model, tokens, batch_size=batch_size, progress=progress)
    means = {l: m.to(torch.float32) for l, m in means.items()}
    C, S = len(specs), len(scopes)
    nll = np.zeros((W, S, C))
    norm = np.zeros((W, S, C))
    cos = np.zeros((W, S, C))
    it = range(W)
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(it, desc=f"sink controls: {S} scopes × {C} edits")
    for w in it:
        for s, scope in enumerate(scopes):
            scope_layers = list(range(L)) if scope == ALL else [int(scope)]
            nll[w, s], norm[w, s], cos[w, s] = edited_window(
                model, tokens[w : w + 1], specs, scope_layers, corpus_means=means, position=int(positions[w])
            )
    clean_norm_s = np.stack([clean_norm.mean(1) if sc == ALL else clean_norm[:, int(sc)] for sc in scopes], 1)  # [W, S]
    clean_cos_s = np.stack([clean_cos.mean(1) if sc == ALL else clean_cos[:, int(sc)] for sc in scopes], 1)

    # pooled rotation: one more condition column (per-window means over seeds; ΔPPL pooled below)
    labels = [sp.label for sp in specs]
    rot = [i for i, sp in enumerate(specs) if sp.kind == "rotate"]

    boot = bootstrap_indices(W, n_boot, seed + 1)  # [B, W]: the same windows for every edit and the clean run
    clean_ppl_b = np.exp(resample_means(clean_nll, boot))  # [B]
    dppl_b = np.exp(resample_means(nll, boot)) - clean_ppl_b[:, None, None]  # [B, S, C]
    dppl = np.exp(nll.mean(0)) - np.exp(clean_nll.mean())  # [S, C]
    cn_b, cc_b = resample_means(clean_norm_s, boot), resample_means(clean_cos_s, boot)  # [B, S]
    cols = {lab: i for i, lab in enumerate(labels)}

    def series(lab):
        """(point ΔPPL [S], boot ΔPPL [B, S], point/boot norm and cos) of a label or the pooled rotation."""
        if lab == ROTATE_POOLED:
            return (dppl[:, rot].mean(1), dppl_b[:, :, rot].mean(2), norm[:, :, rot].mean(2), cos[:, :, rot].mean(2))
        i = cols[lab]
        return dppl[:, i], dppl_b[:, :, i], norm[:, :, i], cos[:, :, i]

    rows = []
    all_labels = labels + ([ROTATE_POOLED] if len(rot) > 1 else [])
    for lab in all_labels:
        d, db, nw, cw = series(lab)
        nb, cb = resample_means(nw, boot), resample_means(cw, boot)
        ratio_b = nb / cn_b
        dcos_b = cb - cc_b
        d_lo, d_hi = _pct(db, ci)
        n_lo, n_hi = _pct(nb, ci)
        r_lo, r_hi = _pct(ratio_b, ci)
        c_lo, c_hi = _pct(cb, ci)
        dc_lo, dc_hi = _pct(dcos_b, ci)
        spec = specs[cols[lab]] if lab in cols else SinkEditSpec("rotate")
        for s, scope in enumerate(scopes):
            rows.append(
                dict(
                    scope=scope,
                    edit=lab,
                    kind=spec.kind,
                    lam=spec.lam if spec.kind in ("scale", "random_token") else np.nan,
                    seed=spec.seed if spec.kind == "rotate" and lab != ROTATE_POOLED else np.nan,
                    n_windows=W,
                    ppl=float(np.exp(np.mean(clean_nll)) + d[s]),
                    delta_ppl=float(d[s]),
                    delta_ppl_lo=float(d_lo[s]),
                    delta_ppl_hi=float(d_hi[s]),
                    out_norm=float(nw[:, s].mean()),
                    out_norm_lo=float(n_lo[s]),
                    out_norm_hi=float(n_hi[s]),
                    out_norm_clean=float(clean_norm_s[:, s].mean()),
                    out_norm_ratio=float(nw[:, s].mean() / clean_norm_s[:, s].mean()),
                    out_norm_ratio_lo=float(r_lo[s]),
                    out_norm_ratio_hi=float(r_hi[s]),
                    cos_cone=float(np.nanmean(cw[:, s])),
                    cos_cone_lo=float(c_lo[s]),
                    cos_cone_hi=float(c_hi[s]),
                    cos_cone_clean=float(np.nanmean(clean_cos_s[:, s])),
                    delta_cos=float(np.nanmean(cw[:, s]) - np.nanmean(clean_cos_s[:, s])),
                    delta_cos_lo=float(dc_lo[s]),
                    delta_cos_hi=float(dc_hi[s]),
                )
            )
    conditions_df = pd.DataFrame(rows)

    # pairs: every norm edit against its controls
    controls_of = {}
    rot_label = ROTATE_POOLED if len(rot) > 1 else (labels[rot[0]] if rot else None)
    for i, sp in enumerate(specs):
        if sp.kind not in NORM_EDIT_KINDS or (sp.kind == "scale" and sp.lam == 1.0):
            continue
        ctrl = [rot_label] if rot_label else []
        ctrl += [labels[j] for j, o in enumerate(specs) if o.kind == "corpus_mean"]
        if sp.kind == "scale":
            ctrl += [labels[j] for j, o in enumerate(specs) if o.kind == "random_token" and o.lam == sp.lam]
        controls_of[labels[i]] = ctrl
    pair_rows = []
    for edit_lab, ctrls in controls_of.items():
        d_e, b_e, _, _ = series(edit_lab)
        for c_lab in ctrls:
            d_c, b_c, _, _ = series(c_lab)
            lo, hi = _pct(b_e - b_c, ci)
            for s, scope in enumerate(scopes):
                pair_rows.append(
                    dict(
                        scope=scope,
                        norm_edit=edit_lab,
                        control=c_lab,
                        n_windows=W,
                        diff=float(d_e[s] - d_c[s]),
                        diff_lo=float(lo[s]),
                        diff_hi=float(hi[s]),
                        verdict=_verdict(lo[s], hi[s]),
                    )
                )
    pairs_df = pd.DataFrame(
        pair_rows, columns=["scope", "norm_edit", "control", "n_windows", "diff", "diff_lo", "diff_hi", "verdict"]
    )
    scope_rows = []
    for scope in scopes:
        v = pairs_df.loc[pairs_df.scope == scope, "verdict"]
        claim = (
            "undecided"
            if v.empty
            else (
                "holds"
                if (v == "norm edit larger").all()
                else ("fails" if (v == "control larger").any() else "undecided")
            )
        )
        scope_rows.append(
            dict(
                scope=scope,
                n_pairs=int(len(v)),
                n_norm_edit_larger=int((v == "norm edit larger").sum()),
                n_control_larger=int((v == "control larger").sum()),
                n_tie=int((v == "tie").sum()),
                claim=claim,
            )
        )
    win = pd.DataFrame(
        [
            dict(
                window=w,
                scope=sc,
                edit=labels[c],
                random_position=int(positions[w]),
                nll=nll[w, s, c],
                out_norm=norm[w, s, c],
                cos_cone=cos[w, s, c],
                clean_nll=clean_nll[w],
                clean_out_norm=clean_norm_s[w, s],
                clean_cos_cone=clean_cos_s[w, s],
            )
            for w in range(W)
            for s, sc in enumerate(scopes)
            for c in range(C)
        ]
    )
    settings = {
        "conditions": labels,
        "layers": layers,
        "all_layers": bool(all_layers),
        "seed": int(seed),
        "kv_heads": list(range(n_kv_heads(model))),
    }
    return ControlsResult(
        conditions_df,
        pairs_df,
        pd.DataFrame(scope_rows),
        win,
        float(np.exp(clean_nll.mean())),
        W,
        T,
        int(n_boot),
        float(ci),
        model_mode(model),
        settings,
    )


__all__ = [
    "ALL",
    "ROTATE_POOLED",
    "ControlsResult",
    "corpus_pass",
    "default_conditions",
    "edited_window",
    "sink_controls",
]
