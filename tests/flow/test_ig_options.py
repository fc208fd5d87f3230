"""geolens.flow.ig_options: integrated gradients' options resolved with their defaults."""

from __future__ import annotations

import pytest

from geolens.flow.ig_options import IG_DEFAULT_MAX_STEPS, IG_DEFAULT_STEPS, IG_DEFAULT_TOLERANCE, ig_settings


def test_the_default_is_the_local_grid_refined_to_one_percent():
    s = ig_settings({})
    assert (s["ig_grid"], s["ig_steps"], s["ig_tolerance"], s["ig_max_steps"]) == (
        "local",
        IG_DEFAULT_STEPS,
        IG_DEFAULT_TOLERANCE,
        IG_DEFAULT_MAX_STEPS,
    )
    assert s["kwargs"] == dict(n_steps=8, batch_size=8, grid="local", tolerance=0.01, max_steps=96)


def test_an_explicit_tolerance_keeps_the_flow_protocols_start_and_cap():
    s = ig_settings({"ig_tolerance": 1e-3})
    assert (s["ig_steps"], s["ig_max_steps"]) == (32, 864)


def test_fixed_rules_refine_only_with_a_tolerance():
    even, gl = ig_settings({"ig_grid": "even"}), ig_settings({"ig_grid": "gauss_legendre", "ig_batch": 4})
    assert "tolerance" not in even["kwargs"] and even["ig_steps"] == 64
    assert gl["kwargs"] == dict(n_steps=16, batch_size=4, grid="gauss_legendre")
    assert ig_settings({"ig_grid": "gauss_legendre", "ig_tolerance": 0.05})["kwargs"]["max_steps"] == 864
    with pytest.raises(ValueError, match="give ig_tolerance too"):
        ig_settings({"ig_grid": "even", "ig_max_steps": 96})
    with pytest.raises(ValueError, match="ig_grid must be"):
        ig_settings({"ig_grid": "simpson"})
