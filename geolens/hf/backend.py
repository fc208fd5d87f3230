"""The HF-native backend: a plain ``transformers`` model that every geolens function accepts.

A ``PreTrainedModel`` is read as it is: ``geolens.adapter_for(model)`` and
:func:`run_with_cache` never change it (no attribute, no hook left behind: its ``__dict__`` is the
same object for object after the call). The backend's per-model state (the hook points of
:mod:`geolens.hf.capture`, the config view below, whether the load-time check has run) lives in a
``WeakKeyDictionary`` keyed by the model (:func:`sites`, :func:`config`).

:func:`prepare` (what ``geolens.load_model(..., backend="hf")``, ``run_corpus`` and
``stream_corpus`` call) is the one place that gives the *instance* the few TransformerLens-style
entry points geolens and its users call on a model, without changing its class or its Hugging
Face forward:

- ``model.cfg``: the shapes geolens reads (``n_layers``, ``n_heads``, ``n_key_value_heads``,
  ``d_head``, ``d_model``, ``d_vocab``, ``n_ctx``, ``model_name``), from the HF config
  (:func:`config`);
- ``model.run_with_cache(tokens, names_filter=None, attention_mask=None, stop_at_layer=None)``
  → ``(logits, cache)``, a dict keyed by TransformerLens hook names (:mod:`geolens.hf.capture`);
- ``model.hooks(fwd_hooks=...)``, ``model.run_with_hooks(tokens, fwd_hooks=...)`` and
  ``model.hook_dict`` (the hook names);
- ``model(tokens, return_type="logits")`` (or ``stop_at_layer=``) returns the logits tensor as a
  TransformerLens model does; any call without those keywords is the model's own Hugging Face
  forward, unchanged;
- ``model.to_tokens(text, prepend_bos=...)`` and ``model.tokenizer`` when a tokenizer is given.

Padded batches: with ``attention_mask`` and no ``position_ids``, positions are counted over the
real tokens of each row (as ``generate`` does), so a left-padded row of an absolute-position model
(GPT-2) equals the prompt run alone.

Before the first forward through the backend, :func:`geolens.hf.check.check_attention`
verifies on a short random input that the attention output rebuilt from the captured pattern and
v, Σ_h z^h W_O^h + b_O, equals the attention module's output in every layer; a family whose
attention geolens would read wrongly raises there, naming the family and the layer.
"""

from __future__ import annotations

import contextlib
import types
import weakref
from typing import Any, Callable, Iterable, Iterator, Mapping

import torch
from torch import Tensor

from geolens.adapter import adapter_for
from geolens.hf.capture import Run, Sites, StopForward

_STATE: "weakref.WeakKeyDictionary[Any, Sites]" = weakref.WeakKeyDictionary()  # model → its backend state
_PREPARED: "weakref.WeakSet[Any]" = weakref.WeakSet()  # models given entry points by prepare
_TL_KEYWORDS = ("return_type", "stop_at_layer")


class HFConfig(types.SimpleNamespace):
    """The TransformerLens-style config view of a Hugging Face model (``model.cfg``): ``n_layers``,
    ``n_heads``, ``n_key_value_heads``, ``d_head``, ``d_model``, ``d_vocab``, ``n_ctx``,
    ``model_name``, ``architecture``, ``attention_dir``; ``device`` and ``dtype`` are the model's."""

    @property
    def device(self) -> torch.device:
        return next(self._model().parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self._model().parameters()).dtype


def sites(model) -> Sites:
    """The hook points of a ``transformers`` model (its backend state, made at the first call and
    held weakly; the model itself is not changed). ``TypeError`` for any other model."""
    try:
        return _STATE[model]
    except KeyError:
        pass
    except TypeError:
        raise TypeError(f"{type(model).__name__} is not a transformers model") from None
    adapter = adapter_for(model)
    if adapter.model_mode != "hf":
        raise TypeError(f"{type(model).__name__} is not a transformers model (the HF-native backend)")
    state = Sites(model, adapter, adapter.check_attention)
    state.cfg = _config(model, adapter)
    _STATE[model] = state
    return state


def is_hf_native(model) -> bool:
    """Whether ``model`` is read by the HF-native backend (a ``transformers`` model); changes nothing."""
    try:
        return adapter_for(model).model_mode == "hf"
    except Exception:
        return False


def is_prepared(model) -> bool:
    """Whether :func:`prepare` has given ``model`` its entry points (``model.cfg``, ...)."""
    try:
        return model in _PREPARED
    except TypeError:
        return False


