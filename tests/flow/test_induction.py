"""The induction check of the flow erasure test (geolens.flow.induction): induction_tokens (a random
sequence twice after BOS, no special token) and induction_check, whose rows are read from the flow
matrix of those tokens, leaving no hook behind."""

from __future__ import annotations

import pytest
import torch

from geolens.flow import (
    contribution_flow,
    flow_names_filter,
    induction_check,
    induction_summary,
    induction_tokens,
)
from geolens.interventions.base import active_hook_count


@pytest.fixture
def model(erasure_model):
    """The package's erasure model (tests/flow/conftest.py), under the name these tests use."""
    return erasure_model


def test_induction_check_reads_the_flow_rows(model):
    tokens = induction_tokens(model, 6, seed=0)
    assert (
        tokens[0] == model.tokenizer.bos_token_id
        and torch.equal(tokens[1:7], tokens[7:])
        and len(set(tokens[1:7].tolist())) == 6
    )
    assert not set(tokens[1:].tolist()) & set(model.tokenizer.all_special_ids)
    table = induction_check(model, n_tokens=6, methods=("contribution", "alti"))
    assert active_hook_count(model) == model.geolens_test_hooks
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens[None], names_filter=flow_names_filter(model))
        R = contribution_flow(model, cache, "alti")[0]
    for r in table[table.method == "alti"].itertuples():
        row = R[r.query].tolist()
        others = [(row[j], -j) for j in range(r.query) if j != r.query]
        best = -max(others)[1]
        assert (
            r.largest_other == best
            and r.passes == (best == r.k + 1)
            and r.share_target == pytest.approx(row[r.k + 1], abs=1e-6)
        )
        assert r.rank_target == 1 + sum(1 for v, mj in others if (v, mj) > (row[r.k + 1], -(r.k + 1)))
    s = induction_summary(table)
    assert s["alti"]["n"] == 5 and s["alti"]["passed"] == int(table[table.method == "alti"].passes.sum())
    with pytest.raises(ValueError, match="fewer than"):
        induction_tokens(model, 20)
