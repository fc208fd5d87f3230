"""The pieces every intervention shares: the model by name, texts as token groups, the
context-manager half of every result (:class:`_Edit`)."""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass

import torch
from torch import Tensor

from geolens.interventions.base import applied

Head = tuple[int, int]


def _model(model):
    from geolens.models import resolve_model

    return resolve_model(model)[0]


@dataclass
class _Texts:
    """Texts as token groups of equal length: ``groups[k]`` ``[n_k, seq_k]`` holds the texts
    ``index[k]`` (their order in the call)."""

    groups: list[Tensor]
    index: list[list[int]]

    @property
    def n(self) -> int:
        return sum(len(i) for i in self.index)


def _texts(model, texts) -> _Texts:
    """One text, a list of texts, or token ids ``[seq]`` / ``[n, seq]`` (BOS first), grouped by length."""
    from geolens.validation import checked_text_tokens

    if isinstance(texts, str):
        texts = [texts]
    if isinstance(texts, Tensor):
        if texts.is_floating_point() or texts.is_complex() or texts.dtype == torch.bool:
            raise TypeError(f"token ids must be an integer tensor, got {texts.dtype}")
        if texts.ndim == 1:
            texts = texts[None]
        if texts.ndim != 2 or texts.shape[0] == 0 or texts.shape[1] < 2:
            raise ValueError(f"token ids must be [seq] or [n, seq] with seq ≥ 2, got {tuple(texts.shape)}")
        return _Texts([texts], [list(range(texts.shape[0]))])
    if not isinstance(texts, (list, tuple)) or not texts:
        raise TypeError(f"texts must be a string, a list of strings or token ids, got {type(texts).__name__}")
    rows: dict[int, list[tuple[int, Tensor]]] = {}
    for i, text in enumerate(texts):
        if not isinstance(text, str) or not text:
            raise ValueError(f"texts[{i}] must be a non-empty string, got {text!r}")
        tokens, _ = checked_text_tokens(model, text)
        if tokens.shape[-1] < 2:
            raise ValueError(f"texts[{i}] has no token to predict after BOS: {text!r}")
        rows.setdefault(int(tokens.shape[-1]), []).append((i, tokens[0]))
    groups, index = [], []
    for _, members in sorted(rows.items()):
        index.append([i for i, _ in members])
        groups.append(torch.stack([t for _, t in members]))
    return _Texts(groups, index)


class _Edit:
    """The context-manager half of every result: ``with result:`` applies ``fwd_hooks`` to the
    model, and removes them on any exit (:func:`geolens.interventions.applied`)."""

    model: object
    fwd_hooks: list

    def __enter__(self):
        self._stack = ExitStack()
        self._stack.enter_context(applied(self.model, self.fwd_hooks))
        return self

    def __exit__(self, *exc) -> bool:
        stack, self._stack = self._stack, None
        stack.close()
        return False

    def hooks(self):
        """The edit as a context manager (the same as ``with result:``)."""
        return applied(self.model, self.fwd_hooks)

    def _repr_html_(self) -> str:
        table = self.summary.to_html(index=False, float_format=lambda x: f"{x:.4g}") if self.measured else ""
        return f"<p><b>{type(self).__name__}</b>: {self.description}</p>{table}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.description})"
