"""Value Zeroing's home (geolens.interventions.value_zeroing): below the metric registry, which
registers it when it is imported (no import of geolens.faithfulness needed), and the same function
under its public names (geolens.value_zeroing, geolens.faithfulness.value_zeroing). Its numbers
against a naive rerun: tests/faithfulness/test_value_zeroing.py."""

from __future__ import annotations

import subprocess
import sys

import torch

from geolens.interventions.value_zeroing import value_zeroing


def test_importing_the_metric_registry_registers_value_zeroing_without_faithfulness():
    code = (
        "import sys, geolens.metrics as m, geolens.methods as r; "
        "assert 'value_zeroing' in m.metric_names() and r.get_method('value_zeroing').level == 'layer'; "
        "assert not any(k.startswith('geolens.faithfulness') for k in sys.modules), sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_the_metric_and_the_public_names_are_this_function():
    import geolens
    from geolens.faithfulness import value_zeroing as from_faithfulness
    from geolens.metrics import SequenceInputs, get_metric
    from geolens.testing import tiny_tokens
    from tests.conftest import make_tiny

    assert geolens.value_zeroing is value_zeroing and from_faithfulness is value_zeroing
    model = make_tiny("gqa")  # a TransformerBridge on TL 4.x, a HookedTransformer on TL 2.x
    tokens = tiny_tokens(model, length=10)[:1]
    metric = get_metric("value_zeroing")
    scores = metric.fn(SequenceInputs(model, tokens, (1,), model.cfg.n_heads, seed=0))
    assert scores.shape == (1, 1, 1, 10, 10)  # [layer, batch, head (one for every head), query, key]
    assert torch.equal(scores[:, :, 0], value_zeroing(model, tokens, [1]))
