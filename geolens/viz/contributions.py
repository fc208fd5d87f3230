"""Contribution weights next to attention, as circuitsvis views and matplotlib plots (docs/method.md §2).

- :func:`signed_heatmaps`: any ``[head, query, key]`` tensor as circuitsvis ``AttentionHeads``:
  positive values blue, negative values red, zero white. circuitsvis colours a value v ≥ 0 by
  v / ``maxValue`` and v < 0 by v / ``minValue`` (mixed linearly with white; its defaults are
  ±1, so contribution weights above 1 would saturate). ``scale="symmetric"`` (the default)
  passes ``maxValue = m`` and ``minValue = −m`` with m = max |v|, so equal magnitudes get equal
  intensity whatever the sign; ``scale="per_sign"`` gives each sign its own scale
  (``maxValue`` = the largest positive value, ``minValue`` = the most negative one), so that
  negatives much smaller than the positives are still visibly red.
- :func:`contribution_heatmaps`: one layer's raw attention α_ij and contribution weights c_ij
  (intra- or inter-head), or any per-layer metric of :mod:`geolens.metrics`, per head, side by
  side, for one sequence. A metric with negative values (contribution weights) uses the per-sign
  scale: their negatives are typically one to two orders of magnitude smaller than the largest
  positive weight, and on a symmetric scale they render as near-white (pale cream). The caption
  names the metric as the registry does (label and formula) and states both ends of the scale.
- :func:`source_colors`: the sources of one query coloured by attention and by contribution
  (circuitsvis ``ColoredTokens``): per head (α_ij^h, intra c_ij^h) or for the whole layer (head
  mean of α, and the per-source inter-head totals C_ij = Σ_h c_ij^h, which sum to 1 like α).
- :func:`sink_attention_vs_contribution_plot`: per layer, the mean attention to the sink α_i0
  against its mean contribution c_i0 (matplotlib).

Every function returns an :class:`~geolens.viz.common.HTMLView` or
:class:`~geolens.viz.common.PlotView`, which displays in a notebook, saves with ``.save(path)``
and carries its numbers in ``.data``.
"""

from __future__ import annotations

from typing import Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from geolens.adapter import get_attention_layer, model_mode
from geolens.claims import counted
from geolens.factors import attention_metrics
from geolens.metrics import LayerInputs, get_metric
from geolens.validation import check_choice, check_head
from geolens.viz.common import Component, HTMLView, PlotView, new_figure

POSITIVE_COLOR = "blue"
NEGATIVE_COLOR = "red"


def str_tokens(model, tokens: Tensor) -> list[str]:
    """One string per token id of a 1-D ``tokens`` tensor (decoded one at a time).

    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")  # a character-level tokenizer
    >>> str_tokens(model, tiny_tokens(model)[0])[:5]
    ['<bos>', 't', 'h', 'e', ' ']
    """
    if tokens.ndim != 1:
        raise ValueError(f"expected a 1-D tensor of token ids, got shape {tuple(tokens.shape)}")
    return [model.tokenizer.decode([t]) for t in tokens.tolist()]


def _symmetric_scale(values: Tensor) -> float:
    """max |values| (1 when all are zero)."""
    m = float(values.abs().max()) if values.numel() else 0.0
    return m if m > 0 else 1.0


def _scaled_part(values: Float[Tensor, "head query key"]) -> Tensor:
    """Queries ≥ 1: query 0 sees only itself (α_00 = c_00 = 1) and would set the scale."""
    return values[:, 1:] if values.shape[1] > 1 else values


def _heatmap_scale(values: Float[Tensor, "head query key"]) -> float:
    """max |v| over queries ≥ 1."""
    return _symmetric_scale(_scaled_part(values))


def _per_sign_scale(values: Tensor) -> tuple[float, float]:
    """(most negative value, largest positive value) of ``values`` (−1 / 1 when a sign is absent)."""
    lo = float(values.min()) if values.numel() else 0.0
    hi = float(values.max()) if values.numel() else 0.0
    return (lo if lo < 0 else -1.0), (hi if hi > 0 else 1.0)