def config(model) -> HFConfig:
    """The TransformerLens-style config view of a ``transformers`` model (``model.cfg`` once
    prepared), without preparing it."""
    return sites(model).cfg


def _config(model, adapter) -> HFConfig:
    hf = adapter.config
    n_ctx = getattr(hf, "max_position_embeddings", None)
    return HFConfig(
        n_layers=adapter.n_layers,
        n_heads=adapter.n_heads,
        n_key_value_heads=adapter.n_kv_heads,
        d_head=adapter.d_head,
        d_model=adapter.d_model,
        d_vocab=int(hf.vocab_size),
        n_ctx=None if n_ctx is None else int(n_ctx),
        model_name=str(getattr(model, "name_or_path", "") or getattr(hf, "_name_or_path", "") or type(model).__name__),
        architecture=type(model).__name__,
        attention_dir="causal",
        _model=weakref.ref(model),
    )


def attach(model) -> None:
    """Give ``model`` (a ``PreTrainedModel``) the TransformerLens-style entry points (module
    docstring), through :func:`prepare` only. Idempotent; the class and the Hugging Face forward
    are left as they are."""
    if is_prepared(model):
        return
    state = sites(model)
    if "forward" in vars(model):  # an instance forward of someone else's (accelerate's device hooks): kept
        object.__setattr__(model, "_hf_forward", vars(model)["forward"])
    values = {
        "cfg": state.cfg,
        "forward": types.MethodType(_forward, model),
        "hook_dict": {name: name for name in sorted(state.names)},
        "run_with_cache": types.MethodType(cached_forward, model),
        "run_with_hooks": types.MethodType(run_with_hooks, model),
        "hooks": types.MethodType(hooks, model),
        "to_tokens": types.MethodType(to_tokens, model),
    }
    if getattr(model, "tokenizer", None) is None:
        values["tokenizer"] = None
    for key, value in values.items():
        object.__setattr__(model, key, value)
    _PREPARED.add(model)


def _forward(model, *args, **kwargs):
    """The instance ``forward``: the class's Hugging Face forward, unless a TransformerLens keyword
    (``return_type``, ``stop_at_layer``) asks for :func:`tl_forward`. Bound methods, so that a copy
    of the model calls its own forward."""
    if not any(k in kwargs for k in _TL_KEYWORDS):
        inner = vars(model).get("_hf_forward")
        return inner(*args, **kwargs) if inner is not None else type(model).forward(model, *args, **kwargs)
    return tl_forward(model, *args, **kwargs)


def set_tokenizer(model, tokenizer) -> None:
    """``model.tokenizer`` (read by ``to_tokens``, the corpora and the reports); by :func:`prepare`."""
    object.__setattr__(model, "tokenizer", tokenizer)


def _ensure_checked(model) -> None:
    state = sites(model)
    if not state.checked:
        state.check()


def _names_filter(names_filter) -> Callable[[str], bool] | None:
    if names_filter is None or callable(names_filter):
        return names_filter
    wanted = frozenset([names_filter] if isinstance(names_filter, str) else names_filter)
    return lambda name: name in wanted


@contextlib.contextmanager
def hooks(
    model,
    fwd_hooks: Iterable = (),
    bwd_hooks: Iterable = (),
    reset_hooks_end: bool = True,
    clear_contexts: bool = False,
) -> Iterator:
    """``model.hooks(fwd_hooks=[(name, fn), ...])``: the hooks are active inside the block and
    removed on any exit (TransformerLens' context manager; backward hooks are not supported)."""
    if list(bwd_hooks):
        raise NotImplementedError("the HF-native backend has no backward hooks")
    run = Run()
    for name, fn in fwd_hooks:
        run.hooks.setdefault(name, []).append(fn)
    with sites(model).active(run):
        yield model


def forward_logits(model, **kwargs) -> Tensor:
    """The Hugging Face forward with the family's eager attention and every active hook (an empty
    run when none is active); returns the logits, passed through ``unembed.hook_out``'s hooks."""
    state = sites(model)
    with state.active(Run()):
        logits = model(**kwargs).logits  # no TransformerLens keyword: the Hugging Face forward
        name = state.adapter.logits_hook
        return state.fire(name, logits) if state.wants(name) else logits


