"""Sink-intervention controls: does the sink's *norm* matter, or only its exact value? (docs/method.md §4.5)

Two experiments live here.

**Dose-matched controls** (:func:`dose_controls`), the pre-registered test of
docs/faithfulness/PROTOCOL.md §6 (the ``"sink_controls"`` block of protocol.json, read by
:func:`read_protocol`). The sink's value vector v_0 (position 0) is edited at every sixth layer
(0, 6, 12, …, all in the same forward pass):

- norm edits v_0 ← λ v_0, λ ∈ {0, 0.5, 1.5, 2}, which move v_0 by ‖Δv_0‖ = |1 − λ|·‖v_0‖;
- rotations v_0 ← cos θ v_0 + sin θ ‖v_0‖ u by θ ∈ {30°, 60°, 90°, 180°} in the plane spanned by
  v_0 and u, the seeded Gaussian direction g of (seed, layer, kv head)
  (:func:`geolens.interventions.sink_values.rotation_direction`) orthogonalised against v_0 and
  normalised; they keep ‖v_0‖ and move it by 2 sin(θ/2)·‖v_0‖. Seeds 0–19 at 60°, 0–4 at the other
  angles; seed s gives the same plane at every angle.

The **dose** of an edit is ‖Δv_0‖/‖v_0‖ (:func:`edit_dose`): λ = 0, λ = 2 and the 60° rotation
all have dose 1. Each edit is applied to the v_0 of the forward pass it runs in: v_0 of layer 6 is
the one that layer computes after the edit of layer 0 (position 0 attends only to itself, so the
edit of layer 0 reaches it).

Scopes (:data:`SCOPES`):

- ``all_heads``: every query head of the edited layers;
- ``sink_heads``: only the query heads that are sink heads by geolens' criterion
  (:func:`gu_sink_heads`): Gu et al. (2024) call a head a sink head in a window when its mean
  attention on the first token, (1/T) Σ_i α_i0, exceeds ε = 0.3
  (:func:`geolens.sinks.geometry.layer_sink_statistics`), and a sink head here is one that is a
  sink head in more than half of the sample's windows (``gu_sink_share > 0.5``, the heads that
  ``geolens sinks`` counts as sink heads), found at each edited layer on the clean windows of the
  run itself.

Grouped-query attention: v_0 lives per kv head, shared by the query heads of a group, and a
group may hold sink heads and other heads. The edit is made per *query* head, exactly:
replacing v_0 by v_0' for head h alone changes its output z_i^h = Σ_j α_ij^h v_j into
z_i^h + α_i0^h (v_0' − v_0) and nothing else
(:func:`geolens.interventions.sink_values.sink_edit_query_heads`). v_0' is the same vector in
both scopes (the edit of the kv head's v_0); the ``sink_heads`` scope gives it to the sink heads
only. With every head selected this equals editing ``hook_v`` (tested).

**Sample** (:func:`controls_sample`): 100 windows of 64 tokens, two from each of the first 50
Lee documents that the model's tokenizer turns into at least 126 tokens (special tokens not
counted), in corpus order. Document d gives the windows [BOS] + t_0 … t_62 and
[BOS] + t_63 … t_125 (consecutive, no overlap, the rest of the document unused).

**Outcomes** per window and edit, over the window's 63 next-token predictions, in float64:
ΔPPL = exp(mean NLL edited) − exp(mean NLL clean), and the mean of KL(p_clean ‖ p_edited) of the
next-token distributions.

**Statistics** (:func:`dose_summary`, all resampling from :mod:`geolens.stats`): documents are
the clusters. One generator ``numpy.random.default_rng(seed)`` draws, in this order, B document
resamples (:func:`geolens.stats.cluster_bootstrap_indices`: documents with replacement, each
bringing both of its windows) and then, for each angle in ascending order, B seed resamples
(:func:`geolens.stats.bootstrap_indices` over that angle's seeds). Resample b of a rotation's mean
is the mean of x[w, s] over the windows w of document resample b and the seeds s of seed resample
b (seeds are crossed with windows: one plane per seed serves every window), so seed variance
enters the interval; a norm edit uses the document resamples alone. The same resamples serve
every edit, scope and outcome, so comparisons are paired. The dose–response table gives each
(scope, edit, λ or θ) with its dose, n windows, documents and seeds, and mean ΔPPL and KL with
95% percentile intervals.

**Verdict per scope** at the matched dose 1: Δ = KL(norm edit) − KL(rotation), the norm edit
averaged over the λ of dose 1 (0 and 2) per window, the rotation over the seeds of the angle of
dose 1 (60°). Δ > 0 ("holds") says that shrinking or growing v_0 changes the predictions more
than turning it by the same distance. The two scopes form one Holm family
(:func:`geolens.stats.holm_family`: raw and adjusted p, the interval at the pair's Holm level, the
verdict from the interval within the step-down). The same difference for ΔPPL is reported as
exploratory (its own Holm adjustment, no verdict). A scope without any sink head at the edited
layers would equal the clean model: its pair is "not testable". A run whose settings differ from
the protocol is exploratory: every number, no verdict.

**Cost:** per window one clean forward and 2 × (4 + 35) = 78 edited forwards of 64 tokens (4 norm
edits, 5 + 20 + 5 + 5 rotations, two scopes), run as rows of batched forwards branched at the first
edited layer (:func:`geolens.interventions.masking.branch_hook`; that layer is 0, so only the
embedding is shared), about 79 × 64 × (parameters, unembedding included) multiply-adds: some
0.7 T for SmolLM2-135M and 1.4 T for Gemma 3 270M (its 262 144-token unembedding), that is about
25 s and 50 s per window at the 28 G multiply-adds per second of PROTOCOL.md §8 (an estimate from
the count, not a timing), or 40 and 80 minutes for the 100 windows. Smoke timing on
a tiny random model (7 layers, d_model 32, vocabulary 64, one torch thread on the shared 2-core
machine under load): about 0.6 s per window, nearly all of it the forwards' fixed overhead, so
it says nothing about the real models; their cost is the count above.

**Earlier controls** (:func:`sink_controls`). Scaling v_0 by λ in every layer at once raises
perplexity for λ = 2 more than for λ = 0, which shows that the model needs the sink value as it
is, not that its small norm is what matters. This experiment separates the two with edits of v_0
(:func:`geolens.interventions.sink_values.sink_edit`) in one layer at a time and in all layers at
once:

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

import json
import math
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Literal, Mapping, Sequence, get_args

import numpy as np
import pandas as pd
import torch

from geolens.adapter import PATTERN, VALUE, adapter_for, get_attention_layer, hook_name, model_mode, n_kv_heads, sliding_window
from geolens.checkpoint import atomic_write_bytes, model_fingerprint, tokens_fingerprint
from geolens.data import bos_token_id
from geolens.interventions.base import applied
from geolens.interventions.masking import branch_hook
from geolens.interventions.sink_values import NORM_EDIT_KINDS, SinkEditSpec, sink_edit, sink_edit_query_heads
from geolens.sinks.drift import head_cone_statistics, next_token_nll
from geolens.sinks.geometry import GU_EPSILON
from geolens.stats import bootstrap_indices, cluster_bootstrap_indices, holm_family, percentile_ci, resample_means
from geolens.stats import verdict as ci_verdict
from geolens.validation import check_context

ALL = "all"
ROTATE_POOLED = "rotate (pooled)"


def default_conditions(lambdas: Sequence[float] = (0.0, 2.0), seeds: Sequence[int] = (0, 1, 2)) -> list[SinkEditSpec]:
    """scale λ, rescale_mean_norm, corpus_mean, rotate per seed, random_token λ (λ = 1 is dropped)."""
    lambdas = [float(x) for x in lambdas if float(x) != 1.0]
    specs = [SinkEditSpec("scale", lam) for lam in lambdas]
    specs += [SinkEditSpec("rescale_mean_norm"), SinkEditSpec("corpus_mean")]
    specs += [SinkEditSpec("rotate", seed=int(s)) for s in seeds]
    specs += [SinkEditSpec("random_token", lam) for lam in lambdas]
    return specs


def _window_layer_stats(model, cache, layer: int) -> tuple[np.ndarray, np.ndarray]:
    """Per batch row: mean ‖o_i^h‖ and mean cos(o_i^h, s_i^h) over heads and queries i ≥ 1 that
    can see the sink (queries outside a sliding window are NaN and left out)."""
    norm, cos, _ = head_cone_statistics(get_attention_layer(model, cache, layer, dtype=torch.float64), window=sliding_window(model, layer))
    b = norm.shape[0]
    return torch.nanmean(norm.reshape(b, -1), dim=1).cpu().numpy(), torch.nanmean(cos.reshape(b, -1), dim=1).cpu().numpy()


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


def edited_window(model, window: torch.Tensor, specs: Sequence[SinkEditSpec], layers: Sequence[int], *, corpus_means=None, position=None):
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
            "n_windows": self.n_windows, "seq_len": self.seq_len, "n_boot": self.n_boot, "ci": self.ci,
            "clean_ppl": self.clean_ppl, "model_mode": self.model_mode, **self.settings,
            "claim_by_scope": dict(zip(self.scopes.scope, self.scopes.claim)),
            "layers_claim_holds": [int(s) for s, c in zip(held.scope, held.claim) if c == "holds"],
            "layers_claim_fails": [int(s) for s, c in zip(held.scope, held.claim) if c == "fails"],
        }  # fmt: skip
        all_rows = self.conditions[self.conditions.scope == ALL]
        out["all_layers"] = all_rows[["edit", "delta_ppl", "delta_ppl_lo", "delta_ppl_hi", "out_norm_ratio", "delta_cos"]].to_dict(orient="records")
        out["all_layers_pairs"] = self.pairs[self.pairs.scope == ALL][["norm_edit", "control", "diff", "diff_lo", "diff_hi", "verdict"]].to_dict(orient="records")
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
            rows.append(dict(
                scope=scope, edit=lab, kind=spec.kind, lam=spec.lam if spec.kind in ("scale", "random_token") else np.nan,
                seed=spec.seed if spec.kind == "rotate" and lab != ROTATE_POOLED else np.nan, n_windows=W,
                ppl=float(np.exp(np.mean(clean_nll)) + d[s]), delta_ppl=float(d[s]), delta_ppl_lo=float(d_lo[s]), delta_ppl_hi=float(d_hi[s]),
                out_norm=float(nw[:, s].mean()), out_norm_lo=float(n_lo[s]), out_norm_hi=float(n_hi[s]),
                out_norm_clean=float(clean_norm_s[:, s].mean()), out_norm_ratio=float(nw[:, s].mean() / clean_norm_s[:, s].mean()),
                out_norm_ratio_lo=float(r_lo[s]), out_norm_ratio_hi=float(r_hi[s]),
                cos_cone=float(np.nanmean(cw[:, s])), cos_cone_lo=float(c_lo[s]), cos_cone_hi=float(c_hi[s]),
                cos_cone_clean=float(np.nanmean(clean_cos_s[:, s])), delta_cos=float(np.nanmean(cw[:, s]) - np.nanmean(clean_cos_s[:, s])),
                delta_cos_lo=float(dc_lo[s]), delta_cos_hi=float(dc_hi[s]),
            ))  # fmt: skip
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
                pair_rows.append(dict(
                    scope=scope, norm_edit=edit_lab, control=c_lab, n_windows=W, diff=float(d_e[s] - d_c[s]),
                    diff_lo=float(lo[s]), diff_hi=float(hi[s]), verdict=_verdict(lo[s], hi[s]),
                ))  # fmt: skip
    pairs_df = pd.DataFrame(pair_rows, columns=["scope", "norm_edit", "control", "n_windows", "diff", "diff_lo", "diff_hi", "verdict"])
    scope_rows = []
    for scope in scopes:
        v = pairs_df.loc[pairs_df.scope == scope, "verdict"]
        claim = "undecided" if v.empty else ("holds" if (v == "norm edit larger").all() else ("fails" if (v == "control larger").any() else "undecided"))
        scope_rows.append(dict(scope=scope, n_pairs=int(len(v)), n_norm_edit_larger=int((v == "norm edit larger").sum()),
                               n_control_larger=int((v == "control larger").sum()), n_tie=int((v == "tie").sum()), claim=claim))  # fmt: skip
    win = pd.DataFrame(
        [dict(window=w, scope=sc, edit=labels[c], random_position=int(positions[w]), nll=nll[w, s, c], out_norm=norm[w, s, c],
              cos_cone=cos[w, s, c], clean_nll=clean_nll[w], clean_out_norm=clean_norm_s[w, s], clean_cos_cone=clean_cos_s[w, s])
         for w in range(W) for s, sc in enumerate(scopes) for c in range(C)]
    )  # fmt: skip
    settings = {"conditions": labels, "layers": layers, "all_layers": bool(all_layers), "seed": int(seed), "kv_heads": list(range(n_kv_heads(model)))}
    return ControlsResult(
        conditions_df, pairs_df, pd.DataFrame(scope_rows), win, float(np.exp(clean_nll.mean())), W, T, int(n_boot), float(ci),
        model_mode(model), settings,
    )  # fmt: skip


# =============================================================================================
# Dose-matched controls (docs/faithfulness/PROTOCOL.md §6; module docstring)

SinkScope = Literal["all_heads", "sink_heads"]
SCOPES: tuple[str, ...] = get_args(SinkScope)
SINK_HEAD_SHARE = 0.5
"""A sink head is one that is a Gu et al. sink head (ε = 0.3) in more than this share of the windows."""
OUTCOMES: tuple[str, ...] = ("delta_ppl", "kl")
CHECKPOINT_FORMAT = "geolens sink dose controls checkpoint 1"
MIN_WINDOWS, MIN_DOCUMENTS = 100, 50
"""The smallest sample a verdict may come from (PROTOCOL.md §6)."""
WINDOW_COLUMNS = ("window", "document", "scope", "edit", "lam", "degrees", "seed", "dose", "nll_clean", "nll", "delta_ppl", "kl")
_ORDINALS = {"first": 1, "second": 2, "third": 3, "fourth": 4, "fifth": 5, "sixth": 6, "seventh": 7, "eighth": 8, "ninth": 9, "tenth": 10}


def edit_dose(spec: SinkEditSpec) -> float:
    """‖Δv_0‖/‖v_0‖ of an edit of v_0: |1 − λ| for ``scale``, 1 for ``remove``, 2 sin(θ/2) for a
    rotation by θ (``rotate``; 90° without ``degrees``), rounded to 12 decimals.

    >>> [edit_dose(s) for s in (SinkEditSpec("scale", 0.0), SinkEditSpec("scale", 1.5), SinkEditSpec("rotate", degrees=60))]
    [1.0, 0.5, 1.0]
    """
    if spec.kind == "scale":
        return round(abs(1.0 - float(spec.lam)), 12)
    if spec.kind == "remove":
        return 1.0
    if spec.kind == "rotate":
        theta = math.radians(90.0 if spec.degrees is None else float(spec.degrees))
        return round(2.0 * abs(math.sin(theta / 2.0)), 12)
    raise ValueError(f"the dose of a {spec.kind!r} edit depends on the data (it is defined for scale, remove and rotate)")


@dataclass(frozen=True)
class DoseProtocol:
    """Settings of :func:`dose_controls`; the defaults are those of protocol v2 (PROTOCOL.md §6).

    ``layer_step``: v_0 is edited at layers 0, step, 2·step, …; ``lambdas``: the norm edits;
    ``seeds_by_angle``: ((θ in degrees, number of seeds), …), seeds 0 … n − 1 at each angle;
    ``n_documents`` × ``windows_per_document`` windows of ``seq_len`` tokens (:func:`controls_sample`);
    ``matched_dose``: the dose of the verdict; ``n_boot``, ``seed``, ``alpha``: the bootstrap and
    Holm's level; ``corpus``: where the documents come from.

    >>> p = DoseProtocol()
    >>> p.layers(30), p.n_windows, p.matched_lambdas, p.matched_degrees, len(p.edits())
    ([0, 6, 12, 18, 24], 100, (0.0, 2.0), (60.0,), 39)
    """

    layer_step: int = 6
    lambdas: tuple[float, ...] = (0.0, 0.5, 1.5, 2.0)
    seeds_by_angle: tuple[tuple[float, int], ...] = ((30.0, 5), (60.0, 20), (90.0, 5), (180.0, 5))
    n_documents: int = 50
    windows_per_document: int = 2
    seq_len: int = 64
    scopes: tuple[str, ...] = SCOPES
    matched_dose: float = 1.0
    n_boot: int = 2000
    seed: int = 0
    alpha: float = 0.05
    corpus: str = "lee"

    def __post_init__(self):
        def put(name, value):
            object.__setattr__(self, name, value)

        put("lambdas", tuple(float(x) for x in self.lambdas))
        put("seeds_by_angle", tuple(sorted((float(a), int(n)) for a, n in self.seeds_by_angle)))
        put("scopes", tuple(str(x) for x in self.scopes))
        for name in ("layer_step", "n_documents", "windows_per_document", "n_boot"):
            if int(getattr(self, name)) != getattr(self, name) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be an integer ≥ 1, got {getattr(self, name)!r}")
        if self.seq_len < 3:
            raise ValueError(f"seq_len must be at least 3 (BOS and two tokens), got {self.seq_len}")
        if not self.lambdas or not all(math.isfinite(x) for x in self.lambdas) or 1.0 in self.lambdas or len(set(self.lambdas)) < len(self.lambdas):
            raise ValueError(f"lambdas must be distinct finite numbers other than 1 (λ = 1 edits nothing), got {list(self.lambdas)}")
        angles = [a for a, _ in self.seeds_by_angle]
        if not angles or len(set(angles)) < len(angles) or not all(0 < a <= 360 and math.isfinite(a) for a in angles):
            raise ValueError(f"rotation angles must be distinct degrees in (0, 360], got {angles}")
        if any(n < 1 for _, n in self.seeds_by_angle):
            raise ValueError(f"every angle needs at least one seed, got {dict(self.seeds_by_angle)}")
        if not self.scopes or len(set(self.scopes)) < len(self.scopes) or any(x not in SCOPES for x in self.scopes):
            raise ValueError(f"scopes must be distinct names from {', '.join(SCOPES)}, got {list(self.scopes)}")
        if not (math.isfinite(self.matched_dose) and self.matched_dose > 0):
            raise ValueError(f"matched_dose must be a positive number, got {self.matched_dose}")
        if not self.matched_lambdas or not self.matched_degrees:
            raise ValueError(f"the verdict needs a norm edit and a rotation of dose {self.matched_dose:g}: "
                             f"lambdas {list(self.lambdas)} and angles {angles} give none for one of them")  # fmt: skip
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha}")

    @property
    def degrees(self) -> tuple[float, ...]:
        return tuple(a for a, _ in self.seeds_by_angle)

    @property
    def n_windows(self) -> int:
        return self.n_documents * self.windows_per_document

    def seeds(self, degrees: float) -> tuple[int, ...]:
        """The rotation seeds at ``degrees``: 0 … n − 1."""
        return tuple(range(dict(self.seeds_by_angle)[float(degrees)]))

    def layers(self, n_layers: int) -> list[int]:
        """The edited layers of a model with ``n_layers`` layers: 0, step, 2·step, …"""
        return list(range(0, int(n_layers), self.layer_step))

    def _matched(self, spec: SinkEditSpec) -> bool:
        return math.isclose(edit_dose(spec), self.matched_dose, rel_tol=1e-9)

    @property
    def matched_lambdas(self) -> tuple[float, ...]:
        return tuple(x for x in self.lambdas if self._matched(SinkEditSpec("scale", x)))

    @property
    def matched_degrees(self) -> tuple[float, ...]:
        return tuple(a for a in self.degrees if self._matched(SinkEditSpec("rotate", degrees=a)))

    def edits(self) -> list[SinkEditSpec]:
        """Every edit of one scope: the norm edits by λ, then the rotations by angle and seed."""
        specs = [SinkEditSpec("scale", x) for x in self.lambdas]
        return specs + [SinkEditSpec("rotate", seed=s, degrees=a) for a in self.degrees for s in self.seeds(a)]

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["lambdas"], out["scopes"] = list(self.lambdas), list(self.scopes)
        out["seeds_by_angle"] = {f"{a:g}": n for a, n in self.seeds_by_angle}
        return out

    @classmethod
    def from_dict(cls, d: Mapping) -> "DoseProtocol":
        """The inverse of :meth:`to_dict` (e.g. from a saved ``controls_summary.json``'s ``settings``)."""
        d = dict(d)
        d["seeds_by_angle"] = tuple((float(a), int(n)) for a, n in dict(d["seeds_by_angle"]).items())
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})

    def differences(self, other: "DoseProtocol") -> list[str]:
        """The settings in which this protocol differs from ``other``, one phrase each."""
        mine, theirs = self.to_dict(), other.to_dict()
        return [f"{k} {mine[k]!r} instead of {theirs[k]!r}" for k in mine if mine[k] != theirs[k]]


