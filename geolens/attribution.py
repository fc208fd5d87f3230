"""One call from a text to a labelled attribution: :func:`attribute` and its result :class:`Attribution`.

:func:`attribute` is a thin layer over the functional API, never beside it: it tokenises the text,
runs one forward with cache, and reads the scores of the prediction (or query) at ``position``
from :func:`geolens.contribution_flow`, :func:`geolens.attention_metrics`' metrics (through the
metric registry, :mod:`geolens.metrics`), :func:`geolens.value_zeroing` or the gradient
baselines of :mod:`geolens.flow.erasure`. Its scores equal theirs (tests/test_attribution.py).
The methods, their levels and citations are in the one registry, :func:`geolens.list_methods`.

The result carries the model's string tokens, the scores, and how they were made; it shows itself
in a notebook (``_repr_html_``: tokens coloured by score), plots (:meth:`Attribution.plot`), turns
into a table (:meth:`Attribution.to_dataframe`) and saves to a JSON file that loads back exactly
(:meth:`Attribution.save`, :meth:`Attribution.load`).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Sequence

import pandas as pd
import torch
from torch import Tensor

from geolens._version import __version__
from geolens.adapter import get_attention_layer, names_filter
from geolens.finite import check_finite
from geolens.flow import (
    contribution_flow,
    erase,
    flow_names_filter,
    gradient_x_input,
    integrated_gradients,
    space_token,
)
from geolens.flow.baselines import (
    check_position,
    check_target,
    continued_tokens,
    input_embeddings,
    prefix_mean_baseline,
    target_logprob,
)
from geolens.flow.ig_options import ig_settings
from geolens.hf import run_with_cache
from geolens.methods import Method, get_method
from geolens.metrics import LayerInputs, SequenceInputs, get_metric
from geolens.validation import check_head, check_layer, check_text, checked_text_tokens

FORMAT = "geolens.Attribution/1"
_VERSIONED = ("torch", "transformer-lens", "transformers")


def _versions() -> dict[str, str]:
    out = {"geolens": __version__}
    for name in _VERSIONED:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


@dataclass
class Attribution:
    """The scores one or several methods give the source tokens of one prediction (or query).

    Attributes:
        tokens: the model's string tokens of the whole text (BOS first when the model uses one).
        scores: ``[source]`` for one method, ``[method, source]`` for several; a score per
            token of the text, 0 after ``position`` (a causal model's future).
        method: the method's name, or a tuple of names (:func:`geolens.list_methods`).
        level: ``"model"`` (which input tokens the prediction at ``position`` comes from),
            ``"layer"`` (one layer's attention output at ``position``, summed over heads) or
            ``"head"`` (one head's).
        position: the query position (0-based, counted from BOS).
        prediction: the model's top-1 next token at ``position`` (its string), with its id and
            probability in ``prediction_id`` and ``prediction_prob``.
        layer: the layer that was read (None at model level).
        head: the head that was read (None at model and layer level).
        mode: the output o_i the contribution weights use: ``"inter"`` for a layer, ``"intra"``
            for a head (None at model level).
        model_name: the name of the model the scores come from.
        text: the text the scores come from.
        options: the method options that shaped the scores (e.g. ``ig_steps``).
        info: per-method diagnostics (e.g. integrated gradients' completeness gap).
        truncated_from: the text's token count when it was cut to the model's context
            (``truncate=True``), else None.
        versions: geolens, torch, TransformerLens and transformers versions.

    >>> import geolens, tempfile, os
    >>> from geolens.testing import tiny_bridge
    >>> att = geolens.attribute(tiny_bridge("gqa"), "the cat sat", "alti")
    >>> att.to_dataframe().shape  # BOS and 11 characters: one row per source token
    (12, 3)
    >>> path = att.save(os.path.join(tempfile.mkdtemp(), "att.json"))
    >>> bool((geolens.Attribution.load(path).scores == att.scores).all())
    True
    """

    tokens: list[str]
    token_ids: list[int]
    scores: Tensor
    method: str | tuple[str, ...]
    level: str
    position: int
    prediction: str
    prediction_id: int
    prediction_prob: float
    model_name: str
    text: str
    layer: int | None = None
    head: int | None = None
    mode: str | None = None
    options: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)
    truncated_from: int | None = None
    versions: dict = field(default_factory=_versions)
    target: str | None = None
    target_ids: list[int] | None = None
    target_logprob: float | None = None

    @property
    def methods(self) -> tuple[str, ...]:
        """The method names, always as a tuple."""
        return (self.method,) if isinstance(self.method, str) else tuple(self.method)

    def score_rows(self) -> Tensor:
        """The scores as ``[method, source]`` whatever the number of methods."""
        return self.scores[None] if self.scores.ndim == 1 else self.scores

    @property
    def labels(self) -> tuple[str, ...]:
        """How tables and plots name each method."""
        return tuple(get_method(m).label if _known(m) else m for m in self.methods)

    @property
    def signed(self) -> tuple[bool, ...]:
        """Whether each method's scores take both signs (from the registry; True if unknown)."""
        return tuple(get_method(m).signed if _known(m) else True for m in self.methods)

    @property
    def where(self) -> str:
        """One line: what the scores attribute (model, level, layer/head, position, prediction)."""
        q = f"position {self.position} {self.tokens[self.position]!r}"
        if self.level == "model":
            if self.target is not None:
                return (
                    f"{self.model_name}: log p({self.target!r} | text) = {self.target_logprob:.3f} after {q} "
                    f"(model predicts {self.prediction!r}, p = {self.prediction_prob:.3f})"
                )
            return f"{self.model_name}: the prediction at {q} → {self.prediction!r} (p = {self.prediction_prob:.3f})"
        unit = f"layer {self.layer}" + (f" head {self.head}" if self.head is not None else " (all heads)")
        return f"{self.model_name}: {unit}, attention output at {q} (model predicts {self.prediction!r})"

    def to_dataframe(self) -> pd.DataFrame:
        """One row per source token (positions 0 … ``position``): ``position``, ``token`` and one
        column of scores per method (named after the method)."""
        n = self.position + 1
        frame = pd.DataFrame({"position": range(n), "token": self.tokens[:n]})
        rows = self.score_rows()
        for name, row in zip(self.methods, rows):
            frame[name] = row[:n].detach().cpu().numpy()
        return frame

    def plot(self, *, figsize: tuple[float, float] | None = None):
        """A matplotlib Figure: one bar per source token (tokens on the axis, every one labelled),
        one panel per method side by side; positive scores blue, negative red."""
        from geolens.viz.attribution import attribution_figure

        return attribution_figure(self, figsize=figsize)

    def _repr_html_(self) -> str:
        from geolens.viz.attribution import attribution_html

        return attribution_html(self)

    def show(self):
        """Display in a notebook (HTML), or print the table elsewhere; returns self."""
        try:
            from IPython import get_ipython
            from IPython.display import HTML, display

            if get_ipython() is not None:
                display(HTML(self._repr_html_()))
                return self
        except ImportError:
            pass
        print(self.where)
        print(self.to_dataframe().to_string(index=False))
        return self

    def __repr__(self) -> str:
        return f"Attribution({', '.join(self.methods)}; {self.level} level; {self.where})"

    # ---- save / load: JSON, exact for float32 and float64 scores

    def to_dict(self) -> dict:
        values = self.scores.detach().cpu()
        return {
            "format": FORMAT,
            "tokens": list(self.tokens),
            "token_ids": [int(t) for t in self.token_ids],
            "scores": values.to(torch.float64).tolist(),  # float32 → float64 is exact
            "scores_dtype": str(values.dtype).removeprefix("torch."),
            "method": self.method if isinstance(self.method, str) else list(self.method),
            "level": self.level,
            "position": self.position,
            "prediction": self.prediction,
            "prediction_id": self.prediction_id,
            "prediction_prob": self.prediction_prob,
            "model_name": self.model_name,
            "text": self.text,
            "layer": self.layer,
            "head": self.head,
            "mode": self.mode,
            "options": self.options,
            "info": self.info,
            "truncated_from": self.truncated_from,
            "versions": self.versions,
            "target": self.target,
            "target_ids": self.target_ids,
            "target_logprob": self.target_logprob,
        }

    def save(self, path: str | Path) -> Path:
        """Write the attribution to a JSON file (scores, tokens, model name, text, method,
        versions); :meth:`load` reads it back exactly."""
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path) -> Attribution:
        """The attribution :meth:`save` wrote; a one-line ValueError for another file."""
        path = Path(path)
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: not a saved geolens Attribution ({type(e).__name__}: {e})") from None
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ValueError(f"{path}: not a saved geolens Attribution (format {FORMAT!r} expected)")
        scores = torch.tensor(d.pop("scores"), dtype=torch.float64).to(getattr(torch, d.pop("scores_dtype")))
        d.pop("format")
        method = d.pop("method")
        return cls(scores=scores, method=method if isinstance(method, str) else tuple(method), **d)


def _known(name: str) -> bool:
    try:
        get_method(name)
    except ValueError:
        return False
    return True


# ---------------------------------------------------------------------------------------------
# attribute()


def _resolve_model(model, backend: str):
    """``(model, name)``: :func:`geolens.models.resolve_model` (a name is loaded once and kept)."""
    from geolens.models import resolve_model

    return resolve_model(model, backend)


def _tokenize(model, text: str, truncate: bool) -> tuple[Tensor, int | None]:
    """The text's tokens (never cut silently: :func:`geolens.validation.checked_text_tokens`) and,
    when it was cut to the context on request, its full length. One text: several are refused
    (:func:`geolens.validation.check_text`, the message of every single-text entry point)."""
    check_text(text)
    tokens, n = checked_text_tokens(model, text, truncate=truncate)
    return tokens, (n if tokens.shape[-1] < n else None)


def _str_tokens(model, ids: Sequence[int]) -> list[str]:
    tok = model.tokenizer
    return [tok.decode([int(t)]) for t in ids]


def _check_levels(found: list[Method], layer, head) -> str:
    """The level of the attribution, or a one-line ValueError for a method that cannot give it."""
    if layer is None:
        if head is not None:
            raise ValueError("head= needs layer= (a head belongs to a layer)")
        wrong = [m.name for m in found if m.level != "model"]
        if wrong:
            raise ValueError(
                f"{', '.join(wrong)} score one layer's attention: pass layer= (and head=), "
                "or choose a model-level method (geolens.list_methods('model'))"
            )
        return "model"
    wrong = [m.name for m in found if m.level == "model"]
    if wrong:
        raise ValueError(f"{', '.join(wrong)} attribute the whole model: leave layer= and head= out")
    if head is not None:
        wrong = [m.name for m in found if m.level == "layer"]
        if wrong:
            raise ValueError(f"{', '.join(wrong)} score a whole layer, not one head: leave head= out")
        return "head"
    return "layer"


GAP_WARNING = 0.05
"""The relative completeness gap of integrated gradients above which :func:`attribute` warns."""

_OPTIONS = {
    "ig_steps",
    "ig_grid",
    "ig_batch",
    "ig_tolerance",
    "ig_max_steps",
    "baseline",
    "seed",
    "value_zeroing_chunk",
}


def attribute(
    model,
    text: str,
    method: str | Sequence[str] = "contribution_flow",
    *,
    layer: int | None = None,
    head: int | None = None,
    position: int = -1,
    mode: str | None = None,
    backend: str = "transformer_lens",
    truncate: bool = False,
    target: int | str | Sequence[int] | None = None,
    **options,
) -> Attribution:
    """Attribute one prediction (or one query's attention output) of ``text`` to its tokens.

    Without ``layer``, at model level: which input tokens the model's prediction at ``position``
    comes from (``contribution_flow``, ``alti``, ``attention_rollout``, ``value_zeroing_rollout``,
    ``grad_x_input``, ``integrated_gradients``). With ``layer=`` (and optionally ``head=``): that
    layer's (head's) attention metrics for the query at ``position`` (``raw_attention``,
    ``value_weighted``, ``output_normalized``, ``contribution``, ``contribution_abs``,
    ``value_zeroing`` and any metric added with :func:`geolens.register_metric`); a layer's score is
    the sum over its heads (then |·| for an absolute metric), as the faithfulness protocol's
    source ranking does. Every method: :func:`geolens.list_methods`.

    The scores equal the functional API's: row ``position`` of :func:`geolens.contribution_flow`,
    of :func:`geolens.attention_metrics` (mode ``"inter"`` for a layer, ``"intra"`` for a head,
    unless ``mode=``), of :func:`geolens.value_zeroing`, and the gradient baselines of
    :mod:`geolens.flow.erasure` for the model's top-1 next token.

    Args:
        model: a loaded model (TransformerBridge, HookedTransformer or transformers model) or any
            name :func:`geolens.load_model` accepts (loaded once, then reused by the next call).
        text: the text; BOS is prepended.
        method: a method name, or a list of names for several side by side (table and plot).
        layer: the layer whose attention is read; None for model level.
        head: the head of ``layer`` whose attention is read; None for the whole layer.
        position: the query position (default: the last token).
        mode: ``"intra"`` or ``"inter"``: the output o_i of the contribution weights.
        backend: how a model given by name is loaded (``"transformer_lens"`` or ``"hf"``).
        truncate: a text longer than the model's context is refused (one-line ValueError with the
            token count and the limit) unless True: then it is cut to the context, and the result
            says so (``truncated_from``).
        target: what the model-level gradient methods explain, instead of the top-1 prediction:
            a token id, a string (tokenised without BOS, so mind its leading space: ``" Paris"``),
            or a list of ids; a string or list of several tokens t_1 … t_k is a continuation,
            explained as log p(t_1 … t_k | text) = Σ_m log p(t_m | text, t_<m) (the gradients run
            on the text followed by t_1 … t_{k−1}; only the text's tokens are scored). The flows
            (``contribution_flow``, ``alti``, rollouts) score the residual stream at
            ``position``, which no target changes. The result records ``target``,
            ``target_ids`` and the clean ``target_logprob``. Model level only.
        **options: ``ig_grid``: integrated gradients' rule (:func:`geolens.flow.ig_options.ig_settings`), ``"local"`` (the default: the flow
            protocol's local grid, docs/flow/v3/PROTOCOL.md, refined until the relative
            completeness gap is within ``ig_tolerance``, default 0.01, from ``ig_steps``
            gradients, default 8, at most ``ig_max_steps``, default 96; with an explicit
            ``ig_tolerance`` the start is 32 and the cap 864, as the protocol's),
            ``"even"`` (``ig_steps`` midpoints, default 64) or ``"gauss_legendre"``
            (``ig_steps`` nodes, default 16; either refined only with ``ig_tolerance``);
            ``ig_batch`` (steps per backward, default 8), ``baseline`` (integrated gradients'
            baseline: ``"space"``, the default, every token after BOS up to ``position`` replaced
            by the tokenizer's ``" "``; ``"prefix_mean"``, the
            flow protocol's even baseline for both gradient methods, gradient × input becoming
            (x − x′)·∇f; or baseline token ids), ``seed`` (the ``random`` metric),
            ``value_zeroing_chunk``.

    >>> import geolens
    >>> from geolens.testing import tiny_bridge
    >>> model = tiny_bridge("gqa")
    >>> att = geolens.attribute(model, "the cat sat on the mat", method=["contribution_flow", "alti"])
    >>> att.scores.shape[0], att.level, round(float(att.scores[0].sum()), 4)  # a flow row sums to 1
    (2, 'model', 1.0)
    >>> head = geolens.attribute(model, "the cat sat on the mat", "contribution", layer=1, head=0)
    >>> list(head.to_dataframe().columns)
    ['position', 'token', 'contribution']
    >>> att = geolens.attribute(model, "the cat sat on the", "grad_x_input", target=" mat")  # 4 tokens
    >>> att.target, len(att.target_ids), att.target_logprob < 0
    (' mat', 4, True)
    """
    unknown = sorted(set(options) - _OPTIONS)
    if unknown:
        raise TypeError(f"attribute() got unexpected options {unknown}; known: {sorted(_OPTIONS)}")
    names = [method] if isinstance(method, str) else list(method)
    if not names or len(set(names)) != len(names):
        raise ValueError(f"method must name one or more distinct methods, got {method!r}")
    found = [get_method(m) for m in names]
    names = [m.name for m in found]  # a peer's name (input_x_gradient, ...) → the registry's
    if len(set(names)) != len(names):
        raise ValueError(f"method names the same method twice, got {method!r}")
    level = _check_levels(found, layer, head)
    if target is not None and level != "model":
        raise ValueError("target= is what the model-level methods explain: leave layer= and head= out")
    if mode is not None and mode not in ("intra", "inter"):
        raise ValueError(f"mode must be 'intra' or 'inter', got {mode!r}")
    model, model_name = _resolve_model(model, backend)
    if layer is not None:  # the functional API's checks: TypeError, IndexError out of range
        layer = check_layer(layer, model.cfg.n_layers)
    if head is not None:
        head = check_head(head, model.cfg.n_heads)
    tokens, truncated_from = _tokenize(model, text, truncate)
    device = next(model.parameters()).device
    tokens = tokens.to(device)
    n = int(tokens.shape[-1])
    position = check_position(position, n)
    if level != "model" and mode is None:
        mode = "intra" if level == "head" else "inter"

    want_flow = level == "model" and any(m.family == "flow" for m in found)
    filters = [flow_names_filter(model)] if want_flow else []
    if level != "model":
        filters.append(names_filter(model, layers=[layer]))
    with torch.no_grad():
        logits, cache = run_with_cache(model, tokens, names_filter=lambda name: any(f(name) for f in filters))
    probs = torch.softmax(logits[0, position].to(torch.float64), dim=-1)
    prediction_id = int(probs.argmax())
    target_ids = None if target is None else _target_ids(model, target)
    explained = prediction_id if target_ids is None else check_target(target_ids)

    used: dict[str, Any] = {}
    info: dict[str, Any] = {}
    rows = []
    for m in found:
        if m.family == "flow":
            row = contribution_flow(model, cache, m.key, tokens=tokens)[0, position]
        elif m.family == "gradient":
            row = _gradient(model, tokens[0], position, m, explained, options, used, info)
        else:
            row = _metric_row(model, cache, tokens, m, layer, head, position, mode, options, used)
        rows.append(check_finite(row.detach().cpu(), what=f"the scores of {m.name}", dims=("position",), model=model))
    if len(rows) == 1:
        scores = rows[0]
    else:
        dtype = torch.promote_types(*{r.dtype for r in rows}) if len({r.dtype for r in rows}) > 1 else rows[0].dtype
        scores = torch.stack([r.to(dtype) for r in rows])
    ids = tokens[0].tolist()
    return Attribution(
        tokens=_str_tokens(model, ids),
        token_ids=ids,
        scores=scores,
        method=names[0] if isinstance(method, str) else tuple(names),
        level=level,
        position=position,
        prediction=model.tokenizer.decode([prediction_id]),
        prediction_id=prediction_id,
        prediction_prob=float(probs[prediction_id]),
        model_name=model_name,
        text=text,
        layer=layer,
        head=head,
        mode=mode,
        options=used,
        info=info,
        truncated_from=truncated_from,
        target=None
        if target_ids is None
        else target
        if isinstance(target, str)
        else model.tokenizer.decode(target_ids),
        target_ids=target_ids,
        target_logprob=None if target_ids is None else _target_logprob(model, tokens[0], position, target_ids, logits),
    )


def _target_ids(model, target) -> list[int]:
    """The token ids of ``target=``: an id, a list of ids, or a string tokenised without BOS."""
    if isinstance(target, str):  # the tokenizer's ids: inside the vocabulary
        if not target:
            raise ValueError("target must be a non-empty string, a token id or a list of token ids, got ''")
        ids = model.to_tokens(target, prepend_bos=False)[0].tolist()
        if not ids:
            raise ValueError(f"target {target!r} has no token")
        return [int(t) for t in ids]
    ids = check_target(target, int(model.cfg.d_vocab))
    return [ids] if isinstance(ids, int) else [int(t) for t in ids]


def _target_logprob(model, tokens: Tensor, position: int, ids: list[int], logits: Tensor) -> float:
    """log p(t_1 … t_k | text up to ``position``) = Σ_m log p(t_m | …, t_<m), float64 (clean model):
    :func:`geolens.flow.baselines.target_logprob`, the f the gradient methods explain; one token
    reads the logits already computed, a continuation runs the text followed by t_1 … t_{k−1}."""
    target = check_target(ids)
    if isinstance(target, int):
        scored = logits[:, : position + 1]
    else:
        with torch.no_grad():
            scored = model(continued_tokens(tokens, position, target)[None], return_type="logits")
    return float(target_logprob(scored, target)[0])


def _gradient(model, tokens: Tensor, position: int, m: Method, target, options, used, info) -> Tensor:
    baseline = options.get("baseline")
    xb = None  # x′ of both gradient methods with baseline="prefix_mean" (docs/flow/v2/PROTOCOL.md)
    if isinstance(baseline, str):
        if baseline not in ("space", "prefix_mean"):
            raise ValueError(f"baseline must be 'space', 'prefix_mean' or token ids, got {baseline!r}")
        if baseline == "prefix_mean":
            if position < 2:
                raise ValueError("baseline='prefix_mean' needs a token between BOS and the position (position ≥ 2)")
            xb = prefix_mean_baseline(input_embeddings(model, tokens[: position + 1]), range(1, position))
            used["baseline"] = "prefix_mean"
        else:
            baseline = None
    if m.key == "grad_x_input":
        return gradient_x_input(model, tokens, position, target=target, baseline_embeddings=xb)
    settings = ig_settings(options)  # the rule, its start, tolerance and cap (geolens.flow.baselines)
    used.update({k: settings[k] for k in ("ig_grid", "ig_tolerance", "ig_max_steps") if k in settings})
    if xb is None and baseline is None:
        erased = torch.zeros(tokens.shape[0], dtype=torch.bool)
        erased[1 : position + 1] = True
        baseline = erase(tokens, erased.to(tokens.device), space_token(model))
        used["baseline"] = "space"
    elif xb is None:
        baseline = torch.as_tensor(baseline).to(tokens.device)
        if baseline.ndim == 2 and baseline.shape[0] == 1:
            baseline = baseline[0]
        used["baseline"] = [int(t) for t in baseline.tolist()]
    used["ig_steps"], used["ig_batch"] = settings["ig_steps"], settings["ig_batch"]
    ig = integrated_gradients(
        model,
        tokens,
        None if xb is not None else baseline,
        position,
        target=target,
        baseline_embeddings=xb,
        **settings["kwargs"],
    )
    info["integrated_gradients"] = {
        "f_input": ig.f_input,
        "f_baseline": ig.f_baseline,
        "completeness_gap": ig.completeness_gap,
        "relative_gap": ig.rel_gap,  # geolens.flow.relative_gap's rule
        "n_steps": ig.n_steps,
        "n_forward": ig.n_forward,
    }
    if ig.rel_gap > GAP_WARNING:
        warnings.warn(
            f"integrated gradients: the scores sum to {float(ig.attributions.sum()):.4g} where f(x) − f(x′) = "
            f"{ig.f_input - ig.f_baseline:.4g} (relative gap {ig.rel_gap:.1%} > {GAP_WARNING:.0%}, after {ig.n_steps} "
            "gradients): raise ig_max_steps (the default grid refines until ig_tolerance=0.01 or that cap)",
            stacklevel=3,
        )
    return ig.attributions


def _metric_row(model, cache, tokens, m: Method, layer, head, position, mode, options, used) -> Tensor:
    metric = get_metric(m.key)
    if metric.per_layer:
        inputs = LayerInputs.from_layer(get_attention_layer(model, cache, layer), mode)
        x = metric.layer_scores(inputs, summed=head is None)  # [batch, head or 1, query, key]
        return x[0, 0 if head is None else head, position]
    seed = int(options.get("seed", 0))
    if m.key == "random":
        used["seed"] = seed
    chunk = options.get("value_zeroing_chunk")
    inputs = SequenceInputs(model, tokens, (layer,), model.cfg.n_heads, seed, chunk)
    x = metric.scores(inputs)[0, 0]  # [head or 1, query, key], checked (shape, finite)
    if head is not None:
        return x[head, position]
    summed = x.sum(0) if x.shape[0] > 1 else x[0]
    return (summed.abs() if metric.absolute else summed)[position]