def _positions(attention_mask: Tensor) -> Tensor:
    """Each real token's index among its row's real tokens (0 on padding), as ``generate`` does."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)


def tl_forward(
    model,
    tokens: Tensor,
    *,
    return_type: str | None = "logits",
    attention_mask: Tensor | None = None,
    stop_at_layer: int | None = None,
    position_ids: Tensor | None = None,
) -> Tensor | None:
    """A TransformerLens-style forward: ``[batch, pos]`` token ids (or ``[batch, pos, d_model]``
    embeddings) → logits (``return_type="logits"``) or None (``return_type=None``, or a forward
    stopped before ``stop_at_layer``)."""
    from geolens.validation import check_attention_mask

    if return_type not in ("logits", None):
        raise ValueError(f"return_type must be 'logits' or None on the HF-native backend, got {return_type!r}")
    if not isinstance(tokens, Tensor):
        raise TypeError(
            "the HF-native backend takes token ids [batch, pos] (use model.to_tokens(text, prepend_bos=...))"
        )
    device = next(model.parameters()).device
    tokens = tokens.to(device)
    inputs = (
        {"inputs_embeds": tokens}
        if torch.is_floating_point(tokens)
        else {"input_ids": tokens if tokens.ndim == 2 else tokens[None]}
    )
    if attention_mask is not None:
        shape = tokens.shape[:2] if tokens.ndim >= 2 else (1, tokens.shape[0])
        mask = check_attention_mask(attention_mask, shape[0], shape[1]).to(device)
        inputs["attention_mask"] = mask.long()
        if position_ids is None:
            position_ids = _positions(mask)
    if position_ids is not None:
        inputs["position_ids"] = position_ids.to(device)
    run = Run()
    if stop_at_layer is not None:  # blocks 0 … stop − 1 run (negative: counted from the end)
        n_layers = sites(model).adapter.n_layers
        run.stop_at_layer = int(stop_at_layer) + n_layers if int(stop_at_layer) < 0 else int(stop_at_layer)
        return_type = None
    with sites(model).active(run):
        try:
            logits = forward_logits(model, **inputs)
        except StopForward:
            return None
    return logits if return_type == "logits" else None


def run_with_hooks(
    model,
    *args,
    fwd_hooks: Iterable = (),
    bwd_hooks: Iterable = (),
    reset_hooks_end: bool = True,
    clear_contexts: bool = False,
    **kwargs,
):
    """``model.run_with_hooks(tokens, fwd_hooks=[...], ...)``: :func:`tl_forward` with the hooks."""
    with hooks(model, fwd_hooks, bwd_hooks):
        return tl_forward(model, *args, **kwargs)


def cached_forward(
    model,
    tokens: Tensor,
    attention_mask: Tensor | None = None,
    names_filter: Callable[[str], bool] | Iterable[str] | str | None = None,
    *,
    stop_at_layer: int | None = None,
    return_type: str | None = "logits",
    position_ids: Tensor | None = None,
) -> tuple[Tensor | None, dict[str, Tensor]]:
    """``model.run_with_cache`` of a prepared model: :func:`tl_forward` with a cache of the hook
    names ``names_filter`` keeps (all without it), detached."""
    cache: dict[str, Tensor] = {}
    run = Run(cache=cache, names_filter=_names_filter(names_filter))
    with sites(model).active(run):
        logits = tl_forward(
            model,
            tokens,
            return_type=return_type,
            attention_mask=attention_mask,
            stop_at_layer=stop_at_layer,
            position_ids=position_ids,
        )
    return logits, cache


def prepare(model, tokenizer=None, *, check: bool = True):
    """Make a ``transformers`` causal LM ready for geolens and return it (the same object): the one
    place that attaches the TransformerLens-style entry points of the module docstring to the
    instance, ``tokenizer`` becomes ``model.tokenizer``, and (``check=True``) the attention reading
    is checked against the model's own forward now (:func:`geolens.hf.check.check_attention`)
    instead of at the first use.

    >>> from geolens.hf.tiny import tiny_family
    >>> model = prepare(tiny_family("qwen3"))
    >>> model.cfg.n_layers, model.cfg.d_head, type(model).__name__
    (2, 8, 'Qwen3ForCausalLM')
    """
    if adapter_for(model).model_mode != "hf":
        raise TypeError(f"geolens.hf.prepare takes a transformers PreTrainedModel, got {type(model).__name__}")
    attach(model)
    if tokenizer is not None:
        set_tokenizer(model, tokenizer)
    if check:
        _ensure_checked(model)
    return model


def run_with_cache(
    model,
    tokens: Tensor,
    attention_mask: Tensor | None = None,
    names_filter: Callable[[str], bool] | Iterable[str] | str | None = None,
) -> tuple[Tensor, Mapping[str, Tensor]]:
    """``(logits, cache)`` of one forward of any model geolens reads: a plain ``transformers``
    model (the HF-native backend: the cache is a dict keyed by TransformerLens hook names, filled
    by :mod:`geolens.hf.capture`) or a TransformerLens model (its own ``run_with_cache``).

    ``attention_mask`` (``[batch, pos]``, 1 = real token) runs a padded batch: on the HF-native
    backend positions are then counted over each row's real tokens, so every row equals its
    prompt run alone. Without it a batch that looks padded (rows starting or ending with
    different numbers of the tokenizer's pad id, as :func:`geolens.run_corpus` checks) is refused:
    its pad tokens would be read as real ones. ``names_filter`` keeps some hook names only
    (``geolens.names_filter(model)``: what geolens reads).

    The cache records which model made it (:func:`geolens.validation.stamp_cache`: a fingerprint
    of the weights, :func:`geolens.validation.weights_fingerprint`, and the dtype); the analyses
    that read ``(model, cache)`` refuse a cache made by another model of the same architecture
    (``ValueError``). A cache from TransformerLens' own ``model.run_with_cache`` carries no stamp:
    there a foreign cache of the same shapes cannot be detected.

    >>> import geolens, torch
    >>> from geolens.hf.tiny import tiny_family
    >>> model = tiny_family("gpt2")  # a random 2-layer GPT-2, built offline
    >>> tokens = torch.tensor([[0, 5, 9, 4, 7, 8]])
    >>> logits, cache = geolens.run_with_cache(model, tokens, names_filter=geolens.names_filter(model))
    >>> c = geolens.contribution_weights(model, cache, layer=1, mode="intra")
    >>> tuple(logits.shape), tuple(c.shape), bool(torch.allclose(c.sum(-1), torch.ones(1, 4, 6), atol=1e-5))
    ((1, 6, 64), (1, 4, 6, 6), True)
    """
    from geolens.validation import check_tokens, refuse_unmasked_padding, stamp_cache

    tokens = check_tokens(model, tokens)  # integer ids, not empty, inside the vocabulary (one line)
    if attention_mask is None and isinstance(tokens, Tensor):
        refuse_unmasked_padding(model, tokens)
    if adapter_for(model).model_mode == "hf":  # read as it is: nothing is attached to the model
        logits, cache = cached_forward(model, tokens, attention_mask, names_filter)
    else:
        kwargs = {} if attention_mask is None else {"attention_mask": attention_mask}
        logits, cache = model.run_with_cache(tokens, names_filter=names_filter, **kwargs)
    return logits, stamp_cache(model, cache)


def to_tokens(
    model,
    text,
    prepend_bos: bool = True,
    padding_side: str | None = None,
    move_to_device: bool = True,
    truncate: bool = False,
) -> Tensor:
    """Token ids ``[batch, pos]`` of ``text`` (a string or a list of them, right-padded with the
    pad token), with the BOS token first when ``prepend_bos``.

    A text longer than the model's context (``cfg.n_ctx``) raises ``ValueError`` giving its token
    count and the limit; ``truncate=True`` keeps the first ``n_ctx`` tokens of each text, as
    TransformerLens' ``to_tokens`` does by default (silently there), and says so in a
    ``UserWarning``."""
    tok = getattr(model, "tokenizer", None)
    if tok is None:
        raise ValueError("this model has no tokenizer: pass tokenizer= to geolens.hf.prepare, or token ids")
    texts = [text] if isinstance(text, str) else list(text)
    rows = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    if prepend_bos:
        if tok.bos_token_id is None:
            raise ValueError("prepend_bos=True but the tokenizer has no BOS token")
        rows = [[tok.bos_token_id] + r for r in rows]
    n_ctx = config(model).n_ctx
    longest = max(len(r) for r in rows)
    if n_ctx is not None and longest > int(n_ctx):
        if not truncate:
            raise ValueError(
                f"the text is {longest} tokens long{' (BOS included)' if prepend_bos else ''}, longer than the "
                f"model's context of {int(n_ctx)} tokens: shorten it, or pass truncate=True to keep its first "
                f"{int(n_ctx)} tokens"
            )
        import warnings

        warnings.warn(  # the words of geolens.validation.text_tokens
            f"the text is {longest} tokens long: truncated to the model's context, its first {int(n_ctx)} tokens",
            stacklevel=2,
        )
        rows = [r[: int(n_ctx)] for r in rows]
    width = max(len(r) for r in rows)
    pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    rows = [r + [pad] * (width - len(r)) if padding_side != "left" else [pad] * (width - len(r)) + r for r in rows]
    out = torch.tensor(rows, dtype=torch.long)
    return out.to(next(model.parameters()).device) if move_to_device else out
