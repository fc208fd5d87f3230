"""geolens.families.gemma3: Gemma 3 (text): Gemma 2's block (a norm after attention) with q/k norms,
and local and global rotary bases.

On its tiny model (geolens.hf.tiny), what tests/families/conftest.py checks for every family: the
HF-native adapter built from its layout, the model left unchanged, one of its TL_ADAPTERS on a
TransformerBridge, and every support check equal to its cell of docs/support.json on each backend."""

from __future__ import annotations

import pytest

from families.conftest import (
    BACKENDS,
    FAST_CHECKS,
    check_bridge_adapter,
    check_hf_adapter,
    check_model_unchanged,
    check_support_cells,
)

FAMILY = "gemma3"


def test_the_hf_adapter_is_built_from_the_family_layout():
    check_hf_adapter(FAMILY)


def test_adapter_for_and_run_with_cache_never_change_the_model():
    check_model_unchanged(FAMILY)


@pytest.mark.bridge_only
def test_on_a_bridge_the_family_gets_one_of_its_tl_adapters():
    check_bridge_adapter(FAMILY)


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_check_equals_its_reference(backend):
    """Every check but the report's: the cells of docs/support.json."""
    check_support_cells(FAMILY, backend, FAST_CHECKS)


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_report_check_equals_its_reference(backend):
    check_support_cells(FAMILY, backend, ["report"])
