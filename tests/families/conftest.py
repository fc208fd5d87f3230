"""What every family's test file checks (tests/families/test_<family>.py), one family at a time:

- the HF-native adapter is the class built from the family's layout;
- ``adapter_for(model)`` and ``geolens.run_with_cache(model, ...)`` leave a ``transformers`` model
  as it was (its ``__dict__`` object for object, its config, no hook left on any module);
- on a TransformerBridge the family gets one of its ``TL_ADAPTERS`` (and the bridge is not changed);
- every check of tests/support_checks.py on the family's tiny model equals its cell of the committed
  docs/support.json, on each backend this environment runs.

Each family's test file gets them all in three lines, ``class TestFamilyChecks(FamilyChecks)`` with
``family = "<family>"``; the helpers are imported as ``from families.conftest import ...``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import support_checks as checks
import torch

import geolens
from geolens.families import family
from geolens.hf.tiny import tiny_family

SUPPORT_JSON = Path(__file__).resolve().parents[2] / "docs" / "support.json"
FAST_CHECKS = [c for c in checks.CHECKS if c != "report"]  # the report's: slow tier
BACKENDS = [
    "hf",
    pytest.param("tl4-bridge", marks=[pytest.mark.slow, pytest.mark.bridge_only]),
    "tl2-hooked",  # in .venvs/tl2
]


def check_hf_adapter(name: str) -> None:
    """The HF-native adapter of family ``name`` is the class built from its layout."""
    layout = family(name).HF
    model = tiny_family(name)
    assert model.config.model_type in layout.model_types
    adapter = geolens.adapter_for(model)
    assert type(adapter).__name__ == layout.class_name and adapter.family == layout.family
    for key, value in layout.class_attributes().items():
        if key not in ("__doc__", "refuse"):
            assert getattr(adapter, key) == value, key
    assert adapter.post_attention_norm == (layout.post_norm_name is not None)


def _state(model) -> tuple[dict, dict, list]:
    """The model's own attributes, its config and the hooks on its modules."""
    hooks = [
        (name, len(m._forward_hooks), len(m._forward_pre_hooks), "forward" in vars(m))
        for name, m in model.named_modules()
    ]
    return dict(vars(model)), model.config.to_dict(), hooks


def check_model_unchanged(name: str) -> None:
    """``adapter_for`` and ``run_with_cache`` (and an analysis) leave family ``name``'s tiny model as it was."""
    model = tiny_family(name)
    attributes, config, hooks = _state(model)
    adapter = geolens.adapter_for(model)
    tokens = torch.tensor([[0, 5, 9, 4, 7, 8, 11, 12, 13, 14]])
    logits, cache = geolens.run_with_cache(model, tokens, names_filter=geolens.names_filter(model))
    geolens.contribution_weights(model, cache, layer=1)  # an analysis reads it through its adapter
    after, config_after, hooks_after = _state(model)
    assert after.keys() == attributes.keys() and all(after[k] is attributes[k] for k in attributes)
    assert config_after == config and hooks_after == hooks
    for entry in ("cfg", "to_tokens", "run_with_cache", "hooks", "run_with_hooks", "hook_dict", "tokenizer"):
        assert entry not in vars(model), entry
    assert type(model).forward is not None and "forward" not in vars(model)
    assert adapter.cfg.n_layers == 2 and tuple(logits.shape) == (1, 10, 64)
    with torch.no_grad():
        assert torch.allclose(model(tokens).logits, logits, atol=1e-5)  # its own forward, as before


def check_bridge_adapter(name: str) -> None:
    """On a TransformerBridge of family ``name``'s tiny model, ``adapter_for`` is one of its TL_ADAPTERS."""
    from geolens.adapter.bridge import transformer_bridge
    from geolens.testing import tiny_tokenizer

    bridge = transformer_bridge(
        f"geolens-tiny-{name}", tiny_family(name), tiny_tokenizer(), compatibility_mode=False, device="cpu"
    )
    before = dict(vars(bridge))
    assert type(geolens.adapter_for(bridge)) in family(name).TL_ADAPTERS
    assert vars(bridge).keys() == before.keys() and all(vars(bridge)[k] is v for k, v in before.items())


def check_support_cells(name: str, backend: str, which: list[str]) -> None:
    """The checks ``which`` on (family ``name``, ``backend``) equal the cells of docs/support.json."""
    if backend not in checks.available_backends():
        pytest.skip(f"this environment does not run the {backend} backend")
    committed = json.loads(SUPPORT_JSON.read_text(encoding="utf-8"))
    expected = {c: committed["results"][name][backend][c] for c in which}
    assert checks.run_cell(name, backend, checks=which) == expected


class FamilyChecks:
    """The checks above as tests for one family: subclass it as ``TestFamilyChecks`` in
    tests/families/test_<family>.py and set ``family`` (pytest collects the inherited tests there,
    never here: this class's name does not start with ``Test``)."""

    family: str

    def test_the_hf_adapter_is_built_from_the_family_layout(self):
        check_hf_adapter(self.family)

    def test_adapter_for_and_run_with_cache_never_change_the_model(self):
        check_model_unchanged(self.family)

    @pytest.mark.bridge_only
    def test_on_a_bridge_the_family_gets_one_of_its_tl_adapters(self):
        check_bridge_adapter(self.family)

    @pytest.mark.parametrize("backend", BACKENDS)
    def test_each_check_equals_its_reference(self, backend):
        """Every check but the report's: the cells of docs/support.json."""
        check_support_cells(self.family, backend, FAST_CHECKS)

    @pytest.mark.slow
    @pytest.mark.parametrize("backend", BACKENDS)
    def test_the_report_check_equals_its_reference(self, backend):
        check_support_cells(self.family, backend, ["report"])
