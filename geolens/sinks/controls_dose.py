"""The measurement of the dose-matched sink controls (docs/faithfulness/PROTOCOL.md §6).

:func:`dose_controls` runs the edits of a :class:`~geolens.sinks.controls_protocol.DoseProtocol`
(:mod:`geolens.sinks.controls_protocol` says what they are) on the sample of :func:`controls_sample`,
in the scopes of the sink heads that :func:`gu_sink_heads` finds, window by window
(:func:`dose_window`), resumable from a checkpoint, and summarises them with
:func:`geolens.sinks.controls_summary.dose_summary`.

**Cost:** per window one clean forward and 2 × (4 + 35) = 78 edited forwards of 64 tokens (4 norm
edits, 5 + 20 + 5 + 5 rotations, two scopes), run as rows of batched forwards branched at the first
edited layer (:func:`geolens.interventions.masking.branch_hook`; that layer is 0, so only the
embedding is shared), about 79 × 64 × (parameters, unembedding included) multiply-adds: some
0.7 T for SmolLM2-135M and 1.4 T for Gemma 3 270M (its 262 144-token unembedding), that is about
25 s and 50 s per window at the 28 G multiply-adds per second of PROTOCOL.md §8 (an estimate from
the count, not a timing), or 40 and 80 minutes for the 100 windows. Smoke timing on
a tiny random model (7 layers, d_model 32, vocabulary 64, one torch thread on the shared 2-core
machine under load): about 0.6 s per window, nearly all of it the forwards' fixed overhead, so
it says nothing about the real models; their cost is the count above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from geolens.adapter import adapter_for, model_mode
from geolens.checkpoint import check_writer, model_fingerprint, plain_json, tokens_fingerprint, writer_record
from geolens.data import bos_token_id
from geolens.interventions.base import applied
from geolens.interventions.masking import branch_hook
from geolens.interventions.sink_values import SinkEditSpec, sink_edit_query_heads
from geolens.resume import AGAIN, ResumeRefused, read_records, refuse, write_records
from geolens.sinks.controls_protocol import SINK_HEAD_SHARE, WINDOW_COLUMNS, DoseProtocol, edit_dose
from geolens.sinks.controls_summary import dose_summary
from geolens.sinks.geometry import GU_EPSILON
from geolens.validation import check_context

CHECKPOINT_FORMAT = "geolens sink dose controls checkpoint 1"


def controls_sample(
    model, docs: Sequence[str], *, seq_len: int = 64, n_documents: int = 50, per_document: int = 2
) -> tuple[torch.Tensor, np.ndarray]:
    """The sample of the dose-matched controls: ``per_document`` consecutive windows from each of the
    first ``n_documents`` long-enough documents.

    Each document is tokenised by the model's tokenizer without special tokens, t_0, t_1, …; it is
    eligible when it has at least ``per_document`` × (``seq_len`` − 1) tokens (126 for two windows
    of 64). The first ``n_documents`` eligible documents, in corpus order, give the windows
    [BOS] + t_{k(T−1)} … t_{(k+1)(T−1)−1} for k = 0 … ``per_document`` − 1, T = ``seq_len`` (the
    first windows :func:`geolens.data.token_windows` cuts from the document). Returns the windows
    ``[n_documents · per_document, seq_len]`` and each window's document (its index in ``docs``).
    Too few eligible documents is a ``ValueError`` saying how many there are.

    >>> from geolens.testing import tiny_bridge
    >>> tokens, documents = controls_sample(tiny_bridge("gqa"), ["a b c d e f g h", "no", "0123456789"], seq_len=4, n_documents=2)
    >>> tokens.shape, documents.tolist()
    (torch.Size([4, 4]), [0, 0, 2, 2])
    """
    body = int(seq_len) - 1
    if body < 1 or n_documents < 1 or per_document < 1:
        raise ValueError(
            f"need seq_len ≥ 2, n_documents ≥ 1 and per_document ≥ 1, got {seq_len}, {n_documents}, {per_document}"
        )
    check_context(model, int(seq_len), name=f"seq_len {seq_len}: a window")
    bos = bos_token_id(model)
    rows, documents, eligible = [], [], 0
    for d, doc in enumerate(docs):
        ids = model.tokenizer(doc, add_special_tokens=False)["input_ids"]
        if len(ids) < per_document * body:
            continue
        eligible += 1
        rows += [[bos] + ids[k * body : (k + 1) * body] for k in range(per_document)]
        documents += [d] * per_document
        if eligible == n_documents:
            break
    if eligible < n_documents:
        raise ValueError(
            f"only {eligible} of {len(docs)} documents have at least {per_document * body} tokens; {n_documents} are needed"
        )
    return torch.tensor(rows, dtype=torch.long), np.asarray(documents, dtype=np.int64)


def gu_sink_heads(
    model,
    tokens: torch.Tensor,
    layers: Sequence[int],
    *,
    eps: float = GU_EPSILON,
    share: float = SINK_HEAD_SHARE,
    batch_size: int = 8,
) -> pd.DataFrame:
    """Which query heads of ``layers`` are sink heads on ``tokens`` (the ``sink_heads`` scope of :mod:`geolens.sinks.controls_protocol`).

    One row per (layer, head): ``kv_head``, ``gu_sink_share`` (the share of windows where the head's
    mean attention on the first token, query 0 included, exceeds ``eps``;
    :func:`geolens.sinks.geometry.sink_geometry`) and ``sink_head`` (``gu_sink_share > share``).

    >>> from geolens.testing import tiny_bridge, tiny_tokens
    >>> model = tiny_bridge("gqa")
    >>> list(gu_sink_heads(model, tiny_tokens(model, length=8), [1]).columns)
    ['layer', 'head', 'kv_head', 'gu_sink_share', 'sink_head']
    """
    from geolens.sinks.geometry import sink_geometry

    heads = sink_geometry(model, tokens, batch_size=batch_size, eps=eps, layers=list(layers)).heads
    out = heads[["layer", "head", "kv_head", "gu_sink_share"]].copy()
    out["sink_head"] = out["gu_sink_share"] > share
    return out.reset_index(drop=True)


def _head_map(table: pd.DataFrame) -> dict[int, tuple[int, ...]]:
    """``{layer: sink heads}`` from a :func:`gu_sink_heads` table (every layer, possibly empty)."""
    return {int(l): tuple(int(h) for h in g.loc[g.sink_head, "head"]) for l, g in table.groupby("layer")}


@dataclass
class DoseWindow:
    """One window's outcomes under the edits of :func:`dose_window` (float64)."""

    nll_clean: float  # mean next-token NLL of the clean forward
    nll: np.ndarray  # [edit]: mean NLL of each edited forward
    kl: np.ndarray  # [edit]: mean over predictions of KL(p_clean ‖ p_edited)

    @property
    def delta_ppl(self) -> np.ndarray:
        return np.exp(self.nll) - math.exp(self.nll_clean)