def signed_heatmaps(
    values: Float[Tensor, "head query key"],
    tokens: Sequence[str],
    *,
    head_names: Sequence[str] | None = None,
    max_abs: float | None = None,
    title: str = "",
    caption: str | None = None,
    negative_color: str = NEGATIVE_COLOR,
    positive_color: str = POSITIVE_COLOR,
    scale: str = "symmetric",
) -> HTMLView:
    """circuitsvis ``AttentionHeads`` of signed values.

    ``scale="symmetric"``: the scale is [−max_abs, max_abs]; ``max_abs`` defaults to max |values|
    over queries ≥ 1 (query 0 attends only to itself, so its trivial value 1 would wash out the
    scale; values beyond the scale saturate). ``scale="per_sign"``: negatives go from white (0) to
    full red at the most negative value, positives to full blue at the largest one (over queries
    ≥ 1; ``max_abs`` is then ignored). ``.data["scale"]`` holds both ends. The causal upper
    triangle is masked.
    """
    check_choice(scale, ("symmetric", "per_sign"), name="scale")
    if values.ndim != 3 or values.shape[1] != values.shape[2]:
        raise ValueError(f"values must be [head, query, key] with query == key, got {tuple(values.shape)}")
    if len(tokens) != values.shape[-1]:
        raise ValueError(f"{counted(len(tokens), 'token')} for {counted(values.shape[-1], 'position')}")
    values = values.detach().to("cpu", torch.float64)
    if not torch.isfinite(values).all():
        raise ValueError("values contain NaN or inf")
    names = list(head_names) if head_names is not None else [f"Head {h}" for h in range(values.shape[0])]
    if len(names) != values.shape[0]:
        raise ValueError(f"{counted(len(names), 'head name')} for {counted(values.shape[0], 'head')}")
    m = _heatmap_scale(values) if max_abs is None else float(max_abs)
    lo, hi = (-m, m) if scale == "symmetric" else _per_sign_scale(_scaled_part(values))
    if scale == "per_sign":
        m = max(-lo, hi)
    props = {
        "attention": values,
        "tokens": list(tokens),
        "attentionHeadNames": names,
        "maxValue": hi,
        "minValue": lo,
        "negativeColor": negative_color,
        "positiveColor": positive_color,
        "maskUpperTri": True,
    }
    return HTMLView(
        [Component("AttentionHeads", props, caption=caption)],
        title=title,
        data={
            "values": values,
            "tokens": list(tokens),
            "head_names": names,
            "max_abs": m,
            "scale": {"kind": scale, "min": lo, "max": hi},
        },
    )


def _check_batch(tokens: Tensor, batch_index: int) -> Tensor:
    if tokens.ndim == 1:
        tokens = tokens[None]
    if not 0 <= batch_index < tokens.shape[0]:
        raise IndexError(f"batch_index {batch_index} out of range for {counted(tokens.shape[0], 'sequence')}")
    return tokens[batch_index]