def _need(block: dict, key: str, where: str):
    if key not in block:
        raise ValueError(f"{where} has no {key!r}")
    return block[key]


def _layer_step(text) -> int:
    """6 from "every sixth layer" (or "every 6th layer", or 6)."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    m = re.fullmatch(r"every (\w+) layer", str(text).strip())
    word = m.group(1) if m else ""
    if word in _ORDINALS:
        return _ORDINALS[word]
    digits = re.fullmatch(r"(\d+)(st|nd|rd|th)", word)
    if digits:
        return int(digits.group(1))
    raise ValueError(f"sink_controls.layers: expected 'every <ordinal> layer' (e.g. 'every sixth layer'), got {text!r}")


def read_protocol(source) -> tuple[DoseProtocol, dict]:
    """The dose-matched controls of a pre-registered protocol: ``source`` is the path of its
    machine-readable twin (``docs/faithfulness/protocol.json``) or the twin already read by
    :func:`geolens.faithfulness.preregistered.load_protocol`, which also hashes the text
    ``PROTOCOL.md`` beside it.

    Returns (:class:`DoseProtocol`, provenance): ``protocol_file``, ``protocol_version``,
    ``protocol_sha256`` (SHA-256 of the text), ``pre_registered`` (that hash equals the one
    recorded in ``PROTOCOL.sha256`` beside it), and the protocol's ``models``, ``model_mode`` and
    ``dtype``. The ``"sink_controls"`` block gives the edits, seeds, sample and scopes;
    ``"statistics"`` ``n_boot``, ``seed`` and ``alpha``; ``"data"`` the corpus. Anything missing or
    of the wrong kind is a ``ValueError`` naming it.
    """
    from geolens.faithfulness.preregistered import Preregistered, load_protocol

    twin = source if isinstance(source, Preregistered) else load_protocol(source)
    path, raw = Path(twin.path), twin.settings
    if not isinstance(raw, dict) or not isinstance(raw.get("sink_controls"), dict):
        raise ValueError(f'{path}: no "sink_controls" block (a protocol.json of geolens\' faithfulness protocol)')
    block, where = raw["sink_controls"], f"{path}: sink_controls"
    stats = raw.get("statistics") if isinstance(raw.get("statistics"), dict) else {}
    data = raw.get("data") if isinstance(raw.get("data"), dict) else {}
    try:
        by_angle = _need(block, "rotation_seeds_by_angle", where)
        if not isinstance(by_angle, dict):
            raise ValueError(f"{where}.rotation_seeds_by_angle must map angles to seed counts")
        seeds = tuple((float(a), int(n)) for a, n in by_angle.items())
        listed = sorted(float(a) for a in _need(block, "rotation_degrees", where))
        if listed != sorted(a for a, _ in seeds):
            raise ValueError(f"{where}: rotation_degrees {listed} and the angles of rotation_seeds_by_angle differ")
        n_windows, n_documents = int(_need(block, "n_windows", where)), int(_need(block, "n_documents", where))
        if n_documents < 1 or n_windows % n_documents:
            raise ValueError(f"{where}: n_windows {n_windows} is not a whole number of windows per document ({n_documents} documents)")
        outcomes = list(block.get("outcomes", OUTCOMES))
        if sorted(outcomes) != sorted(OUTCOMES):
            raise ValueError(f"{where}.outcomes: this code measures {list(OUTCOMES)}, the protocol asks for {outcomes}")
        if block.get("multiple_comparison", "holm") != "holm":
            raise ValueError(f"{where}.multiple_comparison: only holm is implemented, got {block['multiple_comparison']!r}")
        protocol = DoseProtocol(
            layer_step=_layer_step(_need(block, "layers", where)), lambdas=tuple(float(x) for x in _need(block, "lambdas", where)),
            seeds_by_angle=seeds, n_documents=n_documents, windows_per_document=n_windows // n_documents,
            seq_len=int(_need(block, "seq_len", where)), scopes=tuple(_need(block, "scopes", where)),
            matched_dose=float(_need(block, "matched_dose", where)), n_boot=int(stats.get("n_boot", 2000)),
            seed=int(stats.get("seed", 0)), alpha=float(stats.get("alpha", 0.05)), corpus=str(data.get("corpus", "lee")),
        )  # fmt: skip
    except (TypeError, AttributeError) as err:
        raise ValueError(f"{where}: a setting has the wrong type ({err})") from None
    frozen = path.with_name("PROTOCOL.sha256")
    info = {
        "protocol_file": str(path), "protocol_version": raw.get("version"), "protocol_sha256": twin.sha256,
        "pre_registered": frozen.is_file() and frozen.read_text(encoding="utf-8").strip() == twin.sha256,
        "models": list(data.get("models", [])), "model_mode": data.get("model_mode"), "dtype": data.get("dtype"),
    }  # fmt: skip
    return protocol, info


def protocol_deviations(protocol: DoseProtocol, registered: DoseProtocol, info: dict, *, model: str, mode: str, dtype: str) -> list[str]:
    """Why a run is exploratory (empty: it runs the protocol): settings other than the
    registered ones, a protocol text whose hash is not the recorded one, a model, TransformerLens
    mode or dtype other than the protocol's."""
    out = protocol.differences(registered)
    if not info.get("pre_registered"):
        out.append("the protocol text's SHA-256 is not the one recorded beside it")
    if info.get("models") and model not in info["models"]:
        out.append(f"model {model} is not one of the protocol's ({', '.join(info['models'])})")
    if info.get("model_mode") and mode != info["model_mode"]:
        out.append(f"model mode {mode} instead of {info['model_mode']}")
    if info.get("dtype") and dtype != info["dtype"]:
        out.append(f"dtype {dtype} instead of {info['dtype']}")
    if protocol.n_windows < MIN_WINDOWS or protocol.n_documents < MIN_DOCUMENTS:
        out.append(f"{protocol.n_windows} windows from {protocol.n_documents} documents, fewer than {MIN_WINDOWS} from {MIN_DOCUMENTS}")
    return out


