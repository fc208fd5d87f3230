"""Generate the support matrix: which geolens quantities are verified on which model family and backend.

For every family of :mod:`geolens.hf.tiny` (tiny random ``transformers`` models built offline from
their configs) and every backend — the HF-native backend (:mod:`geolens.hf`), TransformerLens 4.x's
``TransformerBridge`` and TransformerLens 2.x's ``HookedTransformer`` over the same weights — the
checks below run through geolens' public functions and compare with references computed here
independently (explicit float64 loops over the cached pattern and values, or full reruns of the
model):

- ``attention_rebuild``: Σ_h Σ_j α_ij^h v_j^h W_O^h + b_O equals the model's own attention output;
- ``contributions``: contribution weights (intra and inter) equal the naive float64 loops, and
  their rows sum to 1;
- ``padding``: a left-padded and a right-padded batch equal each prompt run alone (logits at the
  real positions and contribution weights);
- ``sinks``: the sink rate and the projected sink norm ratio of ``sink_geometry`` equal a naive
  float64 computation (sliding windows respected);
- ``value_zeroing``: Value Zeroing equals a full rerun with v_j zeroed in ``hook_v``;
- ``per_term``: per-term effects (single-position forwards over a KV cache) equal full reruns
  with α_ij^h = 0 in ``hook_pattern``;
- ``report``: the report of ``geolens report --quick`` (its quick configuration, on 3 + 1 random
  windows of 24 tokens) builds every section of this install, and its per-head sink attention
  equals a naive float64 mean of α_i0 over the cached pattern (queries that see the sink).

A cell is ``pass``, ``fail`` (with a one-line reason), ``unsupported`` (geolens refuses the
computation with a clear error, quoted) or ``not hosted`` (the backend cannot hold the family).

TransformerLens 2.x and 4.x cannot share an environment: the ``tl2-hooked`` column runs this script
under ``.venvs/tl2/bin/python`` (``--column tl2-hooked --to FILE``, JSON) and is merged; without
``.venvs/tl2`` the script stops with an error saying how to build it. Its models are converted
from the same in-memory HF model by :func:`hooked_from_hf`. Usage::

    python scripts/support_matrix.py            # writes docs/support.md and docs/support.json
    python scripts/support_matrix.py --out DIR  # elsewhere

``tests/test_support_matrix.py`` regenerates the matrix and fails when a cell changed or the
committed files are stale.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Callable

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import geolens  # noqa: E402
from geolens.adapter import adapter_for, get_attention_layer  # noqa: E402
from geolens.hf.tiny import FAMILIES, tiny_family  # noqa: E402

N_POS = 12  # longer than the tiny sliding windows (8)
PAD_ID = 2

CHECKS = {
    "attention_rebuild": "Σ_h Σ_j α_ij^h v_j^h W_O^h + b_O equals the model's attention output",
    "contributions": "contribution weights (intra, inter) equal naive float64 loops; rows sum to 1",
    "padding": "a left- and a right-padded batch equal each prompt run alone (logits, contributions)",
    "sinks": "sink rate and projected sink norm ratio equal a naive float64 computation",
    "value_zeroing": "Value Zeroing equals a full rerun with v_j zeroed",
    "per_term": "per-term effects over a KV cache equal full reruns with α_ij^h = 0",
    "report": "geolens report --quick builds every section; its per-head sink attention equals a naive float64 mean",
}

BACKENDS = {
    "hf": "HF-native (geolens.hf, transformers eager attention)",
    "tl4-bridge": "TransformerLens 4.x TransformerBridge (compatibility mode off)",
    "tl2-hooked": "TransformerLens 2.x HookedTransformer (converted from the HF model, weights unprocessed; run in .venvs/tl2)",
}

TL2_PYTHON = ROOT / ".venvs" / "tl2" / "bin" / "python"

FAMILY_NOTES = {
    "llama": "RMSNorm, rotary, GQA",
    "mistral": "sliding window on every layer",
    "qwen2": "q/k/v biases, sliding window on some layers",
    "qwen3": "q/k norms",
    "gemma2": "attention and final soft-capping, post-attention norm, alternating windows",
    "gemma3": "q/k norms, post-attention norm, alternating windows",
    "phi3": "fused qkv projection, sliding window",
    "olmo2": "q/k norms, norms after attention and MLP",
    "gpt2": "absolute positions, LayerNorm, Conv1D, biases",
    "gpt_neox": "parallel attention and MLP, partial rotary, fused per-head qkv",
}


class Failed(Exception):
    """A check's result differs from its reference (the message is the one-line reason)."""


