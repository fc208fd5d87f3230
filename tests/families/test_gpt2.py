"""geolens.families.gpt2: GPT-2: learned absolute positions, LayerNorm, ``Conv1D`` projections (fused
q/k/v in ``c_attn``), biases everywhere.

On its tiny model (geolens.hf.tiny), what tests/families/conftest.py checks for every family: the
HF-native adapter built from its layout, the model left unchanged, one of its TL_ADAPTERS on a
TransformerBridge, and every support check equal to its cell of docs/support.json on each backend."""

from __future__ import annotations

import pytest

import geolens
from families.conftest import FamilyChecks
from geolens.families import hooked_config
from geolens.hf.tiny import tiny_family


class TestFamilyChecks(FamilyChecks):
    """Every family's checks (tests/families/conftest.py) on this one."""

    family = "gpt2"


def test_a_family_can_refuse_a_model_it_cannot_read():
    model = tiny_family("gpt2")
    model.config.reorder_and_upcast_attn = True
    with pytest.raises(ValueError, match="reorder_and_upcast_attn=True bypasses the attention interface"):
        geolens.adapter_for(model)


def test_the_hooked_transformer_mapping():
    fields, converter = hooked_config(tiny_family("gpt2").config)
    assert converter == "convert_gpt2_weights" and fields["normalization_type"] == "LN" and fields["n_layers"] == 2
