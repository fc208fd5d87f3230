"""geolens.families.llama: Llama (and SmolLM2): RMSNorm, rotary, grouped-query attention, separate
q/k/v/o projections without biases. The HF-native layout is the generic one
(:class:`geolens.hf.base.HFAdapter`).

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
from geolens.families import hooked_config
from geolens.hf.tiny import tiny_family

FAMILY = "llama"


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


def test_the_hooked_transformer_mapping():
    llama = tiny_family("llama").config
    if not hasattr(llama, "rope_theta"):  # transformers 5 keeps it in rope_parameters: the mapping is TL 2.x's
        pytest.skip("the rotary families' mapping reads transformers 4.x configs (.venvs/tl2)")
    fields, converter = hooked_config(llama)
    assert converter == "convert_llama_weights" and fields["rotary_base"] == llama.rope_theta