def contribution_heatmaps(
    model,
    cache,
    tokens: Tensor,
    layer: int,
    *,
    batch_index: int = 0,
    mode: str = "intra",
    heads: Sequence[int] | None = None,
    metrics: Sequence[str] = ("raw_attention", "contribution"),
) -> HTMLView:
    """Raw attention and contribution weights of one layer, per head, for one sequence.

    Each per-layer metric of :mod:`geolens.metrics` named in ``metrics`` (built-in or registered
    with :func:`geolens.register_metric`) becomes one ``AttentionHeads`` component with its own
    scale: symmetric for a metric without negative values over queries ≥ 1, per sign otherwise
    (contribution weights can be negative and can exceed 1; attention cannot). Its caption is the
    registry's label and description with both ends of the scale. ``.data`` holds every value
    shown, the scales and, per metric, the share of visible (query, source) pairs below 0.

    >>> import geolens
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")
    >>> tokens = tiny_tokens(model)  # [2, 20]
    >>> _, cache = model.run_with_cache(tokens, names_filter=geolens.names_filter(model))
    >>> view = contribution_heatmaps(model, cache, tokens, 1)  # shows itself in a notebook; view.save("heads.html")
    >>> [c.name for c in view.components], len(view.data["tokens"])
    (['AttentionHeads', 'AttentionHeads'], 20)
    """
    drawn = [get_metric(name) for name in metrics]  # ValueError naming the registered metrics
    needs_model = [m.name for m in drawn if not m.per_layer]
    if needs_model:
        raise ValueError(
            f"metrics {needs_model} are computed per sequence from the model (per_layer=False): draw per-layer metrics here"
        )
    seq = _check_batch(tokens, batch_index)
    view_of_layer = get_attention_layer(model, cache, layer)
    inputs = LayerInputs.from_layer(view_of_layer, mode)
    words = str_tokens(model, seq)
    head_idx = list(range(model.cfg.n_heads)) if heads is None else [int(h) for h in heads]
    names = [f"L{view_of_layer.layer}H{h}" for h in head_idx]
    data = {
        "layer": view_of_layer.layer,
        "mode": mode,
        "model_mode": model_mode(model),
        "heads": head_idx,
        "tokens": words,
    }
    components = []
    visible = torch.tril(torch.ones(len(words), len(words), dtype=torch.bool))
    for metric in drawn:
        values = metric.layer_scores(inputs, summed=False)[batch_index, head_idx].detach().double().cpu()
        signed = bool((_scaled_part(values) < 0).any())
        view = signed_heatmaps(values, words, head_names=names, scale="per_sign" if signed else "symmetric")
        lo, hi = view.data["scale"]["min"], view.data["scale"]["max"]
        view.components[0].caption = _caption(metric, mode, lo, hi, signed)
        components += view.components
        data[metric.name] = values
        data[f"{metric.name}_max_abs"] = view.data["max_abs"]
        data[f"{metric.name}_scale"] = view.data["scale"]
        data[f"{metric.name}_negative_share"] = float((values[:, visible] < 0).double().mean())
    title = f"Layer {view_of_layer.layer}: attention vs contribution weights ({mode}-head)"
    return HTMLView(components, title=title, data=data)


def _caption(metric, mode: str, lo: float, hi: float, signed: bool) -> str:
    """The caption of one heatmap: the registry's label and formula, and both ends of its colour scale."""
    what = f"{metric.label}, {metric.description}" if metric.description else metric.label
    if not signed:
        return f"{what} ({mode}-head): white 0 … full blue {hi:+.3g} over queries ≥ 1; no negative value here"
    return (
        f"{what} ({mode}-head): blue positive, white 0 … full blue {hi:+.3g}; red negative (destructive), white 0 … "
        f"full red {lo:+.3g}. Each sign has its own scale (the largest positive value is {hi / -lo:.3g}× the most "
        "negative one), so that small negatives stay visible: compare intensities within a sign only."
    )