def _tokens(n_rows: int = 2, n_pos: int = N_POS, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(4, 64, (n_rows, n_pos), generator=g)
    t[:, 0] = 0
    return t


def _close(a: torch.Tensor, b: torch.Tensor, atol: float, what: str) -> None:
    err = float((a.double() - b.double()).abs().max())
    if not err <= atol:
        raise Failed(f"{what} differ from the reference (max abs error above {atol:g})")


def _weights(model, layer: int):
    W_O, b_O = adapter_for(model).output_weights(layer)
    return W_O.detach().double(), b_O.detach().double()


def _cache(model, tokens, **kwargs):
    with torch.no_grad():
        return geolens.run_with_cache(model, tokens, **kwargs)


# ---------------------------------------------------------------------------------------------
# The checks: each raises Failed, or NotImplementedError / ValueError from geolens (unsupported)


def _attention_outputs(model, tokens, names: list[str]):
    """The cache of ``names`` and every layer's attention output, the attention module's own:
    ``adapter.attn_out_hook(l)``, or, on a ``HookedTransformer`` that normalises after attention
    (no hook holds the sum before that norm), the output of ``blocks[l].attn`` read by a PyTorch
    forward hook."""
    adapter, layers = adapter_for(model), range(model.cfg.n_layers)
    try:
        hooks = [adapter.attn_out_hook(l) for l in layers]
    except ValueError:
        hooks = None
    if hooks is not None:
        _, cache = _cache(model, tokens, names_filter=names + hooks)
        return cache, [cache[h] for h in hooks]
    outputs: dict[int, torch.Tensor] = {}
    handles = [
        model.blocks[l].attn.register_forward_hook(lambda mod, args, out, l=l: outputs.__setitem__(l, out.detach()))
        for l in layers
    ]
    try:
        _, cache = _cache(model, tokens, names_filter=names)
    finally:
        for handle in handles:
            handle.remove()
    return cache, [outputs[l] for l in layers]


def check_attention_rebuild(model) -> None:
    adapter, tokens = adapter_for(model), _tokens()
    names = [n for l in range(model.cfg.n_layers) for n in (adapter.pattern_hook(l), adapter.value_hook(l))]
    cache, attn_out = _attention_outputs(model, tokens, names)
    for l in range(model.cfg.n_layers):
        pattern, v = cache[adapter.pattern_hook(l)].double(), cache[adapter.value_hook(l)].double()
        W_O, b_O = _weights(model, l)
        group = model.cfg.n_heads // v.shape[2]
        out = torch.zeros(*pattern.shape[:1], pattern.shape[2], W_O.shape[-1], dtype=torch.float64)
        for h in range(model.cfg.n_heads):
            vt = v[:, :, h // group] @ W_O[h]  # ṽ_j^h
            out += torch.einsum("bqk,bkm->bqm", pattern[:, h], vt)
        _close(out + b_O, attn_out[l], 1e-5, f"layer {l}: the rebuilt attention outputs")


def check_contributions(model) -> None:
    tokens = _tokens()
    _, cache = _cache(model, tokens, names_filter=geolens.names_filter(model))
    for l in range(model.cfg.n_layers):
        view = get_attention_layer(model, cache, l, dtype=torch.float64)
        W_O, _ = _weights(model, l)
        pair = geolens.contribution_weights(model, cache, l, mode="both", dtype=torch.float64)
        n_heads, (b_n, _, q_n, k_n) = view.n_heads, view.pattern.shape
        for b in range(b_n):
            for i in range(q_n):
                terms = torch.zeros(n_heads, k_n, W_O.shape[-1], dtype=torch.float64)
                for h in range(n_heads):
                    for j in range(k_n):
                        terms[h, j] = view.pattern[b, h, i, j] * (view.v[b, j, h] @ W_O[h])
                heads, total = terms.sum(1), terms.sum((0, 1))
                for h in range(n_heads):
                    _close(
                        pair.intra[b, h, i],
                        terms[h] @ heads[h] / heads[h].dot(heads[h]),
                        1e-9,
                        f"layer {l}: intra contributions",
                    )
                    _close(
                        pair.inter[b, h, i],
                        terms[h] @ total / total.dot(total),
                        1e-9,
                        f"layer {l}: inter contributions",
                    )
        _close(pair.intra.sum(-1), torch.ones(b_n, n_heads, q_n), 1e-9, f"layer {l}: intra row sums")
        _close(pair.inter.sum((1, 3)), torch.ones(b_n, q_n), 1e-9, f"layer {l}: inter row sums")


def check_padding(model) -> None:
    short, other = _tokens(1, 8, seed=1)[0], _tokens(1, N_POS, seed=2)[0]
    pad = N_POS - 8
    with torch.no_grad():
        alone_logits, alone = _cache(model, short[None], names_filter=geolens.names_filter(model))
    for side in ("left", "right"):
        row = (
            torch.cat([torch.full((pad,), PAD_ID), short])
            if side == "left"
            else torch.cat([short, torch.full((pad,), PAD_ID)])
        )
        tokens, mask = torch.stack([row, other]), torch.ones(2, N_POS, dtype=torch.long)
        real = slice(pad, N_POS) if side == "left" else slice(0, 8)
        mask[0, : pad if side == "left" else N_POS] = 0
        mask[0, real] = 1
        logits, cache = _cache(model, tokens, attention_mask=mask, names_filter=geolens.names_filter(model))
        _close(logits[0, real], alone_logits[0], 2e-5, f"{side}-padded row: logits")
        for l in range(model.cfg.n_layers):
            padded = geolens.contribution_weights(model, cache, l, attention_mask=mask)
            _close(
                padded[0][:, real, real],
                geolens.contribution_weights(model, alone, l)[0],
                2e-5,
                f"{side}-padded row: layer {l} contributions",
            )


def check_sinks(model) -> None:
    from geolens.sinks import sink_geometry

    tokens = _tokens(3)
    heads = sink_geometry(model, tokens, batch_size=3).heads.set_index(["layer", "head"])
    _, cache = _cache(model, tokens, names_filter=geolens.names_filter(model))
    for l in range(model.cfg.n_layers):
        view = get_attention_layer(model, cache, l, dtype=torch.float64)
        W_O, _ = _weights(model, l)
        window = adapter_for(model).sliding_window(l)
        last = (
            N_POS if window is None else min(N_POS, window)
        )  # queries and tail keys that share a window with the sink
        for h in range(view.n_heads):
            rates, ratios = [], []
            for b in range(tokens.shape[0]):
                rates += [float(view.pattern[b, h, i, 0]) for i in range(1, last)]
                norms = [float((view.v[b, j, h] @ W_O[h]).norm()) for j in range(last)]
                ratios.append(norms[0] / (sum(norms[1:]) / len(norms[1:])))
            row = heads.loc[(l, h)]
            _close(
                torch.tensor(row["sink_rate"]),
                torch.tensor(sum(rates) / len(rates)),
                1e-6,
                f"layer {l} head {h}: sink rate",
            )
            _close(
                torch.tensor(row["proj_norm_ratio"]),
                torch.tensor(sum(ratios) / len(ratios)),
                1e-5,
                f"layer {l} head {h}: projected norm ratio",
            )


def check_value_zeroing(model) -> None:
    adapter, tokens, layer = adapter_for(model), _tokens(), model.cfg.n_layers - 1
    scores = geolens.value_zeroing(model, tokens, layers=[layer])[0]
    post = adapter.resid_post_hook(layer)
    _, clean = _cache(model, tokens, names_filter=[post])
    for j in range(N_POS):

        def zero(v, hook, j=j):
            v = v.clone()
            v[:, j] = 0
            return v

        with torch.no_grad(), model.hooks(fwd_hooks=[(adapter.value_hook(layer), zero)]):
            _, edited = model.run_with_cache(tokens, names_filter=[post])
        cos = torch.nn.functional.cosine_similarity(edited[post].double(), clean[post].double(), dim=-1)
        expected = torch.where(torch.arange(N_POS) >= j, 1 - cos, torch.zeros_like(cos))
        _close(scores[:, :, j], expected, 2e-5, f"source {j}: Value Zeroing scores")


def check_per_term(model) -> None:
    from geolens.per_term import per_term_effects

    adapter, text, layer, query = adapter_for(model), _tokens()[:1], 0, N_POS - 2
    fast = per_term_effects(model, text, layer=layer, query=query)
    terms = [(h, j) for h in range(model.cfg.n_heads) for j in range(query + 1)]

    def zero(pattern, hook):
        pattern = pattern.clone()
        for row, (h, j) in enumerate(terms):
            pattern[row, h, query, j] = 0
        return pattern

    with torch.no_grad():
        clean = model(text, return_type="logits")[0, query].double()
        rows = model.run_with_hooks(
            text.expand(len(terms), -1), fwd_hooks=[(adapter.pattern_hook(layer), zero)], return_type="logits"
        )
    p = torch.softmax(clean, -1)
    for row, (h, j) in enumerate(terms):
        q = torch.softmax(rows[row, query].double(), -1)
        kl = float((p * (p.log() - q.log())).sum())
        if not abs(float(fast.kl[h, j]) - kl) <= 1e-4 * kl + 1e-7:
            raise Failed(f"head {h}, source {j}: the per-term KL differs from the full rerun's")


def check_report(model) -> None:
    from geolens.report import ReportConfig, available_sections, build_report

    tokens = _tokens(4, 24, seed=3)
    config = ReportConfig.quick_defaults(
        model="tiny", corpus="random tokens", n_sequences=3, seq_len=24, prompt="the cat sat on the mat"
    )
    report = build_report(model, tokens, config, progress=False)
    missing = sorted(set(available_sections()) - {s.key for s in report.sections})
    if missing:
        raise Failed(f"the report left out {', '.join(missing)}")
    (contrast,) = [s for s in report.sections if s.key == "contributions"]
    rows = contrast.numbers["per_head"].set_index(["layer", "head"])
    corpus = tokens[:3]  # the last window is held out of the corpus pass
    _, cache = _cache(model, corpus, names_filter=geolens.names_filter(model))
    for l in range(model.cfg.n_layers):
        view = get_attention_layer(model, cache, l, dtype=torch.float64)
        window = adapter_for(model).sliding_window(l)
        last = 24 if window is None else min(24, window)  # queries 1 … last − 1 see the sink
        for h in range(view.n_heads):
            alphas = [float(view.pattern[b, h, i, 0]) for b in range(corpus.shape[0]) for i in range(1, last)]
            got = torch.tensor(float(rows.loc[(l, h), "sink_attention"]))
            _close(
                got, torch.tensor(sum(alphas) / len(alphas)), 1e-6, f"layer {l} head {h}: the report's sink attention"
            )


CHECK_FUNCTIONS: dict[str, Callable] = {
    "attention_rebuild": check_attention_rebuild,
    "contributions": check_contributions,
    "padding": check_padding,
    "sinks": check_sinks,
    "value_zeroing": check_value_zeroing,
    "per_term": check_per_term,
    "report": check_report,
}


# ---------------------------------------------------------------------------------------------
# Backends

NOT_HOSTED_BY_TL2 = {
    "olmo2": "TransformerLens 2.18 has no OLMo 2 conversion, and no HookedTransformerConfig holds its norms (only after attention and MLP; q/k over all heads)",
}


def _hooked_fields(c) -> tuple[dict, str]:
    """``HookedTransformerConfig`` fields for the HF config ``c`` and the name of TransformerLens'
    weight converter, per family as TransformerLens 2.18's ``convert_hf_model_config`` maps them;
    where that function hard-codes the released checkpoints' values (Gemma) or leaves a feature
    out (the sliding windows of Qwen2 and Phi-3, Llama's rotary base), the value comes from ``c``."""
    family = c.model_type
    if family in NOT_HOSTED_BY_TL2:
        raise NotImplementedError(NOT_HOSTED_BY_TL2[family])
    if family == "gpt2":
        fields = dict(
            d_model=c.n_embd,
            d_head=c.n_embd // c.n_head,
            n_heads=c.n_head,
            d_mlp=c.n_inner or 4 * c.n_embd,
            n_layers=c.n_layer,
            n_ctx=c.n_positions,
            eps=c.layer_norm_epsilon,
            d_vocab=c.vocab_size,
            act_fn=c.activation_function,
            normalization_type="LN",
            positional_embedding_type="standard",
            scale_attn_by_inverse_layer_idx=c.scale_attn_by_inverse_layer_idx,
        )
        return fields, "convert_gpt2_weights"
    if family == "gpt_neox":
        d_head = c.hidden_size // c.num_attention_heads
        fields = dict(
            d_model=c.hidden_size,
            d_head=d_head,
            n_heads=c.num_attention_heads,
            d_mlp=c.intermediate_size,
            n_layers=c.num_hidden_layers,
            n_ctx=c.max_position_embeddings,
            eps=c.layer_norm_eps,
            d_vocab=c.vocab_size,
            act_fn=c.hidden_act,
            parallel_attn_mlp=c.use_parallel_residual,
            normalization_type="LN",
            positional_embedding_type="rotary",
            rotary_adjacent_pairs=False,
            rotary_dim=round(c.rotary_pct * d_head),
            rotary_base=c.rotary_emb_base,
        )
        return fields, "convert_neox_weights"
    converters = {
        "llama": "convert_llama_weights",
        "mistral": "convert_mistral_weights",
        "qwen2": "convert_qwen2_weights",
        "qwen3": "convert_qwen3_weights",
        "phi3": "convert_phi3_weights",
        "gemma2": "convert_gemma_weights",
        "gemma3_text": "convert_gemma_weights",
    }
    if family not in converters:
        raise NotImplementedError(f"no HookedTransformerConfig mapping for model_type {family!r}")
    d_head = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    grouped = c.num_key_value_heads != c.num_attention_heads or family in ("mistral", "qwen2", "gemma2", "gemma3_text")
    fields = dict(
        d_model=c.hidden_size,
        d_head=d_head,
        n_heads=c.num_attention_heads,
        n_key_value_heads=c.num_key_value_heads if grouped else None,
        d_mlp=c.intermediate_size,
        n_layers=c.num_hidden_layers,
        n_ctx=c.max_position_embeddings,
        eps=c.rms_norm_eps,
        d_vocab=c.vocab_size,
        act_fn=getattr(c, "hidden_activation", None) or c.hidden_act,
        normalization_type="RMS",
        final_rms=True,
        gated_mlp=True,
        positional_embedding_type="rotary",
        rotary_dim=d_head,
        rotary_adjacent_pairs=False,
        rotary_base=c.rope_theta,
        use_qk_norm=family in ("qwen3", "gemma3_text"),
    )
    window, types = getattr(c, "sliding_window", None), getattr(c, "layer_types", None)
    if window is not None and (types is None or "sliding_attention" in types):
        types = types or ["sliding_attention"] * c.num_hidden_layers
        fields.update(
            use_local_attn=True,
            window_size=window,
            attn_types=["local" if t == "sliding_attention" else "global" for t in types],
        )
    if family in ("gemma2", "gemma3_text"):
        fields.update(use_normalization_before_and_after=True, attn_scale=c.query_pre_attn_scalar**0.5)
    if family == "gemma2":
        fields.update(
            attn_scores_soft_cap=c.attn_logit_softcapping or -1.0,
            output_logits_soft_cap=c.final_logit_softcapping or -1.0,
        )
    if family == "gemma3_text":
        fields.update(rotary_base_local=c.rope_local_base_freq)
    return fields, converters[family]


def hooked_from_hf(hf, tokenizer=None):
    """A TransformerLens 2.x ``HookedTransformer`` holding the weights of the in-memory HF causal LM
    ``hf``: the config of :func:`_hooked_fields`, the weights converted by TransformerLens' own
    ``transformer_lens.pretrained.weight_conversions.convert_*_weights`` and loaded unprocessed (no
    norm folding, no centring, value biases kept), so W_V, b_V, W_O and b_O are the HF model's.

    Raises ``NotImplementedError`` for a family TransformerLens 2.x cannot hold, and
    ``ValueError`` when the converted model's logits differ from ``hf``'s (max abs error above
    1e-5 on a [2, 12] batch that reaches past the sliding windows).
    """
    import transformer_lens.pretrained.weight_conversions as conversions

    from geolens.adapter.hooked import hooked_transformer

    fields, converter = _hooked_fields(hf.config)
    process = dict(fold_ln=False, center_writing_weights=False, center_unembed=False, fold_value_biases=False)
    convert = getattr(conversions, converter)
    model = hooked_transformer(fields, tokenizer, weights=lambda cfg: convert(hf, cfg), **process).eval()
    tokens = _tokens()
    with torch.no_grad():
        err = float((model(tokens) - hf(tokens).logits).abs().max())
    if not err <= 1e-5:
        raise ValueError(
            f"the HookedTransformer converted from this {hf.config.model_type} model gives other logits than the HF model"
        )
    return model


def build(family: str, backend: str):
    """The tiny model of ``family`` on ``backend`` (the same seeded HF weights on every backend)."""
    from geolens.testing import tiny_tokenizer

    if backend == "hf":
        from geolens.hf import prepare

        return prepare(tiny_family(family), tokenizer=tiny_tokenizer())
    if backend == "tl4-bridge":
        from geolens.adapter.bridge import transformer_bridge

        return transformer_bridge(
            f"geolens-tiny-{family}", tiny_family(family), tiny_tokenizer(), compatibility_mode=False, device="cpu"
        )
    if backend == "tl2-hooked":
        return hooked_from_hf(tiny_family(family), tiny_tokenizer())
    raise ValueError(f"unknown backend {backend!r}")


def available_backends() -> list[str]:
    """The backends this environment runs in-process (TransformerLens 2.x and 4.x never share one)."""
    out = ["hf"]
    try:
        from transformer_lens.model_bridge import TransformerBridge  # noqa: F401

        out.append("tl4-bridge")
    except ImportError:
        pass
    try:
        from transformer_lens import HookedTransformer  # noqa: F401

        out.append("tl2-hooked")
    except ImportError:
        pass
    return out


class MissingBackend(RuntimeError):
    """A backend of the matrix that neither this environment nor ``.venvs/tl2`` can run."""


def _one_line(err: BaseException, limit: int = 160) -> str:
    """The error's first line, cut at a word boundary near ``limit`` characters."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if len(text) <= limit:
        return text
    return text[:limit].rsplit(" ", 1)[0].rstrip(",;:") + " …"


def run_cell(family: str, backend: str, checks=CHECKS) -> dict[str, dict]:
    """Every check of one (family, backend): {check: {"status", "reason"}}."""
    try:
        model = build(family, backend)
    except Exception as err:  # a backend that cannot host the family
        return {name: {"status": "not hosted", "reason": _one_line(err)} for name in checks}
    out = {}
    for name in checks:
        try:
            CHECK_FUNCTIONS[name](model)
            out[name] = {"status": "pass", "reason": ""}
        except Failed as err:
            out[name] = {"status": "fail", "reason": _one_line(err)}
        except NotImplementedError as err:
            out[name] = {"status": "unsupported", "reason": _one_line(err)}
        except Exception as err:
            out[name] = {"status": "fail", "reason": f"{type(err).__name__}: {_one_line(err)}"}
    return out


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for dist in ("torch", "transformers", "transformer-lens"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def column(backend: str, families=FAMILIES, checks=CHECKS, progress: bool = False) -> dict:
    """One backend's cells, ``{"versions": ..., "results": {family: {check: cell}}}``: computed in
    this process when it has the backend, else (``tl2-hooked``) by this script under
    ``.venvs/tl2/bin/python``. Raises :class:`MissingBackend` when neither can run it."""
    if backend in available_backends():
        results = {}
        for family in families:
            results[family] = run_cell(family, backend, checks)
            if progress:
                statuses = {c: r["status"] for c, r in results[family].items()}
                print(f"{family:9s} {backend:11s} {statuses}", file=sys.stderr)
        return {"versions": versions(), "results": results}
    return _Tl2Column(families, checks).result(progress) if backend == "tl2-hooked" else _missing(backend)


def _missing(backend: str):
    if backend in BACKENDS:
        raise MissingBackend(
            f"the {backend} column needs TransformerLens 4.x (TransformerBridge), which this Python lacks: run the script with the main environment's python"
        )
    raise ValueError(f"unknown backend {backend!r}: use one of {', '.join(BACKENDS)}")


class _Tl2Column:
    """The ``tl2-hooked`` column, computed by this script under ``.venvs/tl2/bin/python``
    (TransformerLens 2.x) in a subprocess started at construction and read by :meth:`result`, so
    that it runs beside this process's own columns."""

    def __init__(self, families, checks):
        if not TL2_PYTHON.exists():
            raise MissingBackend(
                f"the tl2-hooked column runs in .venvs/tl2 (TransformerLens 2.x), and {TL2_PYTHON} is missing: build it with `bash scripts/install.sh --tl2`"
            )
        self.dir = tempfile.TemporaryDirectory()
        self.out, self.log = Path(self.dir.name) / "column.json", Path(self.dir.name) / "stderr.txt"
        command = [str(TL2_PYTHON), str(Path(__file__).resolve()), "--column", "tl2-hooked", "--to", str(self.out)]
        command += ["--families", ",".join(families), "--checks", ",".join(checks)]
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        with open(self.log, "w", encoding="utf-8") as log:
            self.process = subprocess.Popen(
                command, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log
            )

    def result(self, progress: bool = False) -> dict:
        try:
            code = self.process.wait()
            log = self.log.read_text(encoding="utf-8", errors="replace")
            if progress:
                print(log, end="", file=sys.stderr)
            if code != 0 or not self.out.exists():
                last = (log.strip().splitlines() or ["no output"])[-1]
                raise MissingBackend(f"the tl2-hooked column failed in .venvs/tl2 (exit {code}): {last}")
            return json.loads(self.out.read_text(encoding="utf-8"))
        finally:
            self.close()

    def close(self) -> None:
        """Stop the subprocess if it still runs and remove its folder."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.dir.cleanup()


def support_matrix(families=FAMILIES, backends=None, progress: bool = False) -> dict:
    """The matrix as a JSON-ready dict: families, backends (default: all three, the TransformerLens
    2.x column computed in ``.venvs/tl2`` while this process computes the others), checks, each
    backend's package versions and every cell's result."""
    backends = list(BACKENDS) if backends is None else list(backends)
    here = available_backends()
    elsewhere = _Tl2Column(families, CHECKS) if "tl2-hooked" in backends and "tl2-hooked" not in here else None
    try:
        columns = {
            b: column(b, families, progress=progress) for b in backends if b != "tl2-hooked" or elsewhere is None
        }
        if elsewhere is not None:
            columns["tl2-hooked"] = elsewhere.result(progress)
    finally:
        if elsewhere is not None:
            elsewhere.close()
    return {
        "versions": {b: columns[b]["versions"] for b in backends},
        "checks": CHECKS,
        "backends": {b: BACKENDS[b] for b in backends},
        "families": {f: FAMILY_NOTES[f] for f in families},
        "results": {f: {b: columns[b]["results"][f] for b in backends} for f in families},
    }


MARK = {"pass": "✓", "fail": "✗", "unsupported": "–", "not hosted": "n/h"}


def _versions_line(versions: dict) -> str:
    """The package versions per backend, backends with the same versions together."""
    groups: dict[str, list[str]] = {}
    for backend, packages in versions.items():
        groups.setdefault(", ".join(f"{k} {v}" for k, v in packages.items()), []).append(f"`{backend}`")
    return "; ".join(f"{line} ({', '.join(backends)})" for line, backends in groups.items())


def markdown(matrix: dict) -> str:
    """docs/support.md from the matrix (see :func:`support_matrix`)."""
    checks, backends = list(matrix["checks"]), list(matrix["backends"])
    lines = [
        "# Support matrix",
        "",
        "<!-- generated by scripts/support_matrix.py: do not edit by hand -->",
        "",
        "Which geolens quantities are verified on which model family and backend. Every cell runs a",
        "tiny random model of the family (2 layers, d_model 32, built offline from its `transformers`",
        "config by `geolens.hf.tiny`) through geolens' public functions and compares the result with a",
        "reference computed independently: explicit float64 loops over the cached pattern and values, or",
        "full reruns of the model. `tests/test_support_matrix.py` regenerates this page and fails when",
        "a cell changes; CI runs it (`scripts/test.sh`), so a family that regresses fails there.",
        "",
        "Versions: " + _versions_line(matrix["versions"]) + ".",
        "",
        "Backends: " + "; ".join(f"`{b}` = {d}" for b, d in matrix["backends"].items()) + ".",
        "",
        "TransformerLens 2.x and 4.x cannot be installed side by side, so the `tl2-hooked` column is",
        "computed by the same script in its own environment (`.venvs/tl2`, built by",
        "`bash scripts/install.sh --tl2`; without it the script stops and says so). Its",
        "`HookedTransformer` is built from the same in-memory HF model as the other backends, with",
        "TransformerLens' own tools: a `HookedTransformerConfig` whose fields are mapped from the HF",
        "config per family as TransformerLens' `convert_hf_model_config` maps them (what that mapping",
        "leaves out, the sliding windows of Qwen2 and Phi-3 and Llama's rotary base, and the values it",
        "hard-codes for the released Gemma checkpoints are read from the config), and the weights",
        "converted by its `convert_*_weights` and loaded unprocessed (no norm folding, no centring,",
        "value biases kept). Its logits must equal the HF model's within 1e-5 before any check runs;",
        "otherwise, or where TransformerLens 2.x has no conversion for the family, its cells are n/h.",
        "Gemma 2/3 normalise after attention and a `HookedTransformer` has no hook before that norm:",
        "there `attention_rebuild` compares with the output of the attention module itself.",
        "",
        "Cells: ✓ verified, ✗ differs from the reference (reason below), – refused by geolens with a",
        "clear error (quoted below), n/h the backend cannot host the family.",
        "",
        "| family | what it exercises | backend | " + " | ".join(checks) + " |",
        "|---|---|---|" + "---|" * len(checks),
    ]
    notes: dict[tuple[str, str, str], list[str]] = {}  # (family, backend, reason) -> its checks, one note each
    for family, per_backend in matrix["results"].items():
        for backend in backends:
            cells = []
            for check in checks:
                r = per_backend[backend][check]
                mark = MARK[r["status"]]
                if r["reason"]:
                    notes.setdefault((family, backend, r["reason"]), []).append(check)
                    mark += f" [{list(notes).index((family, backend, r['reason'])) + 1}]"
                cells.append(mark)
            lines.append(f"| {family} | {matrix['families'][family]} | {backend} | " + " | ".join(cells) + " |")
    lines += ["", "Checks:", ""] + [f"- `{c}`: {d}." for c, d in matrix["checks"].items()]
    if notes:
        lines += ["", "Reasons:", ""]
        for n, ((family, backend, reason), where) in enumerate(notes.items(), start=1):
            lines.append(
                f"{n}. {family}, {backend}, {'every check' if where == checks else ', '.join(where)}: {reason}"
            )
    lines += USAGE
    return "\n".join(lines) + "\n"


USAGE = [
    "",
    "## The HF-native backend",
    "",
    "A `transformers` causal LM is analysed as it is, without TransformerLens:",
    "",
    "```python",
    "import geolens",
    'model = geolens.load_model("smollm2-135m", backend="hf")  # a transformers LlamaForCausalLM',
    'tokens = model.to_tokens("The cat sat on the mat.", prepend_bos=True)',
    "_, cache = geolens.run_with_cache(model, tokens, names_filter=geolens.names_filter(model))",
    'c = geolens.contribution_weights(model, cache, layer=5, mode="intra")',
    "```",
    "",
    "Any `PreTrainedModel` works the same way once `geolens.hf.prepare(model, tokenizer=...)` has given",
    "it geolens' entry points; its class and its Hugging Face forward are unchanged (and",
    "`geolens.adapter_for(model)` or `geolens.run_with_cache(model, ...)` alone change nothing on the",
    "model). Pattern, v and z are captured inside the family's own eager",
    "attention (a function registered in `transformers`' `AttentionInterface`), and before the first",
    "analysis the attention output rebuilt from them, Σ_h z^h W_O^h + b_O, is checked against the",
    "attention module's output in every layer: a model geolens would read wrongly raises an error",
    "naming its family and the layer. Families outside the table use a generic adapter (Llama's",
    "module layout) under the same check. `geolens.hf.streamed` computes each layer's quantities",
    "inside the forward and drops its pattern before the next layer.",
]


def write(matrix: dict, out: Path) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    md_path, json_path = out / "support.md", out / "support.json"
    md_path.write_text(markdown(matrix), encoding="utf-8")
    json_path.write_text(json.dumps(matrix, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return md_path, json_path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=ROOT / "docs", help="folder for support.md and support.json (default: docs/)"
    )
    parser.add_argument(
        "--column",
        choices=list(BACKENDS),
        help="compute only this backend's cells, in this environment, as JSON (see --to)",
    )
    parser.add_argument("--to", type=Path, help="with --column: the JSON file to write")
    parser.add_argument(
        "--families", default=",".join(FAMILIES), help="with --column: comma-separated families (default: all)"
    )
    parser.add_argument(
        "--checks", default=",".join(CHECKS), help="with --column: comma-separated checks (default: all)"
    )
    args = parser.parse_args(argv)
    families, checks = args.families.split(","), args.checks.split(",")
    if args.column and args.to is None:
        parser.error("--column needs --to FILE")
    if unknown := sorted(set(families) - set(FAMILIES)) + sorted(set(checks) - set(CHECKS)):
        parser.error(f"unknown families or checks: {', '.join(unknown)}")
    if args.column and args.column not in available_backends():
        parser.error(f"this environment cannot run the {args.column} column (it has {', '.join(available_backends())})")
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    torch.set_grad_enabled(True)
    if args.column:
        args.to.write_text(
            json.dumps(column(args.column, families, checks, progress=True), ensure_ascii=False), encoding="utf-8"
        )
        return 0
    try:
        matrix = support_matrix(progress=True)
    except MissingBackend as err:
        print(f"support_matrix.py: error: {err}", file=sys.stderr)
        return 1
    for path in write(matrix, args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