def controls_sample(model, docs: Sequence[str], *, seq_len: int = 64, n_documents: int = 50, per_document: int = 2) -> tuple[torch.Tensor, np.ndarray]:
    """The sample of the dose-matched controls: ``per_document`` consecutive windows from each of the
    first ``n_documents`` long-enough documents.

    Each document is tokenised by the model's tokenizer without special tokens, t_0, t_1, …; it is
    eligible when it has at least ``per_document`` × (``seq_len`` − 1) tokens (126 for two windows
    of 64). The first ``n_documents`` eligible documents, in corpus order, give the windows
    [BOS] + t_{k(T−1)} … t_{(k+1)(T−1)−1} for k = 0 … ``per_document`` − 1, T = ``seq_len`` (the
    first windows :func:`geolens.data.token_windows` cuts from the document). Returns the windows
    ``[n_documents · per_document, seq_len]`` and each window's document (its index in ``docs``).
    Too few eligible documents is a ``ValueError`` saying how many there are.

    >>> from geolens.testing import tiny_bridge
    >>> tokens, documents = controls_sample(tiny_bridge("gqa"), ["a b c d e f g h", "no", "0123456789"], seq_len=4, n_documents=2)
    >>> tokens.shape, documents.tolist()
    (torch.Size([4, 4]), [0, 0, 2, 2])
    """
    body = int(seq_len) - 1
    if body < 1 or n_documents < 1 or per_document < 1:
        raise ValueError(f"need seq_len ≥ 2, n_documents ≥ 1 and per_document ≥ 1, got {seq_len}, {n_documents}, {per_document}")
    check_context(model, int(seq_len), name=f"seq_len {seq_len}: a window")
    bos = bos_token_id(model)
    rows, documents, eligible = [], [], 0
    for d, doc in enumerate(docs):
        ids = model.tokenizer(doc, add_special_tokens=False)["input_ids"]
        if len(ids) < per_document * body:
            continue
        eligible += 1
        rows += [[bos] + ids[k * body : (k + 1) * body] for k in range(per_document)]
        documents += [d] * per_document
        if eligible == n_documents:
            break
    if eligible < n_documents:
        raise ValueError(f"only {eligible} of {len(docs)} documents have at least {per_document * body} tokens; {n_documents} are needed")
    return torch.tensor(rows, dtype=torch.long), np.asarray(documents, dtype=np.int64)


