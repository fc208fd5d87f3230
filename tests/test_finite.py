"""geolens.finite: NaN and inf named where they first appear, and the model's weights that hold them."""

from __future__ import annotations

import pytest
import torch

from geolens.finite import check_finite, non_finite_weights


def test_finite_values_pass_unchanged():
    x = torch.randn(2, 3)
    assert check_finite(x, what="scores", dims=("a", "b")) is x


def test_the_first_nan_or_inf_is_named_with_its_layer_and_count():
    x = torch.zeros(2, 3, 4)
    x[1, 2, 0] = float("inf")
    x[1, 2, 3] = float("nan")
    with pytest.raises(ValueError) as err:
        check_finite(x, what="the scores of metric 'm'", dims=("head", "query", "key"), layer=5)
    assert str(err.value) == (
        "the scores of metric 'm' hold inf at layer 5, head 1, query 2, key 0 (and 1 more NaN or inf): "
        "a score must be a finite number"
    )
    with pytest.raises(ValueError, match=r"hold NaN at query 0, key 1: the weights are broken$"):
        check_finite(
            torch.tensor([[0.0, float("nan")]]), what="x", dims=("query", "key"), cause="the weights are broken"
        )


def test_the_models_weights_holding_nan_are_named():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    assert non_finite_weights(model) == []
    with torch.no_grad():
        model[1].weight[0, 0] = float("nan")
        model[1].bias[1] = float("-inf")
    assert non_finite_weights(model) == ["1.weight (1 of 8 values)", "1.bias (1 of 2 values)"]
    with pytest.raises(
        ValueError, match=r": the model's weights hold NaN or inf: 1\.weight \(1 of 8 values\), 1\.bias"
    ):
        check_finite(model(torch.ones(1, 3)), what="the logits", dims=("batch", "vocab"), model=model)
