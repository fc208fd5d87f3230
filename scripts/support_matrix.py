"""Generate the support matrix: which geolens quantities are verified on which model family and backend.

For every family of :mod:`geolens.hf.tiny` (tiny random ``transformers`` models built offline from
their configs) and every backend this environment has — the HF-native backend (:mod:`geolens.hf`)
and TransformerLens 4.x's ``TransformerBridge`` over the same weights — the checks below run
through geolens' public functions and compare with references computed here independently
(explicit float64 loops over the cached pattern and values, or full reruns of the model):

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

A cell is ``pass``, ``fail`` (with a one-line reason) or ``unsupported`` (geolens refuses the
computation with a clear error, quoted). Usage::

    python scripts/support_matrix.py            # writes docs/support.md and docs/support.json
    python scripts/support_matrix.py --out DIR  # elsewhere

``tests/test_support_matrix.py`` regenerates the matrix and fails when a cell changed or the
committed files are stale.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
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
}

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


def check_attention_rebuild(model) -> None:
    adapter, tokens = adapter_for(model), _tokens()
    names = [n for l in range(model.cfg.n_layers) for n in (adapter.pattern_hook(l), adapter.value_hook(l), adapter.attn_out_hook(l))]
    _, cache = _cache(model, tokens, names_filter=names)
    for l in range(model.cfg.n_layers):
        pattern, v = cache[adapter.pattern_hook(l)].double(), cache[adapter.value_hook(l)].double()
        W_O, b_O = _weights(model, l)
        group = model.cfg.n_heads // v.shape[2]
        out = torch.zeros(*pattern.shape[:1], pattern.shape[2], W_O.shape[-1], dtype=torch.float64)
        for h in range(model.cfg.n_heads):
            vt = v[:, :, h // group] @ W_O[h]  # ṽ_j^h
            out += torch.einsum("bqk,bkm->bqm", pattern[:, h], vt)
        _close(out + b_O, cache[adapter.attn_out_hook(l)], 1e-5, f"layer {l}: the rebuilt attention outputs")


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
                    _close(pair.intra[b, h, i], terms[h] @ heads[h] / heads[h].dot(heads[h]), 1e-9, f"layer {l}: intra contributions")
                    _close(pair.inter[b, h, i], terms[h] @ total / total.dot(total), 1e-9, f"layer {l}: inter contributions")
        _close(pair.intra.sum(-1), torch.ones(b_n, n_heads, q_n), 1e-9, f"layer {l}: intra row sums")
        _close(pair.inter.sum((1, 3)), torch.ones(b_n, q_n), 1e-9, f"layer {l}: inter row sums")


def check_padding(model) -> None:
    short, other = _tokens(1, 8, seed=1)[0], _tokens(1, N_POS, seed=2)[0]
    pad = N_POS - 8
    with torch.no_grad():
        alone_logits, alone = _cache(model, short[None], names_filter=geolens.names_filter(model))
    for side in ("left", "right"):
        row = torch.cat([torch.full((pad,), PAD_ID), short]) if side == "left" else torch.cat([short, torch.full((pad,), PAD_ID)])
        tokens, mask = torch.stack([row, other]), torch.ones(2, N_POS, dtype=torch.long)
        real = slice(pad, N_POS) if side == "left" else slice(0, 8)
        mask[0, : pad if side == "left" else N_POS] = 0
        mask[0, real] = 1
        logits, cache = _cache(model, tokens, attention_mask=mask, names_filter=geolens.names_filter(model))
        _close(logits[0, real], alone_logits[0], 2e-5, f"{side}-padded row: logits")
        for l in range(model.cfg.n_layers):
            padded = geolens.contribution_weights(model, cache, l, attention_mask=mask)
            _close(padded[0][:, real, real], geolens.contribution_weights(model, alone, l)[0], 2e-5, f"{side}-padded row: layer {l} contributions")


def check_sinks(model) -> None:
    from geolens.sinks import sink_geometry

    tokens = _tokens(3)
    heads = sink_geometry(model, tokens, batch_size=3).heads.set_index(["layer", "head"])
    _, cache = _cache(model, tokens, names_filter=geolens.names_filter(model))
    for l in range(model.cfg.n_layers):
        view = get_attention_layer(model, cache, l, dtype=torch.float64)
        W_O, _ = _weights(model, l)
        window = adapter_for(model).sliding_window(l)
        last = N_POS if window is None else min(N_POS, window)  # queries and tail keys that share a window with the sink
        for h in range(view.n_heads):
            rates, ratios = [], []
            for b in range(tokens.shape[0]):
                rates += [float(view.pattern[b, h, i, 0]) for i in range(1, last)]
                norms = [float((view.v[b, j, h] @ W_O[h]).norm()) for j in range(last)]
                ratios.append(norms[0] / (sum(norms[1:]) / len(norms[1:])))
            row = heads.loc[(l, h)]
            _close(torch.tensor(row["sink_rate"]), torch.tensor(sum(rates) / len(rates)), 1e-6, f"layer {l} head {h}: sink rate")
            _close(torch.tensor(row["proj_norm_ratio"]), torch.tensor(sum(ratios) / len(ratios)), 1e-5, f"layer {l} head {h}: projected norm ratio")


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
        rows = model.run_with_hooks(text.expand(len(terms), -1), fwd_hooks=[(adapter.pattern_hook(layer), zero)], return_type="logits")
    p = torch.softmax(clean, -1)
    for row, (h, j) in enumerate(terms):
        q = torch.softmax(rows[row, query].double(), -1)
        kl = float((p * (p.log() - q.log())).sum())
        if not abs(float(fast.kl[h, j]) - kl) <= 1e-4 * kl + 1e-7:
            raise Failed(f"head {h}, source {j}: the per-term KL differs from the full rerun's")


def check_report(model) -> None:
    from geolens.report import ReportConfig, available_sections, build_report

    tokens = _tokens(4, 24, seed=3)
    config = ReportConfig.quick_defaults(model="tiny", corpus="random tokens", n_sequences=3, seq_len=24, prompt="the cat sat on the mat")
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
            _close(got, torch.tensor(sum(alphas) / len(alphas)), 1e-6, f"layer {l} head {h}: the report's sink attention")


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
    if backend == "hf":
        from geolens.hf import prepare
        from geolens.testing import tiny_tokenizer

        return prepare(tiny_family(family), tokenizer=tiny_tokenizer())
    if backend == "tl4-bridge":
        from geolens.adapter.bridge import transformer_bridge
        from geolens.testing import tiny_tokenizer

        return transformer_bridge(f"geolens-tiny-{family}", tiny_family(family), tiny_tokenizer(), compatibility_mode=False, device="cpu")
    raise ValueError(f"unknown backend {backend!r}")


def available_backends() -> list[str]:
    out = ["hf"]
    try:
        from transformer_lens.model_bridge import TransformerBridge  # noqa: F401

        out.append("tl4-bridge")
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


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for dist in ("torch", "transformers", "transformer-lens"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def support_matrix(families=FAMILIES, backends=None, progress: bool = False) -> dict:
    """The matrix as a JSON-ready dict: families, backends, checks and every cell's result."""
    backends = available_backends() if backends is None else list(backends)
    results = {}
    for family in families:
        results[family] = {}
        for backend in backends:
            results[family][backend] = run_cell(family, backend)
            if progress:
                statuses = {c: r["status"] for c, r in results[family][backend].items()}
                print(f"{family:9s} {backend:11s} {statuses}", file=sys.stderr)
    return {
        "versions": versions(),
        "checks": CHECKS,
        "backends": {b: BACKENDS[b] for b in backends},
        "families": {f: FAMILY_NOTES[f] for f in families},
        "results": results,
    }


