"""Effects resolved to float64 precision (docs/faithfulness/v3/PROTOCOL.md §1, §3).

:func:`float64_exact` makes a model cast to float64 compute its attention softmax and its RMS norms
in float64 too; :func:`numerical_floor` says how precisely a batch of single-position forwards
resolves effects, from its unperturbed row against the clean forward.
"""

from __future__ import annotations

import types
from contextlib import contextmanager

import torch
from torch import Tensor

EPS64 = float(torch.finfo(torch.float64).eps)


def numerical_floor(row: Tensor, reference: Tensor, target: int | None = None) -> dict[str, float]:
    """How precisely a batch resolves effects: ``row`` is the batch's unperturbed row, ``reference``
    the clean forward's logits at the same position (docs/faithfulness/v3/PROTOCOL.md §3).

    With δ_t the difference of their log-probabilities and p the reference distribution:
    ``floor`` = Σ_t p_t |δ_t| + ε Σ_t p_t |log p_t| (a perturbed row carrying an error of δ's size
    moves its computed KL by at most Σ p|δ| to first order; the sum itself rounds at ε Σ p |log p|,
    ε = 2⁻⁵²); ``reference_kl`` = KL(reference ‖ row); with ``target``, ``target_floor`` =
    |δ_target| + ε |log p_target|.

    >>> x = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    >>> f = numerical_floor(x, x)
    >>> f["reference_kl"] == 0.0, 0 < f["floor"] < 1e-15
    (True, True)
    """
    logp = torch.log_softmax(row.to(torch.float64), -1)
    ref = torch.log_softmax(reference.to(torch.float64), -1)
    p = ref.exp()
    delta = logp - ref
    weighted = torch.where(p > 0, p * ref.abs(), torch.zeros_like(p))
    out = dict(
        floor=float((p * delta.abs()).sum() + EPS64 * weighted.sum()),
        reference_kl=float(torch.where(p > 0, p * (ref - logp), torch.zeros_like(p)).sum()),
    )
    if target is not None:
        out["target_floor"] = float(delta[target].abs() + EPS64 * ref[target].abs())
    return out


def _weight_is_offset(module, forward) -> bool:
    """Whether an RMSNorm scales by (1 + weight) rather than by weight, read from the module's own
    output on an all-ones row (whose RMS is 1), not from its family's name."""
    weight = module.weight.detach().to(torch.float32)
    with torch.no_grad():
        out = forward(module, torch.ones(1, weight.shape[-1], dtype=module.weight.dtype, device=weight.device))
    out = out.detach().to(torch.float32).reshape(-1)
    return float((out - (1.0 + weight)).abs().max()) < float((out - weight).abs().max())