def source_colors(
    model,
    cache,
    tokens: Tensor,
    layer: int,
    *,
    query: int = -1,
    head: int | None = None,
    batch_index: int = 0,
) -> HTMLView:
    """Sources of one query coloured by attention and by contribution (circuitsvis ``ColoredTokens``).

    ``head=h``: α_ij^h and the intra-head c_ij^h of that head. ``head=None``: the head mean of
    α_ij and the inter-head per-source totals C_ij = Σ_h c_ij^h (both sum to 1 over sources).
    Only the visible sources j ≤ i are shown; both rows use one symmetric scale each.

    >>> import geolens
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")
    >>> tokens = tiny_tokens(model)
    >>> _, cache = model.run_with_cache(tokens, names_filter=geolens.names_filter(model))
    >>> view = source_colors(model, cache, tokens, 1, query=5)  # the sources 0 … 5 of query 5
    >>> [c.name for c in view.components], view.data["tokens"], round(float(view.data["attention"].sum()), 4)
    (['ColoredTokens', 'ColoredTokens'], ['<bos>', 't', 'h', 'e', ' ', 'c'], 1.0)
    """
    seq = _check_batch(tokens, batch_index)
    words = str_tokens(model, seq)
    n = len(words)
    i = query % n if -n <= query < n else None
    if i is None:
        raise IndexError(f"query {query} out of range for {counted(n, 'position')}")
    mode = "intra" if head is not None else "inter"
    m = attention_metrics(model, cache, layer, mode)
    alpha = m.raw_attention[batch_index, :, i, : i + 1].detach().double().cpu()
    contrib = m.contribution[batch_index, :, i, : i + 1].detach().double().cpu()
    if head is None:
        attn_row, contrib_row, who = alpha.mean(0), contrib.sum(0), "layer (head mean α, Σ_h c)"
    else:
        head = check_head(head, model.cfg.n_heads)
        attn_row, contrib_row, who = alpha[head], contrib[head], f"head {head}"
    shown = words[: i + 1]
    components = []
    for label, row in (("attention", attn_row), ("contribution", contrib_row)):
        scale = _symmetric_scale(row)
        top = torch.argsort(row, descending=True, stable=True)[:3].tolist()
        tops = ", ".join(f"{words[j]!r}@{j} {row[j]:+.3f}" for j in top)
        props = {
            "tokens": shown,
            "values": row,
            "minValue": -scale,
            "maxValue": scale,
            "negativeColor": NEGATIVE_COLOR,
            "positiveColor": POSITIVE_COLOR,
        }
        components.append(Component("ColoredTokens", props, caption=f"{label} of each source (top: {tops})"))
    title = f"Layer {m.layer}, {who}: sources of query {i} {words[i]!r}"
    data = {
        "layer": m.layer,
        "head": head,
        "query": i,
        "tokens": shown,
        "attention": attn_row,
        "contribution": contrib_row,
        "mode": mode,
        "model_mode": m.model_mode,
    }
    return HTMLView(components, title=title, data=data)


def sink_attention_vs_contribution_plot(
    sink_attention: Float[Tensor, "layer"],
    sink_contribution: Float[Tensor, "layer"],
    *,
    sink_attention_sem: Float[Tensor, "layer"] | None = None,
    sink_contribution_sem: Float[Tensor, "layer"] | None = None,
    title: str = "Sink: attention vs contribution",
) -> PlotView:
    """Per layer, mean α_i0 and mean c_i0 (with standard errors when given).

    >>> view = sink_attention_vs_contribution_plot(torch.tensor([0.5, 0.8, 0.9]), torch.tensor([0.1, 0.2, 0.05]))
    >>> type(view).__name__, len(view.figure.axes)  # view.save("sink.png")
    ('PlotView', 1)
    """
    a = torch.as_tensor(sink_attention, dtype=torch.float64).cpu()
    c = torch.as_tensor(sink_contribution, dtype=torch.float64).cpu()
    if a.shape != c.shape or a.ndim != 1:
        raise ValueError(f"expected two [layer] tensors of equal length, got {tuple(a.shape)} and {tuple(c.shape)}")
    layers = torch.arange(a.numel())
    fig = new_figure(figsize=(6.4, 3.4))
    ax = fig.add_subplot(1, 1, 1)
    for values, sem, label, color in (
        (a, sink_attention_sem, "attention to sink α_i0", "tab:blue"),
        (c, sink_contribution_sem, "contribution of sink c_i0 (intra)", "tab:red"),
    ):
        ax.plot(layers, values, marker="o", ms=3, label=label, color=color)
        if sem is not None:
            s = torch.as_tensor(sem, dtype=torch.float64).nan_to_num(0.0)
            ax.fill_between(layers, values - 1.96 * s, values + 1.96 * s, color=color, alpha=0.2)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel("layer")
    ax.set_ylabel("mean over heads and queries")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    data = {
        "sink_attention": a,
        "sink_contribution": c,
        "sink_attention_sem": sink_attention_sem,
        "sink_contribution_sem": sink_contribution_sem,
    }
    return PlotView(fig, title=title, data=data)
