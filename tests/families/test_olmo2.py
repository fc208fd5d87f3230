"""geolens.families.olmo2: OLMo 2: q/k norms over all heads, and norms after attention and after the
MLP (none before them).

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

    family = "olmo2"


def test_transformer_lens_2_cannot_hold_it():
    with pytest.raises(NotImplementedError, match="no OLMo 2 conversion"):
        hooked_config(tiny_family("olmo2").config)
