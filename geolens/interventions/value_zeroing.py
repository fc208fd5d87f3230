"""Value Zeroing (Mohebbi et al. 2023): how much a layer's output turns when one value vector is zeroed.

:func:`value_zeroing` is the intervention "v_j ← 0 in every head of layer l", measured as the cosine
distance of the layer's output with and without it, computed from one clean forward without hooks
(the attention pattern does not change, so the output without v_j is the clean one minus source j's
terms). The metric registry (:mod:`geolens.metrics`) registers it as the metric ``value_zeroing``;
:mod:`geolens.faithfulness.value_zeroing` and ``geolens.value_zeroing`` are this function.
"""

from __future__ import annotations

from typing import Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor

from geolens import threads
from geolens.adapter import adapter_for, get_attention_layer
from geolens.geometry import layer_output
from geolens.validation import check_context, check_layer


def value_zeroing(
    model,
    tokens: Int[Tensor, "batch pos"],
    layers: Sequence[int] | None = None,
    *,
    chunk_size: int | None = None,
    final_norm: bool = False,
    normalize: bool = False,
    queries=None,
) -> Float[Tensor, "layer batch query key"]:
    """Value Zeroing scores VZ_ij^{(l)} = 1 − cos(x̃_i^{(l)}, x̃_i^{(l), ¬j}) (Mohebbi et al. 2023).

    x̃_i^{(l)} is the output of layer l (``blocks.{l}.hook_resid_post``) at position i, and
    x̃_i^{(l), ¬j} the same output when layer l is rerun with the value vector of token j zeroed
    in every head (``hook_v``; with grouped-query attention, in every kv head, hence in every
    query head), everything before layer l unchanged. Future sources (j > i) score 0. Mohebbi et
    al. normalise each row to sum 1 afterwards; that does not change the per-row ranking, so the
    raw cosine distances are returned. ``queries`` (a list of positions, or ``{layer: positions}``)
    computes those query rows only, the others left 0: a sample of positions costs its rows alone.
    ``final_norm=True`` scores the last layer after the
    model's final norm (``ln_final``), as inseq and Hugging Face ``hidden_states[-1]`` do; the
    other layers are unchanged.

    One clean forward, then no attention is recomputed: zeroing v_j leaves the pattern as it is,
    so the pre-norm attention output without source j is exactly the clean one minus
    Σ_h α_ij^h ṽ_j^h (ṽ_j^h = v_j W_O^h), and only queries i ≥ j change. Only those rows go
    through the rest of the block (post-attention norm where there is one, residual add, MLP;
    :meth:`~geolens.adapter.ModelAdapter.block_after_attention`). ``chunk_size`` bounds the
    sources handled together (default: as many as keep about 4096 rows per MLP call). The
    block's rebuilt clean output is checked against the cached one, so a block this does not
    describe raises instead of giving wrong scores.

    >>> import geolens
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")  # 2 layers, 4 query heads sharing 2 kv heads
    >>> vz = geolens.value_zeroing(model, tiny_tokens(model, length=12), layers=[0])
    >>> tuple(vz.shape)  # [layer, batch, query, key]
    (1, 2, 12, 12)
    """
    if tokens.ndim != 2:
        raise ValueError(f"tokens must be [batch, pos], got shape {tuple(tokens.shape)}")
    n_layers = model.cfg.n_layers
    layers = sorted({check_layer(l, n_layers) for l in (range(n_layers) if layers is None else layers)})
    n_pos = check_context(model, tokens.shape[1])
    if chunk_size is not None and (isinstance(chunk_size, bool) or int(chunk_size) < 1):
        raise ValueError("chunk_size must be a positive integer")
    chunk = max(1, 4096 // n_pos) if chunk_size is None else int(chunk_size)
    if queries is not None and not isinstance(queries, dict):
        queries = {l: queries for l in layers}
    if queries is not None:
        queries = {check_layer(l, n_layers): [int(q) % n_pos for q in qs] for l, qs in queries.items()}
        missing = [l for l in layers if l not in queries]
        if missing:
            raise ValueError(f"value_zeroing: queries name no positions for layers {missing}")
    scores = torch.zeros(len(layers), tokens.shape[0], n_pos, n_pos)
    adapter = adapter_for(model)
    wanted = set()
    for l in layers:
        wanted |= {
            adapter.resid_pre_hook(l),
            adapter.resid_post_hook(l),
            adapter.pattern_hook(l),
            adapter.value_hook(l),
        }
    model_dtype = next(model.parameters()).dtype
    rows = min(n_pos * (n_pos + 1) // 2, chunk * n_pos)  # rerun rows per MLP call, at most
    with threads.for_rows(rows):  # large reruns take every core (geolens.threads)
        for b in range(tokens.shape[0]):
            with torch.no_grad():
                _, cache = model.run_with_cache(
                    tokens[b : b + 1], names_filter=lambda name: name in wanted, stop_at_layer=layers[-1] + 1
                )
            for n, l in enumerate(layers):
                view = get_attention_layer(model, cache, l)
                resid_pre = cache[adapter.resid_pre_hook(l)][0]
                clean = cache[adapter.resid_post_hook(l)][0]
                attn_out = layer_output(view)[0] + view.b_O  # [query, d_model], float32
                v_tilde = torch.einsum("khd,hdm->hkm", view.v[0], view.W_O)  # [head, key, d_model]
                pattern = view.pattern[0]  # [head, query, key]
                wanted_query = torch.ones(n_pos, dtype=torch.bool, device=pattern.device)
                if queries is not None:
                    wanted_query[:] = False
                    wanted_query[queries[l]] = True
                with torch.no_grad():
                    rebuilt = adapter.block_after_attention(l, resid_pre[None], attn_out.to(model_dtype)[None])[0]
                    scale = clean.float().norm(dim=-1).clamp_min(1e-6)
                    err = float(((rebuilt - clean).float().norm(dim=-1) / scale).max())
                    if err > max(1e-3, 50 * torch.finfo(model_dtype).eps):  # rounding of the model's own dtype
                        raise RuntimeError(
                            f"value_zeroing: layer {l}: the block rebuilt from its attention output differs from "
                            f"the cached block output by {err:.2g} (relative); this block structure is not supported"
                        )
                    last = final_norm and l == n_layers - 1
                    # the rebuilt clean output is the reference, so a source that changes nothing scores 0
                    reference = adapter.final_norm(rebuilt[None])[0] if last else rebuilt
                    for start in range(0, n_pos, chunk):
                        sources = torch.arange(start, min(start + chunk, n_pos), device=pattern.device)
                        delta = torch.einsum(
                            "hqs,hsm->sqm", pattern[:, :, sources], v_tilde[:, sources]
                        )  # [source, query, d_model]
                        visible = (torch.arange(n_pos, device=pattern.device)[None] >= sources[:, None]) & wanted_query[
                            None
                        ]
                        s_idx, q_idx = visible.nonzero(as_tuple=True)
                        if s_idx.numel() == 0:
                            continue
                        rows = (attn_out[q_idx] - delta[s_idx, q_idx]).to(model_dtype)  # subtracted in float32
                        out = adapter.block_after_attention(l, resid_pre[q_idx][None], rows[None])[0]
                        if last:
                            out = adapter.final_norm(out[None])[0]
                        cos = torch.nn.functional.cosine_similarity(out.float(), reference[q_idx].float(), dim=-1)
                        scores[n, b, q_idx.cpu(), sources[s_idx].cpu()] = (1.0 - cos).cpu()
    if normalize:
        scores = scores / scores.sum(-1, keepdim=True).clamp_min(torch.finfo(scores.dtype).tiny)
    return scores
