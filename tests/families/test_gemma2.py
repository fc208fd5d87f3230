"""geolens.families.gemma2: Gemma 2: attention-logit and final-logit soft-capping, alternating sliding
windows, and a norm after attention (``post_attention_layernorm``) and after the MLP.

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

    family = "gemma2"


def test_the_hooked_transformer_mapping():
    gemma2 = tiny_family("gemma2").config
    if not hasattr(gemma2, "rope_theta"):  # transformers 5 keeps it in rope_parameters: the mapping is TL 2.x's
        pytest.skip("the rotary families' mapping reads transformers 4.x configs (.venvs/tl2)")
    fields, converter = hooked_config(gemma2)
    assert fields["use_normalization_before_and_after"] and fields["attn_scores_soft_cap"] == 5.0
    assert fields["attn_types"] == ["local", "global"]
