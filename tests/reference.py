"""Naive float64 references that materialise ṽ explicitly (explicit loops, no shortcuts).

These are deliberately slow and independent of geolens' efficient forms: they read hook_v and
W_O straight from the cache and the model, build ṽ_j^h = v_j^h W_O^h as a d_model vector and
apply the docs/method.md §1–2 definitions literally.
"""

from __future__ import annotations

import math

import torch


def raw_tensors(model, cache, layer):
    """pattern [b,h,q,k], v [b,k,h,dh] (GQA expanded by explicit index), W_O [h,dh,dm], float64."""
    pattern = cache[f"blocks.{layer}.attn.hook_pattern"].double()
    v_kv = cache[f"blocks.{layer}.attn.hook_v"].double()
    n_heads = model.cfg.n_heads
    group = n_heads // v_kv.shape[2]
    v = torch.stack([v_kv[:, :, h // group] for h in range(n_heads)], dim=2)
    W_O = model.blocks[layer].attn.W_O.detach().double()
    return pattern, v, W_O


def projected_values(model, cache, layer):
    """ṽ [b, h, k, d_model], materialised."""
    pattern, v, W_O = raw_tensors(model, cache, layer)
    b, k, h, _ = v.shape
    out = torch.zeros(b, h, k, W_O.shape[-1], dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            for j in range(k):
                out[bi, hi, j] = v[bi, j, hi] @ W_O[hi]
    return out


def _outputs(model, cache, layer):
    """pattern [b,h,q,k], ṽ [b,h,k,dm], α_ij ṽ_j [b,h,q,k,dm], head outputs o_i^h [b,h,q,dm], layer outputs o_i [b,q,dm]."""
    pattern, _, _ = raw_tensors(model, cache, layer)
    vt = projected_values(model, cache, layer)
    weighted = pattern[..., None] * vt[:, :, None, :, :]  # fine for tiny models
    head_out = weighted.sum(3)
    return pattern, vt, weighted, head_out, head_out.sum(1)


def _cells(pattern, head_out, layer_out, mode):
    """(bi, hi, i, j, o_i) for every entry, with loops; o_i is the head's output (intra) or the layer's (inter)."""
    b, h, q, k = pattern.shape
    for bi in range(b):
        for hi in range(h):
            for i in range(q):
                o = head_out[bi, hi, i] if mode == "intra" else layer_out[bi, i]
                for j in range(k):
                    yield bi, hi, i, j, o


def contributions(model, cache, layer, mode):
    """c [b,h,q,k] by the definition c_ij = <o_i, α_ij ṽ_j> / ||o_i||^2, with loops."""
    pattern, _, weighted, head_out, layer_out = _outputs(model, cache, layer)
    c = torch.zeros(pattern.shape, dtype=torch.float64)
    for bi, hi, i, j, o in _cells(pattern, head_out, layer_out, mode):
        c[bi, hi, i, j] = torch.dot(o, weighted[bi, hi, i, j]) / torch.dot(o, o)
    return c


def factors(model, cache, layer, mode):
    """(relative norm ||ṽ_j||/||o_i||, cosine <o_i, ṽ_j>/(||o_i|| ||ṽ_j||)) [b,h,q,k], with loops."""
    pattern, vt, _, head_out, layer_out = _outputs(model, cache, layer)
    rel = torch.zeros(pattern.shape, dtype=torch.float64)
    cos = torch.zeros(pattern.shape, dtype=torch.float64)
    for bi, hi, i, j, o in _cells(pattern, head_out, layer_out, mode):
        w = vt[bi, hi, j]
        rel[bi, hi, i, j] = w.norm() / o.norm()
        cos[bi, hi, i, j] = torch.dot(o, w) / (o.norm() * w.norm())
    return rel, cos


def naive_value_zeroing(model, tokens, layer, final_norm=False):
    """One full forward per source token j, v_j zeroed at ``layer`` only; 1 − cos of resid_post
    (after ``ln_final`` with ``final_norm``)."""
    from geolens.interventions import applied  # the hook context only; the computation is the loops below

    n = tokens.shape[1]
    out = torch.zeros(tokens.shape[0], n, n, dtype=torch.float64)
    name_v, name_r = f"blocks.{layer}.attn.hook_v", f"blocks.{layer}.hook_resid_post"
    for b in range(tokens.shape[0]):
        seq = tokens[b : b + 1]
        with torch.no_grad():
            _, cache = model.run_with_cache(seq, names_filter=lambda name: name == name_r)
        post = (lambda r: model.ln_final(r)) if final_norm else (lambda r: r)
        with torch.no_grad():
            clean = post(cache[name_r])[0].double()
        for j in range(n):
            got = {}

            def zero(v, hook, j=j):
                v = v.clone()
                v[:, j] = 0.0
                return v

            def save(r, hook):
                got["r"] = post(r)[0].double()

            with torch.no_grad(), applied(model, [(name_v, zero), (name_r, save)]):
                model(seq, return_type="logits")
            for i in range(n):
                a, c = clean[i], got["r"][i]
                out[b, i, j] = 1.0 - torch.dot(a, c) / (a.norm() * c.norm())
    return out


# Padded batches of the tiny tokenizer (tests of padding, flow).
PAD = 2
TEXTS = ("the cat sat on the mat.", "a dog ran", "hello there world")


def padding_prompts():
    """The three ``TEXTS`` as tiny-tokenizer id rows of different lengths, BOS first."""
    from geolens.testing import tiny_tokenizer

    tok = tiny_tokenizer()
    return [torch.tensor([tok.bos_token_id] + tok(t, add_special_tokens=False)["input_ids"]) for t in TEXTS]


def pad_prompts(prompts, side: str):
    """``prompts`` padded with ``PAD`` on ``side`` ('left' or 'right'): tokens and attention mask ``[batch, pos]``."""
    n = max(len(p) for p in prompts)
    rows, masks = [], []
    for p in prompts:
        fill = torch.full((n - len(p),), PAD)
        rows.append(torch.cat([fill, p]) if side == "left" else torch.cat([p, fill]))
        m = torch.zeros(n, dtype=torch.long)
        if side == "left":
            m[n - len(p) :] = 1
        else:
            m[: len(p)] = 1
        masks.append(m)
    return torch.stack(rows), torch.stack(masks)


def real_span(mask_row: torch.Tensor) -> slice:
    """The slice of a padded row's real (mask 1) positions."""
    idx = mask_row.nonzero().flatten()
    return slice(int(idx[0]), int(idx[-1]) + 1)


# Sink-value edits (tests of the sink controls).
def naive_v0(v0, spec, layer, kv, n_kv):
    """v_0' by hand, float64, Python arithmetic: λ v_0, or cos θ v_0 + sin θ ‖v_0‖ u (u: g Gram-Schmidt against v_0)."""
    from geolens.interventions.sink_values import rotation_direction  # the seeded direction g itself

    v0 = v0.double()
    if spec.kind == "scale":
        return spec.lam * v0
    g = rotation_direction(spec.seed, layer, n_kv, v0.shape[0])[kv]
    n0 = math.sqrt(sum(float(x) ** 2 for x in v0))
    u = g - sum(float(a) * float(b) for a, b in zip(g, v0)) / n0**2 * v0
    u = u / math.sqrt(sum(float(x) ** 2 for x in u))
    t = math.radians(spec.degrees)
    return math.cos(t) * v0 + math.sin(t) * n0 * u


# Grouped-query attention.
def naive_kv_of(n_heads: int, n_kv: int) -> list[int]:
    """Query head → kv head, written out group by group: heads k·g … k·g + g − 1 read kv head k."""
    g = n_heads // n_kv
    out = []
    for k in range(n_kv):
        for _ in range(g):
            out.append(k)
    return out