MARK = {"pass": "✓", "fail": "✗", "unsupported": "–", "not hosted": "n/h"}


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
        "Versions: " + ", ".join(f"{k} {v}" for k, v in matrix["versions"].items()) + ".",
        "",
        "Backends: " + "; ".join(f"`{b}` = {d}" for b, d in matrix["backends"].items()) + ".",
        "TransformerLens 2.x `HookedTransformer` is not in the matrix yet: it loads by official model name or",
        "checkpoint folder, not from an in-memory model, and runs in its own environment (`.venvs/tl2`,",
        "transformers 4.57), where geolens' tests use its own tiny random models.",
        "",
        "Cells: ✓ verified, ✗ differs from the reference (reason below), – refused by geolens with a",
        "clear error (quoted below), n/h the backend cannot host the family.",
        "",
        "| family | what it exercises | backend | " + " | ".join(checks) + " |",
        "|---|---|---|" + "---|" * len(checks),
    ]
    notes = []
    for family, per_backend in matrix["results"].items():
        for backend in backends:
            cells = []
            for check in checks:
                r = per_backend[backend][check]
                mark = MARK[r["status"]]
                if r["reason"]:
                    notes.append(f"{family}, {backend}, {check}: {r['reason']}")
                    mark += f" [{len(notes)}]"
                cells.append(mark)
            lines.append(f"| {family} | {matrix['families'][family]} | {backend} | " + " | ".join(cells) + " |")
    lines += ["", "Checks:", ""] + [f"- `{c}`: {d}." for c, d in matrix["checks"].items()]
    if notes:
        lines += ["", "Reasons:", ""] + [f"{n}. {text}" for n, text in enumerate(notes, start=1)]
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
    "Any `PreTrainedModel` works the same way once `geolens.adapter_for(model)` (or",
    "`geolens.hf.prepare(model, tokenizer=...)`) has given it geolens' entry points; its class and its",
    "Hugging Face forward are unchanged. Pattern, v and z are captured inside the family's own eager",
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
    parser.add_argument("--out", type=Path, default=ROOT / "docs", help="folder for support.md and support.json (default: docs/)")
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    torch.set_grad_enabled(True)
    matrix = support_matrix(progress=True)
    for path in write(matrix, args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
