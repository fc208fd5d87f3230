"""The known-answer check of the input-token erasure test (docs/flow/PROTOCOL.md §6): on BOS and
a random sequence repeated twice, the flow into the prediction at the second occurrence of a token
should put its largest share outside that position on the token that followed its first occurrence."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd
import torch
from jaxtyping import Int
from torch import Tensor

from geolens.data import bos_token_id
from geolens.flow.core import FLOW_METHODS
from geolens.flow.erasure import flow_rows


def induction_tokens(model, n_tokens: int = 20, seed: int = 0) -> Int[Tensor, "pos"]:
    """BOS, ``n_tokens`` distinct ids, the same ids again (PROTOCOL.md §6): ids drawn without
    replacement by ``numpy.random.default_rng(seed)`` from [⌊V/50⌋, ⌊V/5⌋) minus special tokens."""
    V = int(model.cfg.d_vocab)
    special = set(getattr(model.tokenizer, "all_special_ids", []) or [])
    candidates = np.array([t for t in range(V // 50, V // 5) if t not in special])
    if candidates.size < n_tokens:
        raise ValueError(
            f"the vocabulary range [{V // 50}, {V // 5}) holds {candidates.size} ordinary ids, fewer than {n_tokens}"
        )
    ids = torch.from_numpy(np.random.default_rng(seed).choice(candidates, size=n_tokens, replace=False)).to(torch.long)
    return torch.cat([torch.tensor([bos_token_id(model)]), ids, ids])


def induction_check(model, *, n_tokens: int = 20, seed: int = 0, methods: Sequence[str] = FLOW_METHODS):
    """The known-answer check (PROTOCOL.md §6): for k = 1 … n_tokens − 1 and each flow method, is
    the largest share of the flow row of q = n_tokens + k outside q itself on k + 1 (the token
    that followed the first occurrence)? A DataFrame, one row per (method, k): ``share_target``,
    ``largest_other`` (position and share of the largest share outside q), ``rank_target``
    (1 = largest), ``passes``, and the same with BOS also left out (``*_no_bos``)."""
    tokens = induction_tokens(model, n_tokens, seed)
    queries = [n_tokens + k for k in range(1, n_tokens)]
    rows, _ = flow_rows(model, tokens, queries, methods)
    out = []
    for m in methods:
        for r, k in enumerate(range(1, n_tokens)):
            q, target = n_tokens + k, k + 1
            row = rows[m][r].to(torch.float64)
            rec = dict(method=m, k=k, query=q, target=target, share_target=float(row[target]))
            for suffix, skip in (("", [q]), ("_no_bos", [0, q])):
                others = row[: q + 1].clone()
                others[skip] = -math.inf
                order = sorted(range(q + 1), key=lambda j: (-float(others[j]), j))
                rec[f"largest_other{suffix}"] = order[0]
                rec[f"largest_share{suffix}"] = float(others[order[0]])
                rec[f"rank_target{suffix}"] = order.index(target) + 1
                rec[f"passes{suffix}"] = order[0] == target
            out.append(rec)
    return pd.DataFrame(out)


def induction_summary(table) -> dict:
    """Per method: how many k pass, and by how much the others miss (median gap between the
    largest share outside q and the target's share, median rank of the target)."""
    out = {}
    for m, g in table.groupby("method", sort=False):
        rec = {"n": int(len(g))}
        for suffix in ("", "_no_bos"):
            fail = g[~g[f"passes{suffix}"]]
            rec[f"passed{suffix}"] = int(g[f"passes{suffix}"].sum())
            rec[f"median_rank_target{suffix}"] = float(g[f"rank_target{suffix}"].median())
            rec[f"median_gap_when_failing{suffix}"] = (
                float((fail[f"largest_share{suffix}"] - fail["share_target"]).median()) if len(fail) else 0.0
            )
        rec["passes"] = rec["passed"] == rec["n"]
        out[str(m)] = rec
    return out