def clean_log_probs(model, window: torch.Tensor) -> torch.Tensor:
    """log p(· | t_≤i) of the clean forward, float64 ``[pos − 1, d_vocab]`` (``window`` ``[1, pos]``)."""
    if window.ndim != 2 or window.shape[0] != 1 or window.shape[1] < 2:
        raise ValueError(f"window must be one sequence [1, pos] with pos ≥ 2, got shape {tuple(window.shape)}")
    with torch.no_grad():
        logits = model(window, return_type="logits")
    return torch.log_softmax(logits[0, :-1].to(torch.float64), dim=-1)


def default_rows_per_forward(model, seq_len: int) -> int:
    """Rows of one batched forward: float32 logits of at most 2^26 numbers (256 MiB), at most 16 rows."""
    return max(1, min(16, 2**26 // (int(seq_len) * int(model.cfg.d_vocab))))


def dose_window(
    model,
    window: torch.Tensor,
    specs: Sequence[SinkEditSpec],
    layers: Sequence[int],
    *,
    heads=None,
    rows_per_forward: int | None = None,
    clean: torch.Tensor | None = None,
) -> DoseWindow:
    """One window ``[1, pos]`` under every edit of ``specs`` at ``layers``, for the query ``heads``
    (``None``: all; else ``{layer: heads}``, :func:`geolens.interventions.sink_values.sink_edit_query_heads`).

    The edits run as rows of batched forwards, ``rows_per_forward`` at a time (default
    :func:`default_rows_per_forward`), branched at the first edited layer
    (:func:`geolens.interventions.masking.branch_hook`). ``clean``: the window's
    :func:`clean_log_probs`, when already computed. NLL and KL are computed in float64 over all
    ``pos − 1`` predictions, one row at a time.
    """
    specs = list(specs)
    if not specs:
        raise ValueError("no edit to run")
    ref = clean_log_probs(model, window) if clean is None else clean
    if ref.shape[0] != window.shape[1] - 1:
        raise ValueError(
            f"clean log-probabilities for {ref.shape[0]} predictions, the window has {window.shape[1] - 1}"
        )
    target = window[0, 1:, None].to(ref.device)
    p_ref = ref.exp()
    n = int(rows_per_forward or default_rows_per_forward(model, window.shape[1]))
    if n < 1:
        raise ValueError(f"rows_per_forward must be ≥ 1, got {rows_per_forward}")
    nll, kl = [], []
    for start in range(0, len(specs), n):
        chunk = specs[start : start + n]
        edit = sink_edit_query_heads(model, chunk, layers=layers, heads=heads)
        if not edit.layers:
            raise ValueError("the edit selects no head at any layer: nothing to edit")
        hooks = [branch_hook(model, edit.layers[0], len(chunk))] + list(edit.fwd_hooks)
        with torch.no_grad(), applied(model, hooks):
            logits = model(window, return_type="logits")
        for r in range(len(chunk)):
            lp = torch.log_softmax(logits[r, :-1].to(torch.float64), dim=-1)
            nll.append(float(-lp.gather(-1, target).mean()))
            kl.append(float((p_ref * (ref - lp)).sum(-1).mean()))
            del lp
        del logits
    return DoseWindow(float(-ref.gather(-1, target).mean()), np.asarray(nll), np.asarray(kl))


@dataclass
class DoseControlsResult:
    """:func:`dose_controls`' result: the per-window table, the sink heads and the summary.

    - ``windows``: one row per (window, scope, edit, seed) with the columns of
      :data:`~geolens.sinks.controls_protocol.WINDOW_COLUMNS` (``lam`` for norm edits, ``degrees`` and ``seed`` for rotations);
    - ``sink_heads``: :func:`gu_sink_heads`' table at the edited layers;
    - ``statistics``: :func:`~geolens.sinks.controls_summary.dose_summary` of ``windows``.
    """

    windows: pd.DataFrame
    sink_heads: pd.DataFrame
    statistics: dict
    protocol: DoseProtocol
    layers: list
    model_mode: str
    verdicts: bool

    @property
    def dose_response(self) -> pd.DataFrame:
        return pd.DataFrame(self.statistics["dose_response"])

    @property
    def pairs(self) -> pd.DataFrame:
        return pd.DataFrame(self.statistics["pairs"] + self.statistics["exploratory_pairs"])

    def summary(self) -> dict:
        clean = self.windows.drop_duplicates("window")
        return {
            "experiment": "dose-matched sink controls (docs/faithfulness/PROTOCOL.md section 6)",
            "model_mode": self.model_mode,
            "layers": [int(l) for l in self.layers],
            "scopes": list(self.protocol.scopes),
            "settings": self.protocol.to_dict(),
            "sink_head_criterion": f"Gu et al. (2024) sink head (mean attention on the first token > {GU_EPSILON:g}) in more than "
            f"{SINK_HEAD_SHARE:g} of the windows, at each edited layer",
            "sink_heads": {str(l): list(h) for l, h in _head_map(self.sink_heads).items()},
            "query_heads_edited": "per query head through hook_z: z_i^h + alpha_i0^h (v_0' - v_0); a kv head's other query heads untouched",
            "clean_ppl": float(np.exp(clean.nll_clean).mean()),
            "verdicts": self.verdicts,
            **self.statistics,
        }


CheckpointMismatch = ResumeRefused  # a checkpoint of another run, damaged or edited: geolens.resume's refusal


def dose_controls(
    model,
    tokens: torch.Tensor,
    documents,
    protocol: DoseProtocol = DoseProtocol(),
    *,
    sink_heads: Mapping[int, Sequence[int]] | None = None,
    checkpoint=None,
    resume: bool = False,
    rows_per_forward: int | None = None,
    verdicts: bool = True,
    batch_size: int = 8,
    progress: bool = False,
) -> DoseControlsResult:
    """The dose-matched sink controls (:mod:`geolens.sinks.controls_protocol`) on ``tokens`` ``[window, pos]`` (BOS first,
    unpadded; :func:`controls_sample`), ``documents[w]`` the source document of window w.

    ``sink_heads``: ``{layer: query heads}`` of the ``sink_heads`` scope (default: found by
    :func:`gu_sink_heads` on ``tokens``). ``checkpoint``: a JSON file rewritten atomically
    (:func:`geolens.checkpoint.atomic_write_bytes`) after every window; ``resume=True`` continues
    from it (refused, naming the difference, if it was made with another model, sample,
    protocol, sink heads or batching). ``verdicts=False`` for an exploratory run.
    """
    if tokens.ndim != 2 or tokens.shape[1] < 3:
        raise ValueError(f"tokens must be [window, pos] with pos ≥ 3, got shape {tuple(tokens.shape)}")
    documents = np.asarray(documents)
    if documents.shape != (tokens.shape[0],):
        raise ValueError(
            f"documents must name one document per window: {documents.shape} for {tokens.shape[0]} windows"
        )
    L = int(model.cfg.n_layers)
    layers = protocol.layers(L)
    if sink_heads is None:
        heads_table = gu_sink_heads(model, tokens, layers, batch_size=batch_size)
    else:
        extra = sorted(int(l) for l in sink_heads if int(l) not in layers)
        if extra:
            raise ValueError(f"sink_heads names layers {extra} that are not edited (layers {layers})")
        rows = [
            dict(
                layer=l,
                head=h,
                kv_head=adapter_for(model).kv_head_of(h),
                gu_sink_share=float("nan"),
                sink_head=h in {int(x) for x in sink_heads.get(l, ())},
            )
            for l in layers
            for h in range(model.cfg.n_heads)
        ]
        heads_table = pd.DataFrame(rows)
    head_map = _head_map(heads_table)
    not_testable = {}
    if "sink_heads" in protocol.scopes and not any(head_map.values()):
        not_testable["sink_heads"] = f"no sink head at the edited layers {layers}: the edit would leave the model clean"
    scope_heads = {"all_heads": None, "sink_heads": head_map}
    live = [s for s in protocol.scopes if s not in not_testable]
    specs = protocol.edits()
    n_rows = int(rows_per_forward or default_rows_per_forward(model, tokens.shape[1]))
    fingerprint = plain_json(
        {
            "model": model_fingerprint(model),
            "tokens": tokens_fingerprint(tokens),
            "documents": documents.tolist(),
            "protocol": protocol.to_dict(),
            "layers": layers,
            "sink_heads": {str(l): list(h) for l, h in head_map.items()},
            "rows_per_forward": n_rows,
            "edits": [s.label for s in specs],
        }
    )
    done: dict = {}
    path = Path(checkpoint) if checkpoint is not None else None
    writer = writer_record(model)  # the weights fingerprint and the geolens version
    if path is not None and resume and path.is_file():
        state = read_records(path, ("windows",))  # refused when unreadable or a record was edited
        if state.get("format") != CHECKPOINT_FORMAT:
            raise refuse(path, "not a checkpoint of the dose-matched sink controls")
        saved = state.get("fingerprint") if isinstance(state.get("fingerprint"), dict) else {}
        other = [k for k in fingerprint if saved.get(k) != fingerprint[k]]
        if other:
            raise refuse(path, f"it was made with another {', '.join(other)}")
        done = state["windows"]
        bad = sorted(set(done) - {str(w) for w in range(tokens.shape[0])})
        if bad:
            raise refuse(path, f"it holds windows {', '.join(bad[:5])} that this sample does not have")
        writer = check_writer(path, state.get("writer"), model, again=AGAIN)  # other weights: refused
    todo = [w for w in range(tokens.shape[0]) if str(w) not in done]
    it = todo
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(
            todo,
            desc=f"sink dose controls: {len(live)} scopes × {len(specs)} edits",
            initial=len(done),
            total=tokens.shape[0],
        )
    for w in it:
        window = tokens[w : w + 1]
        ref = clean_log_probs(model, window)
        entry = {}
        for scope in live:
            res = dose_window(
                model, window, specs, layers, heads=scope_heads[scope], rows_per_forward=n_rows, clean=ref
            )
            entry["nll_clean"] = res.nll_clean
            entry[scope] = {"nll": res.nll.tolist(), "kl": res.kl.tolist()}
        del ref
        done[str(w)] = entry
        if path is not None:
            header = {"format": CHECKPOINT_FORMAT, "fingerprint": fingerprint, "writer": writer}
            write_records(path, header, {"windows": done})
    rows = []
    for w in range(tokens.shape[0]):
        entry = done[str(w)]
        for scope in live:
            for s, spec in enumerate(specs):
                nll, nll_clean = float(entry[scope]["nll"][s]), float(entry["nll_clean"])
                rot = spec.kind == "rotate"
                rows.append(
                    dict(
                        window=w,
                        document=documents[w].item(),
                        scope=scope,
                        edit=spec.kind,
                        lam=np.nan if rot else spec.lam,
                        degrees=spec.degrees if rot else np.nan,
                        seed=spec.seed if rot else pd.NA,
                        dose=edit_dose(spec),
                        nll_clean=nll_clean,
                        nll=nll,
                        delta_ppl=math.exp(nll) - math.exp(nll_clean),
                        kl=float(entry[scope]["kl"][s]),
                    )
                )
    table = pd.DataFrame(rows, columns=list(WINDOW_COLUMNS))
    table["seed"] = table["seed"].astype("Int64")
    stats = dose_summary(table, protocol, verdicts=verdicts, not_testable=not_testable)
    return DoseControlsResult(table, heads_table, stats, protocol, layers, model_mode(model), bool(verdicts))


def read_windows(path) -> pd.DataFrame:
    """A saved ``controls_windows.csv`` of :func:`dose_controls`, with every float as written
    (``float_precision="round_trip"``), so that :func:`~geolens.sinks.controls_summary.dose_summary` recomputes the summary exactly."""
    table = pd.read_csv(path, float_precision="round_trip")
    table["seed"] = table["seed"].astype("Int64")
    return table


def write_windows(table: pd.DataFrame, path) -> None:
    """Write the per-window table with 17 significant digits (every float64 round-trips)."""
    table.to_csv(path, index=False, float_format="%.17g")


__all__ = [
    "CHECKPOINT_FORMAT",
    "CheckpointMismatch",
    "DoseControlsResult",
    "DoseWindow",
    "clean_log_probs",
    "controls_sample",
    "default_rows_per_forward",
    "dose_controls",
    "dose_window",
    "gu_sink_heads",
    "read_windows",
    "write_windows",
]