def gu_sink_heads(model, tokens: torch.Tensor, layers: Sequence[int], *, eps: float = GU_EPSILON, share: float = SINK_HEAD_SHARE,
                  batch_size: int = 8) -> pd.DataFrame:  # fmt: skip
    """Which query heads of ``layers`` are sink heads on ``tokens`` (module docstring).

    One row per (layer, head): ``kv_head``, ``gu_sink_share`` (the share of windows where the head's
    mean attention on the first token, query 0 included, exceeds ``eps``;
    :func:`geolens.sinks.geometry.sink_geometry`) and ``sink_head`` (``gu_sink_share > share``).

    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")
    >>> list(gu_sink_heads(model, tiny_tokens(model, length=8), [1]).columns)
    ['layer', 'head', 'kv_head', 'gu_sink_share', 'sink_head']
    """
    from geolens.sinks.geometry import sink_geometry

    heads = sink_geometry(model, tokens, batch_size=batch_size, eps=eps, layers=list(layers)).heads
    out = heads[["layer", "head", "kv_head", "gu_sink_share"]].copy()
    out["sink_head"] = out["gu_sink_share"] > share
    return out.reset_index(drop=True)


def _head_map(table: pd.DataFrame) -> dict[int, tuple[int, ...]]:
    """``{layer: sink heads}`` from a :func:`gu_sink_heads` table (every layer, possibly empty)."""
    return {int(l): tuple(int(h) for h in g.loc[g.sink_head, "head"]) for l, g in table.groupby("layer")}


