"""Shared inputs of the selection tests: ``corpus(model)``, five token windows of a tiny model
(imported as ``from selection.conftest import corpus``)."""

from __future__ import annotations

import torch

from geolens.testing import tiny_tokens


def corpus(model):
    """``[5, 12]`` token windows: the three default texts and two more, BOS first."""
    return torch.cat(
        [tiny_tokens(model, length=12), tiny_tokens(model, ("hello there my friend", "zz top 123"), length=12)]
    )
