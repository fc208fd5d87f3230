"""geolens.families.llama: Llama (and SmolLM2): RMSNorm, rotary, grouped-query attention, separate
q/k/v/o projections without biases. The HF-native layout is the generic one
(:class:`geolens.hf.base.HFAdapter`).

On its tiny model (geolens.hf.tiny), what tests/families/conftest.py checks for every family: the
HF-native adapter built from its layout, the model left unchanged, one of its TL_ADAPTERS on a
TransformerBridge, and every support check equal to its cell of docs/support.json on each backend."""

from __future__ import annotations

import pytest

from families.conftest import FamilyChecks
from geolens.families import hooked_config
from geolens.hf.tiny import tiny_family


class TestFamilyChecks(FamilyChecks):
    """Every family's checks (tests/families/conftest.py) on this one."""

    family = "llama"


def test_the_hooked_transformer_mapping():
    llama = tiny_family("llama").config
    if not hasattr(llama, "rope_theta"):  # transformers 5 keeps it in rope_parameters: the mapping is TL 2.x's
        pytest.skip("the rotary families' mapping reads transformers 4.x configs (.venvs/tl2)")
    fields, converter = hooked_config(llama)
    assert converter == "convert_llama_weights" and fields["rotary_base"] == llama.rope_theta