@dataclass
class DoseWindow:
    """One window's outcomes under the edits of :func:`dose_window` (float64)."""

    nll_clean: float  # mean next-token NLL of the clean forward
    nll: np.ndarray  # [edit]: mean NLL of each edited forward
    kl: np.ndarray  # [edit]: mean over predictions of KL(p_clean ‖ p_edited)

    @property
    def delta_ppl(self) -> np.ndarray:
        return np.exp(self.nll) - math.exp(self.nll_clean)


def clean_log_probs(model, window: torch.Tensor) -> torch.Tensor:
    """log p(· | t_≤i) of the clean forward, float64 ``[pos − 1, d_vocab]`` (``window`` ``[1, pos]``)."""
    if window.ndim != 2 or window.shape[0] != 1 or window.shape[1] < 2:
        raise ValueError(f"window must be one sequence [1, pos] with pos ≥ 2, got shape {tuple(window.shape)}")
    with torch.no_grad():
        logits = model(window, return_type="logits")
    return torch.log_softmax(logits[0, :-1].to(torch.float64), dim=-1)


def default_rows_per_forward(model, seq_len: int) -> int:
    """Rows of one batched forward: float32 logits of at most 2^26 numbers (256 MiB), at most 16 rows."""
    return max(1, min(16, 2**26 // (int(seq_len) * int(model.cfg.d_vocab))))


def dose_window(
    model,
    window: torch.Tensor,
    specs: Sequence[SinkEditSpec],
    layers: Sequence[int],
    *,
    heads=None,
    rows_per_forward: int | None = None,
    clean: torch.Tensor | None = None,
) -> DoseWindow:
    """One window ``[1, pos]`` under every edit of ``specs`` at ``layers``, for the query ``heads``
    (``None``: all; else ``{layer: heads}``, :func:`geolens.interventions.sink_values.sink_edit_query_heads`).

    The edits run as rows of batched forwards, ``rows_per_forward`` at a time (default
    :func:`default_rows_per_forward`), branched at the first edited layer
    (:func:`geolens.interventions.masking.branch_hook`). ``clean``: the window's
    :func:`clean_log_probs`, when already computed. NLL and KL are computed in float64 over all
    ``pos − 1`` predictions, one row at a time.
    """
    specs = list(specs)
    if not specs:
        raise ValueError("no edit to run")
    ref = clean_log_probs(model, window) if clean is None else clean
    if ref.shape[0] != window.shape[1] - 1:
        raise ValueError(f"clean log-probabilities for {ref.shape[0]} predictions, the window has {window.shape[1] - 1}")
    target = window[0, 1:, None].to(ref.device)
    p_ref = ref.exp()
    n = int(rows_per_forward or default_rows_per_forward(model, window.shape[1]))
    if n < 1:
        raise ValueError(f"rows_per_forward must be ≥ 1, got {rows_per_forward}")
    nll, kl = [], []
    for start in range(0, len(specs), n):
        chunk = specs[start : start + n]
        edit = sink_edit_query_heads(model, chunk, layers=layers, heads=heads)
        if not edit.layers:
            raise ValueError("the edit selects no head at any layer: nothing to edit")
        hooks = [branch_hook(model, edit.layers[0], len(chunk))] + list(edit.fwd_hooks)
        with torch.no_grad(), applied(model, hooks):
            logits = model(window, return_type="logits")
        for r in range(len(chunk)):
            lp = torch.log_softmax(logits[r, :-1].to(torch.float64), dim=-1)
            nll.append(float(-lp.gather(-1, target).mean()))
            kl.append(float((p_ref * (ref - lp)).sum(-1).mean()))
            del lp
        del logits
    return DoseWindow(float(-ref.gather(-1, target).mean()), np.asarray(nll), np.asarray(kl))


def two_stage_means(x, window_draws, seed_draws) -> np.ndarray:
    """Resampled means of ``x`` ``[window, seed]``: resample b is the mean of x[w, s] over the windows
    ``window_draws[b]`` (e.g. :func:`geolens.stats.cluster_bootstrap_indices` of the documents) and
    the seeds ``seed_draws[b]`` (:func:`geolens.stats.bootstrap_indices` over the seeds), ``[B]``.

    >>> x = np.array([[1.0, 3.0], [5.0, 7.0]])
    >>> two_stage_means(x, [np.array([0, 0]), np.array([1, 0])], np.array([[1, 1], [0, 1]])).tolist()
    [3.0, 4.0]
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"x must be [window, seed], got shape {x.shape}")
    if len(window_draws) != len(seed_draws):
        raise ValueError(f"{len(window_draws)} window resamples for {len(seed_draws)} seed resamples")
    return np.array([x[np.ix_(np.asarray(w), np.asarray(s))].mean() for w, s in zip(window_draws, seed_draws)])


def _num(x) -> float | None:
    """A float for JSON (None for NaN)."""
    x = float(x)
    return None if math.isnan(x) else x


def dose_summary(windows: pd.DataFrame, protocol: DoseProtocol = DoseProtocol(), *, verdicts: bool = True, level: float = 0.95,
                 not_testable: dict[str, str] | None = None) -> dict:  # fmt: skip
    """The dose–response table and the verdicts, from the per-window table of :func:`dose_controls`.

    ``windows`` has the columns of :data:`WINDOW_COLUMNS`, one row per (window, scope, edit, seed),
    complete (every window under every edit of ``protocol`` in every scope not in
    ``not_testable``, a ``{scope: reason}`` for scopes with nothing to edit). Everything follows
    the module docstring: the resamples are drawn here, from ``protocol.seed``, so that the
    summary recomputes exactly from a saved table. ``verdicts=False`` (an exploratory run): every
    number, no verdict. Returns a JSON-ready dict: ``dose_response`` (records), ``pairs`` (the
    Holm family on KL), ``exploratory_pairs`` (the same on ΔPPL, no verdicts), the sample sizes,
    seeds and bootstrap settings.
    """
    not_testable = dict(not_testable or {})
    missing = [c for c in WINDOW_COLUMNS if c not in windows.columns]
    if missing:
        raise ValueError(f"the windows table lacks the columns {missing}")
    win = windows[["window", "document"]].drop_duplicates().sort_values("window")
    if win.window.duplicated().any():
        raise ValueError("a window of the table belongs to two documents")
    order = {int(w): i for i, w in enumerate(win.window)}
    docs = win.document.to_numpy()
    W, G = len(order), int(len(np.unique(docs)))
    rng = np.random.default_rng(protocol.seed)
    doc_draws = cluster_bootstrap_indices(docs, protocol.n_boot, rng)  # documents with replacement
    seed_draws = {a: bootstrap_indices(len(protocol.seeds(a)), protocol.n_boot, rng) for a in protocol.degrees}  # then seeds
    groups = {k: g for k, g in windows.groupby(["scope", "edit"])}

    def table(scope: str, kind: str, value: float, outcome: str) -> np.ndarray:
        """``[window]`` (scale) or ``[window, seed]`` (rotate) of ``outcome``, checked complete."""
        g = groups.get((scope, kind))
        col = "lam" if kind == "scale" else "degrees"
        sub = g[g[col] == value] if g is not None else windows.iloc[:0]
        rows = sub.window.map(order).to_numpy()
        if kind == "scale":
            if len(sub) != W or len(set(rows)) != W:
                raise ValueError(f"{scope}, λ = {value:g}: {len(sub)} rows for {W} windows")
            out = np.empty(W)
            out[rows] = sub[outcome].to_numpy(dtype=np.float64)
            return out
        seeds = protocol.seeds(value)
        cols = sub.seed.astype(int).map({s: i for i, s in enumerate(seeds)}).to_numpy()
        if len(sub) != W * len(seeds) or np.isnan(cols.astype(float)).any() or len(set(zip(rows, cols))) != W * len(seeds):
            raise ValueError(f"{scope}, {value:g}°: {len(sub)} rows for {W} windows × {len(seeds)} seeds")
        out = np.empty((W, len(seeds)))
        out[rows, cols.astype(int)] = sub[outcome].to_numpy(dtype=np.float64)
        return out

    live = [s for s in protocol.scopes if s not in not_testable]
    stray = sorted(set(windows.scope) - set(live))
    if stray:
        raise ValueError(f"the table holds scopes {stray} that are not tested")
    dose_rows = []
    for scope in live:
        for lam in protocol.lambdas:
            row = dict(scope=scope, edit="scale", lam=lam, degrees=None, dose=edit_dose(SinkEditSpec("scale", lam)), n_windows=W,
                       n_documents=G, n_seeds=0, bootstrap="documents")  # fmt: skip
            for outcome in OUTCOMES:
                x = table(scope, "scale", lam, outcome)
                lo, hi = percentile_ci(resample_means(x, doc_draws), level)
                row.update({outcome: float(x.mean()), f"{outcome}_low": float(lo), f"{outcome}_high": float(hi)})
            dose_rows.append(row)
        for a in protocol.degrees:
            row = dict(scope=scope, edit="rotate", lam=None, degrees=a, dose=edit_dose(SinkEditSpec("rotate", degrees=a)), n_windows=W,
                       n_documents=G, n_seeds=len(protocol.seeds(a)), bootstrap="documents, then seeds")  # fmt: skip
            for outcome in OUTCOMES:
                x = table(scope, "rotate", a, outcome)
                lo, hi = percentile_ci(two_stage_means(x, doc_draws, seed_draws[a]), level)
                row.update({outcome: float(x.mean()), f"{outcome}_low": float(lo), f"{outcome}_high": float(hi)})
            dose_rows.append(row)

    def family(outcome: str, decide: bool) -> list[dict]:
        estimates, samples, testable, parts = [], [], [], []
        for scope in protocol.scopes:
            if scope in not_testable:
                estimates.append(float("nan"))
                samples.append(np.array([np.nan]))
                testable.append(False)
                parts.append((None, None))
                continue
            norm = np.mean([table(scope, "scale", lam, outcome) for lam in protocol.matched_lambdas], axis=0)  # [window]
            rots = [table(scope, "rotate", a, outcome) for a in protocol.matched_degrees]
            rot_mean = float(np.mean([x.mean() for x in rots]))
            rot_samples = np.mean([two_stage_means(x, doc_draws, seed_draws[a]) for x, a in zip(rots, protocol.matched_degrees)], axis=0)
            estimates.append(float(norm.mean()) - rot_mean)
            samples.append(resample_means(norm, doc_draws) - rot_samples)
            testable.append(True)
            parts.append((float(norm.mean()), rot_mean))
        tests = holm_family(estimates, samples, testable=testable, alpha=protocol.alpha)
        out = []
        for scope, t, (norm_mean, rot_mean) in zip(protocol.scopes, tests, parts):
            verdict = t.verdict if (decide or t.verdict == "not testable") else None
            out.append(dict(
                scope=scope, outcome=outcome, statistic=f"{outcome}(norm edit) - {outcome}(rotation) at dose {protocol.matched_dose:g}",
                lambdas=list(protocol.matched_lambdas), degrees=list(protocol.matched_degrees), norm_edit=norm_mean, rotation=rot_mean,
                estimate=_num(t.estimate), ci_low=_num(t.ci_low), ci_high=_num(t.ci_high), level=_num(t.level), p=_num(t.p),
                p_adj=_num(t.p_adj), rank=int(t.rank), holm_stopped_at=int(t.holm_stopped_at), rules_differ=bool(t.rules_differ),
                verdict=verdict, n_windows=W if scope not in not_testable else 0, n_documents=G if scope not in not_testable else 0,
                n_seeds=sum(len(protocol.seeds(a)) for a in protocol.matched_degrees), note=not_testable.get(scope),
            ))  # fmt: skip
        return out

    return {
        "n_windows": W, "n_documents": G, "n_boot": protocol.n_boot, "bootstrap_seed": protocol.seed, "level": level,
        "alpha": protocol.alpha, "multiple_comparison": "holm",
        "bootstrap": "documents with replacement (cluster_bootstrap_indices), then for rotations seeds with replacement, crossed with the windows",
        "seeds": {f"{a:g}": list(protocol.seeds(a)) for a in protocol.degrees}, "not_testable": not_testable,
        "dose_response": dose_rows, "pairs": family("kl", verdicts),
        "exploratory_pairs": family("delta_ppl", False),
    }  # fmt: skip


@dataclass
class DoseControlsResult:
    """:func:`dose_controls`' result: the per-window table, the sink heads and the summary.

    - ``windows``: one row per (window, scope, edit, seed) with the columns of
      :data:`WINDOW_COLUMNS` (``lam`` for norm edits, ``degrees`` and ``seed`` for rotations);
    - ``sink_heads``: :func:`gu_sink_heads`' table at the edited layers;
    - ``statistics``: :func:`dose_summary` of ``windows``.
    """

    windows: pd.DataFrame
    sink_heads: pd.DataFrame
    statistics: dict
    protocol: DoseProtocol
    layers: list
    model_mode: str
    verdicts: bool

    @property
    def dose_response(self) -> pd.DataFrame:
        return pd.DataFrame(self.statistics["dose_response"])

    @property
    def pairs(self) -> pd.DataFrame:
        return pd.DataFrame(self.statistics["pairs"] + self.statistics["exploratory_pairs"])

    def summary(self) -> dict:
        clean = self.windows.drop_duplicates("window")
        return {
            "experiment": "dose-matched sink controls (docs/faithfulness/PROTOCOL.md section 6)",
            "model_mode": self.model_mode, "layers": [int(l) for l in self.layers], "scopes": list(self.protocol.scopes),
            "settings": self.protocol.to_dict(),
            "sink_head_criterion": f"Gu et al. (2024) sink head (mean attention on the first token > {GU_EPSILON:g}) in more than "
                                   f"{SINK_HEAD_SHARE:g} of the windows, at each edited layer",
            "sink_heads": {str(l): list(h) for l, h in _head_map(self.sink_heads).items()},
            "query_heads_edited": "per query head through hook_z: z_i^h + alpha_i0^h (v_0' - v_0); a kv head's other query heads untouched",
            "clean_ppl": float(np.exp(clean.nll_clean).mean()), "verdicts": self.verdicts,
            **self.statistics,
        }  # fmt: skip


class CheckpointMismatch(ValueError):
    """A checkpoint of :func:`dose_controls` that belongs to another run (or is no such checkpoint)."""


def _json_plain(x):
    return json.loads(json.dumps(x, default=lambda v: v.item() if hasattr(v, "item") else str(v)))


def dose_controls(
    model,
    tokens: torch.Tensor,
    documents,
    protocol: DoseProtocol = DoseProtocol(),
    *,
    sink_heads: Mapping[int, Sequence[int]] | None = None,
    checkpoint=None,
    resume: bool = False,
    rows_per_forward: int | None = None,
    verdicts: bool = True,
    batch_size: int = 8,
    progress: bool = False,
) -> DoseControlsResult:
    """The dose-matched sink controls (module docstring) on ``tokens`` ``[window, pos]`` (BOS first,
    unpadded; :func:`controls_sample`), ``documents[w]`` the source document of window w.

    ``sink_heads``: ``{layer: query heads}`` of the ``sink_heads`` scope (default: found by
    :func:`gu_sink_heads` on ``tokens``). ``checkpoint``: a JSON file rewritten atomically
    (:func:`geolens.checkpoint.atomic_write_bytes`) after every window; ``resume=True`` continues
    from it (refused, naming the difference, if it was made with another model, sample,
    protocol, sink heads or batching). ``verdicts=False`` for an exploratory run.
    """
    if tokens.ndim != 2 or tokens.shape[1] < 3:
        raise ValueError(f"tokens must be [window, pos] with pos ≥ 3, got shape {tuple(tokens.shape)}")
    documents = np.asarray(documents)
    if documents.shape != (tokens.shape[0],):
        raise ValueError(f"documents must name one document per window: {documents.shape} for {tokens.shape[0]} windows")
    L = int(model.cfg.n_layers)
    layers = protocol.layers(L)
    if sink_heads is None:
        heads_table = gu_sink_heads(model, tokens, layers, batch_size=batch_size)
    else:
        extra = sorted(int(l) for l in sink_heads if int(l) not in layers)
        if extra:
            raise ValueError(f"sink_heads names layers {extra} that are not edited (layers {layers})")
        rows = [dict(layer=l, head=h, kv_head=adapter_for(model).kv_head_of(h), gu_sink_share=float("nan"),
                     sink_head=h in {int(x) for x in sink_heads.get(l, ())}) for l in layers for h in range(model.cfg.n_heads)]  # fmt: skip
        heads_table = pd.DataFrame(rows)
    head_map = _head_map(heads_table)
    not_testable = {}
    if "sink_heads" in protocol.scopes and not any(head_map.values()):
        not_testable["sink_heads"] = f"no sink head at the edited layers {layers}: the edit would leave the model clean"
    scope_heads = {"all_heads": None, "sink_heads": head_map}
    live = [s for s in protocol.scopes if s not in not_testable]
    specs = protocol.edits()
    n_rows = int(rows_per_forward or default_rows_per_forward(model, tokens.shape[1]))
    fingerprint = _json_plain({
        "model": model_fingerprint(model), "tokens": tokens_fingerprint(tokens), "documents": documents.tolist(),
        "protocol": protocol.to_dict(), "layers": layers, "sink_heads": {str(l): list(h) for l, h in head_map.items()},
        "rows_per_forward": n_rows, "edits": [s.label for s in specs],
    })  # fmt: skip
    done: dict = {}
    path = Path(checkpoint) if checkpoint is not None else None
    if path is not None and resume and path.is_file():
        try:
            state = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise CheckpointMismatch(f"{path}: not a readable checkpoint ({err})") from None
        if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
            raise CheckpointMismatch(f"{path}: not a checkpoint of the dose-matched sink controls")
        other = [k for k in fingerprint if state.get("fingerprint", {}).get(k) != fingerprint[k]]
        if other:
            raise CheckpointMismatch(f"{path} was made with another {', '.join(other)}; use a new output folder or --overwrite")
        done = state["windows"]
    todo = [w for w in range(tokens.shape[0]) if str(w) not in done]
    it = todo
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(todo, desc=f"sink dose controls: {len(live)} scopes × {len(specs)} edits", initial=len(done), total=tokens.shape[0])
    for w in it:
        window = tokens[w : w + 1]
        ref = clean_log_probs(model, window)
        entry = {}
        for scope in live:
            res = dose_window(model, window, specs, layers, heads=scope_heads[scope], rows_per_forward=n_rows, clean=ref)
            entry["nll_clean"] = res.nll_clean
            entry[scope] = {"nll": res.nll.tolist(), "kl": res.kl.tolist()}
        del ref
        done[str(w)] = entry
        if path is not None:
            atomic_write_bytes(path, json.dumps({"format": CHECKPOINT_FORMAT, "fingerprint": fingerprint, "windows": done}).encode())
    rows = []
    for w in range(tokens.shape[0]):
        entry = done[str(w)]
        for scope in live:
            for s, spec in enumerate(specs):
                nll, nll_clean = float(entry[scope]["nll"][s]), float(entry["nll_clean"])
                rot = spec.kind == "rotate"
                rows.append(dict(
                    window=w, document=documents[w].item(), scope=scope, edit=spec.kind, lam=np.nan if rot else spec.lam,
                    degrees=spec.degrees if rot else np.nan, seed=spec.seed if rot else pd.NA, dose=edit_dose(spec),
                    nll_clean=nll_clean, nll=nll, delta_ppl=math.exp(nll) - math.exp(nll_clean), kl=float(entry[scope]["kl"][s]),
                ))  # fmt: skip
    table = pd.DataFrame(rows, columns=list(WINDOW_COLUMNS))
    table["seed"] = table["seed"].astype("Int64")
    stats = dose_summary(table, protocol, verdicts=verdicts, not_testable=not_testable)
    return DoseControlsResult(table, heads_table, stats, protocol, layers, model_mode(model), bool(verdicts))


def read_windows(path) -> pd.DataFrame:
    """A saved ``controls_windows.csv`` of :func:`dose_controls`, with every float as written
    (``float_precision="round_trip"``), so that :func:`dose_summary` recomputes the summary exactly."""
    table = pd.read_csv(path, float_precision="round_trip")
    table["seed"] = table["seed"].astype("Int64")
    return table


def write_windows(table: pd.DataFrame, path) -> None:
    """Write the per-window table with 17 significant digits (every float64 round-trips)."""
    table.to_csv(path, index=False, float_format="%.17g")


__all__ = [
    "ALL", "MIN_DOCUMENTS", "MIN_WINDOWS", "ROTATE_POOLED", "SCOPES", "SINK_HEAD_SHARE", "WINDOW_COLUMNS", "CheckpointMismatch", "ControlsResult", "DoseControlsResult", "DoseProtocol",
    "DoseWindow", "clean_log_probs", "controls_sample", "corpus_pass", "default_conditions", "default_rows_per_forward", "dose_controls", "dose_summary",
    "dose_window", "edit_dose", "edited_window", "gu_sink_heads", "protocol_deviations", "read_protocol",
    "read_windows", "sink_controls", "two_stage_means", "write_windows",
]  # fmt: skip
