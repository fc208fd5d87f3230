"""The support matrix's checks (scripts/support_matrix.py, docs/support.md), each with its own
reference computed independently of geolens: explicit float64 loops over the cached pattern and
values, or full reruns of the model.

``tests/test_support_matrix.py`` runs them as parametrised tests (families × backends) against the
committed cells; ``scripts/support_matrix.py`` runs them (:func:`run_cell`) to collect the cells and
render docs/support.md and docs/support.json. Each check takes a model built by :func:`build` (the
tiny random model of a family, :mod:`geolens.hf.tiny`, on one backend: the same seeded HF weights on
every backend) and raises :class:`Failed` with a one-line reason when geolens' result differs from
its reference; ``NotImplementedError`` from geolens marks the computation unsupported.

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
"""

from __future__ import annotations

from typing import Callable

import torch

import geolens
from geolens import contributions
from geolens.adapter import adapter_for, get_attention_layer
from geolens.families.convert import N_POS
from geolens.families.convert import comparison_tokens as _tokens
from geolens.hf.tiny import tiny_family

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


class Failed(Exception):
    """A check's result differs from its reference (the message is the one-line reason)."""


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
        pair = contributions.contribution_weight_pair(model, cache, l, dtype=torch.float64)
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
        from geolens.families.convert import hooked_from_hf

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