@contextmanager
def float64_exact(model):
    """Within the block, a model cast to float64 computes its attention softmax and its RMS norms in
    float64 too: the TransformerLens bridge's attention and Hugging Face's Llama and Gemma 3 RMS
    norms compute them in float32 whatever the model's dtype, which rounds α and the normalised
    residual to float32 precision (docs/faithfulness/v3/PROTOCOL.md §1). Inputs in other dtypes
    keep the model's own computation; the rotary angles are left as the model computes them. The
    patches are instance attributes, removed on exit; on a ``transformers`` model (the HF-native
    backend), whose eager attention asks ``torch.nn.functional.softmax`` for float32, a float64
    input keeps float64 within the block (``torch.nn.functional.softmax`` is restored on exit).

    >>> from geolens.per_term import per_term_effects
    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa", dtype=torch.float64)
    >>> with float64_exact(model):
    ...     e = per_term_effects(model, tiny_tokens(model, length=12)[:1], layer=1, query=-1)
    >>> e.kl.dtype, e.floor < 1e-12
    (torch.float64, True)
    """
    patched = []
    for module in model.modules():
        kind = type(module)
        if hasattr(kind, "_masked_softmax"):

            def softmax(self, scores, dtype=None, _original=kind._masked_softmax):
                return _original(self, scores, dtype=torch.float64 if scores.dtype == torch.float64 else dtype)

            object.__setattr__(module, "_masked_softmax", types.MethodType(softmax, module))  # not forwarded to HF
            patched.append((module, "_masked_softmax"))
        elif kind.__name__.endswith("RMSNorm") and kind.__module__.startswith("transformers"):
            eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
            offset = _weight_is_offset(module, kind.forward)  # Gemma's weight is an offset from 1

            def norm(self, x, _original=kind.forward, _eps=eps, _offset=offset):
                if x.dtype != torch.float64 or _eps is None:
                    return _original(self, x)
                y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + _eps)
                return y * (1.0 + self.weight) if _offset else self.weight * y

            object.__setattr__(module, "forward", types.MethodType(norm, module))
            patched.append((module, "forward"))
    # Hugging Face's eager attention (the HF-native backend, geolens.hf) asks softmax for float32
    # whatever its input: within the block a float64 input keeps float64. Not on a bridge, whose
    # attention softmax is its own _masked_softmax above.
    softmax_before = None
    if not any(name == "_masked_softmax" for _, name in patched) and any(
        type(m).__module__.startswith("transformers") for m in model.modules()
    ):
        softmax_before = torch.nn.functional.softmax

        def softmax64(input, dim=None, _stacklevel=3, dtype=None, _original=softmax_before):
            if dtype == torch.float32 and input.dtype == torch.float64:
                dtype = torch.float64
            return _original(input, dim=dim, _stacklevel=_stacklevel, dtype=dtype)

        torch.nn.functional.softmax = softmax64
    try:
        yield model
    finally:
        if softmax_before is not None:
            torch.nn.functional.softmax = softmax_before
        for module, name in patched:
            if name in vars(module):
                object.__delattr__(module, name)


@contextmanager
def float64_model(model):
    """The model cast to float64 and computing its softmax and RMS norms in float64
    (:func:`geolens.per_term.float64_exact`) for the block; every parameter and buffer gets its own
    dtype back on exit, exception or not (its values too: float32 → float64 → float32 is exact).

    >>> from geolens.testing import tiny_bridge
    >>> model = tiny_bridge("gqa")
    >>> with float64_model(model):
    ...     inside = next(model.parameters()).dtype
    >>> inside, next(model.parameters()).dtype
    (torch.float64, torch.float32)
    """
    before = {**_named_dtypes(model, "parameters"), **_named_dtypes(model, "buffers")}
    cfg = getattr(model, "cfg", None)
    cfg_dtype = getattr(cfg, "dtype", None)
    try:
        _cast_floating(model, lambda kind, key: torch.float64)
        _set_cfg_dtype(cfg, torch.float64)
        with float64_exact(model):
            yield model
    finally:
        _cast_floating(model, lambda kind, key: before.get((kind, key)))
        if cfg_dtype is not None:
            _set_cfg_dtype(cfg, cfg_dtype)


def _cast_floating(model, dtype_of) -> None:
    """Cast each floating-point parameter and buffer in place to ``dtype_of(kind, name)`` (None:
    left alone). ``model.to(dtype)`` casts the same tensors, but TransformerLens 4.x's bridge
    rebuilds its state dict for it: about 5 s each way on SmolLM2, against 0.7 s here, with
    bit-identical float64 logits (measured on SmolLM2 and Gemma 3)."""
    with torch.no_grad():
        for kind in ("parameters", "buffers"):
            for key, t in getattr(model, f"named_{kind}")():
                dtype = dtype_of(kind, key)
                if dtype is not None and t.is_floating_point() and t.dtype != dtype:
                    t.data = t.data.to(dtype)


def _set_cfg_dtype(cfg, dtype) -> None:
    if cfg is None or getattr(cfg, "dtype", None) in (None, dtype):
        return
    try:  # a TransformerLens config keeps its dtype as a field
        cfg.dtype = dtype
    except AttributeError:  # geolens.hf's config reads it from the model: cast above
        pass


def _named_dtypes(model, kind: str) -> dict[tuple[str, str], torch.dtype]:
    return {(kind, key): t.dtype for key, t in getattr(model, f"named_{kind}")()}
