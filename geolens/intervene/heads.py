"""Head ablation in one call: :func:`ablate_heads` and its result :class:`HeadAblation`; the
batched loss of many head sets per text that :mod:`geolens.intervene.regime` shares."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from geolens.claims import counted
from geolens.intervene._common import Head, _Edit, _model, _Texts, _texts
from geolens.interventions.ablation import AblationMode, MeanHeadZ, head_ablation_hooks, heads_by_layer
from geolens.interventions.base import applied
from geolens.runner import model_device, run_corpus
from geolens.sinks.drift import next_token_nll


def _head_list(model, heads) -> list[Head]:
    cfg = model.cfg
    if isinstance(heads, tuple) and len(heads) == 2 and all(isinstance(x, (int, np.integer)) for x in heads):
        heads = [heads]
    try:
        pairs = [(int(l), int(h)) for l, h in heads]
    except (TypeError, ValueError):
        raise TypeError(f"heads must be (layer, head) pairs, got {heads!r}") from None
    heads_by_layer(pairs, cfg.n_layers, cfg.n_heads)  # range checks (IndexError)
    return sorted(set(pairs))


def _means(model, texts: _Texts | None, means, how: str, batch_size: int):
    if how != "mean":
        return None, None
    if means is not None:
        return torch.as_tensor(means), "given"
    if texts is None:
        raise ValueError(
            "how='mean' needs means= (geolens.interventions.ablation.mean_head_z) or texts to average over"
        )
    stats = MeanHeadZ.for_model(model)
    for g in texts.groups:
        run_corpus(model, g, [stats], batch_size=batch_size, progress=False)
    return stats.result(), "the measured texts"


def _nll_per_condition(model, texts: _Texts, conditions: list[list[Head]], how, means, batch_size) -> np.ndarray:
    """Mean next-token NLL ``[condition, text]`` (nats), condition k ablating ``conditions[k]``
    (an empty list: the clean model); all conditions of a text run as rows of one batch (per-row
    head masks at ``hook_z``)."""
    cfg = model.cfg
    n_cond = len(conditions)
    table = torch.zeros(n_cond, cfg.n_layers, cfg.n_heads, dtype=torch.bool)
    for k, heads in enumerate(conditions):
        for l, h in heads:
            table[k, l, h] = True
    out = np.zeros((n_cond, texts.n))
    device = model_device(model)
    rows_per_batch = max(1, int(batch_size))
    with torch.no_grad():
        for group, index in zip(texts.groups, texts.index):
            group = group.to(device)
            for r, text_index in enumerate(index):
                seq = group[r : r + 1]
                for start in range(0, n_cond, rows_per_batch):
                    stop = min(n_cond, start + rows_per_batch)
                    masks = {l: table[start:stop, l] for l in range(cfg.n_layers) if bool(table[start:stop, l].any())}
                    hooks = head_ablation_hooks(model, masks, how, means) if masks else []
                    batch = seq.repeat(stop - start, 1)
                    with applied(model, hooks):
                        logits = model(batch, return_type="logits")
                    out[start:stop, text_index] = next_token_nll(logits, batch).mean(-1).cpu().numpy()
    return out


@dataclass(repr=False)
class HeadAblation(_Edit):
    """What :func:`ablate_heads` measured.

    Attributes:
        heads: the ablated ``(layer, head)`` pairs; ``how``: ``"zero"`` or ``"mean"``.
        clean_loss, ablated_loss: mean next-token NLL per text ``[text]`` (nats).
        means_from: where the mean-ablation means come from (None for zero ablation).

    >>> import geolens
    >>> from geolens.testing import tiny_bridge
    >>> a = geolens.intervene.ablate_heads(tiny_bridge("gqa"), "the cat sat", heads=[(1, 0)], how="mean")
    >>> a.means_from, len(a.clean_loss), round(a.delta_loss, 9) == round(float(a.summary.delta_loss[0]), 9)
    ('the measured texts', 1, True)
    """

    model: object
    heads: list
    how: str
    fwd_hooks: list
    clean_loss: np.ndarray | None = None
    ablated_loss: np.ndarray | None = None
    means_from: str | None = None

    @property
    def measured(self) -> bool:
        return self.clean_loss is not None

    @property
    def delta_loss(self) -> float:
        """Mean over texts of ablated − clean loss (nats per token)."""
        return float(np.mean(self.ablated_loss - self.clean_loss))

    @property
    def description(self) -> str:
        what = f"{counted(len(self.heads), 'head')} {self.how}-ablated"
        if not self.measured:
            return what + " (not measured)"
        return (
            f"{what}; {counted(len(self.clean_loss), 'text')}: loss {self.clean_loss.mean():.4f} → "
            f"{self.ablated_loss.mean():.4f} nats (Δ {self.delta_loss:+.4f})"
        )

    @property
    def summary(self) -> pd.DataFrame:
        """One row per text: ``text``, ``clean_loss``, ``ablated_loss``, ``delta_loss`` (nats)."""
        return pd.DataFrame(
            {
                "text": range(len(self.clean_loss)),
                "clean_loss": self.clean_loss,
                "ablated_loss": self.ablated_loss,
                "delta_loss": self.ablated_loss - self.clean_loss,
            }
        )

    def plot(self):
        """Δloss per text (nats per token), one bar each."""
        from geolens.viz.common import PlotView, new_figure

        s = self.summary
        fig = new_figure(figsize=(max(3.5, 0.4 * len(s) + 2), 3))
        ax = fig.subplots()
        ax.bar(s["text"], s["delta_loss"], color="tab:red")
        ax.axhline(0, color="k", lw=0.6)
        ax.set_xlabel("text (index in the call)")
        ax.set_ylabel("Δ loss (nats per token)")
        ax.set_title(self.description, fontsize=8)
        fig.tight_layout()
        return PlotView(fig, title="head ablation", data={"summary": s})


def ablate_heads(
    model,
    texts=None,
    heads: Sequence[Head] = (),
    how: AblationMode = "zero",
    *,
    means: Tensor | None = None,
    batch_size: int = 8,
) -> HeadAblation:
    """Ablate ``heads`` (``(layer, head)`` pairs) at ``hook_z`` and measure the loss change.

    ``how="zero"`` replaces each head's z_i by 0 (it adds nothing to the attention output);
    ``"mean"`` by its mean over ``means`` (``[n_layers, n_heads, d_head]``, e.g.
    :func:`geolens.interventions.ablation.mean_head_z` of reference windows) or, without
    ``means``, over the measured texts themselves (the result says so). Hooks:
    :func:`geolens.interventions.ablation.head_ablation_hooks`.

    >>> import geolens
    >>> from geolens.testing import tiny_bridge
    >>> model = tiny_bridge("gqa")
    >>> a = geolens.intervene.ablate_heads(model, ["the cat sat", "on the mat"], heads=[(0, 1), (1, 2)])
    >>> a.summary.shape, a.heads
    ((2, 4), [(0, 1), (1, 2)])
    >>> with geolens.intervene.ablate_heads(model, heads=[(0, 1)]):  # no texts: an edit for your forward
    ...     _ = model(model.to_tokens("the cat"))
    """
    if how not in ("zero", "mean"):
        raise ValueError(f"how must be 'zero' or 'mean', got {how!r}")
    model = _model(model)
    pairs = _head_list(model, heads)
    if not pairs:
        raise ValueError("heads is empty: name at least one (layer, head) pair")
    t = None if texts is None else _texts(model, texts)
    mean_z, means_from = _means(model, t, means, how, batch_size)
    result = HeadAblation(
        model, pairs, how, list(head_ablation_hooks(model, pairs, how, mean_z)), means_from=means_from
    )
    if t is None:
        return result
    nll = _nll_per_condition(model, t, [[], pairs], how, mean_z, batch_size)
    result.clean_loss, result.ablated_loss = nll[0], nll[1]
    return result
