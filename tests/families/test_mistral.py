"""geolens.families.mistral: Mistral: Llama with one sliding window on every layer
(``config.sliding_window``).

On its tiny model (geolens.hf.tiny), what tests/families/conftest.py checks for every family: the
HF-native adapter built from its layout, the model left unchanged, one of its TL_ADAPTERS on a
TransformerBridge, and every support check equal to its cell of docs/support.json on each backend."""

from __future__ import annotations

from families.conftest import FamilyChecks


class TestFamilyChecks(FamilyChecks):
    """Every family's checks (tests/families/conftest.py) on this one."""

    family = "mistral"
