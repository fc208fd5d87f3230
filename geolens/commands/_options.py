"""Shared options and validators of the ``geolens`` commands.

Every user error of a command is a :class:`geolens.errors.UsageError`: :func:`geolens.cli.main`
prints it as one line ``geolens <command>: error: <message>`` on stderr and returns 2, without a
traceback. Commands validate everything that does not need the model *before* loading it
(numbers through the argparse ``type=`` functions below, model names, corpora, output folders,
sections), and everything that does (layer indices, the corpus's window count) right after
loading it, before any corpus work. Layer indices are checked, never wrapped: ``-1`` is the last layer, ``99`` of a
ten-layer model is an error.
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
from pathlib import Path
from typing import Callable, Sequence

from geolens.commands._names import SHIPPED_MODELS, TINY_MODELS
from geolens.errors import UsageError


def did_you_mean(word: str, choices) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices`` to a misspelt ``word``, else ``""``.

    >>> did_you_mean("reprot", ["report", "sinks"])
    " (did you mean 'report'?)"
    """
    import difflib

    close = difflib.get_close_matches(word, [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


_INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)$")


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser whose errors are :class:`UsageError` (one line, no usage dump), with a
    "did you mean" for a misspelt command or choice."""

    def error(self, message: str):  # noqa: D102 - argparse API
        match = _INVALID_CHOICE.search(message)
        if match:
            choices = [c.strip().strip("'") for c in match.group(2).split(",")]
            message += did_you_mean(match.group(1), choices)
        raise UsageError(message, prog=self.prog)


# --- numbers (argparse ``type=`` functions: the message names the option) -------------------------


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def int_at_least(minimum: int) -> Callable[[str], int]:
    """argparse type: an integer ≥ ``minimum``."""

    def parse(text: str) -> int:
        value = _int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    parse.__name__ = f"int_at_least_{minimum}"
    return parse


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)
seq_len_int = int_at_least(2)  # BOS and one token


def float_in(low: float, high: float, *, low_open: bool = False, high_open: bool = False) -> Callable[[str], float]:
    """argparse type: a finite number in the interval [low, high] (ends open on request)."""

    def parse(text: str) -> float:
        value = _float(text)
        if value < low or value > high or (low_open and value == low) or (high_open and value == high):
            interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
            raise argparse.ArgumentTypeError(f"must be in {interval}, got {text}")
        return value

    return parse


def float_list(
    low: float | None = None, high: float | None = None, *, low_open: bool = False
) -> Callable[[str], list[float]]:
    """argparse type: comma-separated finite numbers, each in [low, high] (``(low`` on request)."""

    def parse(text: str) -> list[float]:
        parts = [p.strip() for p in text.split(",") if p.strip()]
        if not parts:
            raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}")
        values = []
        for part in parts:
            value = _float(part)
            if (low is not None and (value < low or (low_open and value == low))) or (
                high is not None and value > high
            ):
                interval = f"{'(' if low_open else '['}{low:g}, {high:g}]" if high is not None else f"≥ {low:g}"
                raise argparse.ArgumentTypeError(f"every value must be in {interval}, got {part}")
            values.append(value)
        return values

    return parse


def int_list(minimum: int | None = None) -> Callable[[str], list[int]]:
    """argparse type: comma-separated integers (each ≥ ``minimum`` when given)."""

    def parse(text: str) -> list[int]:
        parts = [p.strip() for p in text.split(",") if p.strip()]
        if not parts:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
        values = [_int(p) for p in parts]
        bad = [v for v in values if minimum is not None and v < minimum]
        if bad:
            raise argparse.ArgumentTypeError(f"every value must be at least {minimum}, got {bad[0]}")
        return values

    return parse


# --- layer and head indices (checked against the model, never wrapped) ----------------------------

_LAYER_ITEM = re.compile(r"^(-?\d+)(?:-(-?\d+))?$")


def layer_spec(text: str) -> str:
    """argparse type: ``all``, a third of the stack (``early``, ``middle``, ``late``) or
    comma-separated layers / ranges (``28,29``, ``20-29``, ``-2,-1``).

    Only the syntax is checked here; :func:`resolve_layers` checks the range once the model is known.
    """
    if text.strip() not in ("all", "early", "middle", "late"):
        for part in text.split(","):
            if not _LAYER_ITEM.match(part.strip()):
                raise argparse.ArgumentTypeError(
                    f"expected 'all', early/middle/late or layers like '3', '-1', '2,5', '20-29', got {text!r}"
                )
    return text.strip()


def check_index(value: int, count: int, what: str, option: str) -> int:
    """``value`` as an index in ``[0, count)``; negative values count from the end; else UsageError
    (out of range: the message of Python's IndexError, :func:`geolens.validation.out_of_range`,
    with the option for the argument; called once the model is loaded, so torch is there)."""
    from geolens.validation import out_of_range

    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"{option} must be an integer, got {value!r}")
    if not -count <= value < count:
        raise UsageError(out_of_range(f"{option} {value}", count, what))
    return value % count


def resolve_layers(text: str, n_layers: int, option: str = "--layers") -> tuple[int, ...] | None:
    """Layers of a :func:`layer_spec` for a model of ``n_layers`` (``None`` for ``all``), sorted."""
    if text == "all":
        return None
    out: set[int] = set()
    for part in text.split(","):
        match = _LAYER_ITEM.match(part.strip())
        if not match:
            raise UsageError(f"{option}: expected 'all' or layers like '3', '-1', '2,5', '20-29', got {text!r}")
        first = check_index(int(match.group(1)), n_layers, "layers", option)
        last = check_index(int(match.group(2)), n_layers, "layers", option) if match.group(2) is not None else first
        if last < first:
            raise UsageError(f"{option}: the range {part.strip()!r} is empty (layers {first} to {last})")
        out.update(range(first, last + 1))
    return tuple(sorted(out))


def layer_selection(text: str, n_layers: int, option: str) -> list[int]:
    """``all``, ``none`` (or empty), ``every:K`` (0, K, 2K, …) or a comma list of layers, checked
    against a model of ``n_layers`` layers (no negative indices); else UsageError.

    >>> layer_selection("every:3", 7, "--controls-layers"), layer_selection("none", 7, "--controls-layers")
    ([0, 3, 6], [])
    """
    text = (text or "").strip()
    try:
        if text == "all":
            return list(range(n_layers))
        if text in ("", "none"):
            return []
        if text.startswith("every:"):
            k = int(text.split(":", 1)[1])
            if k < 1:
                raise ValueError("K must be ≥ 1")
            return list(range(0, n_layers, k))
        layers = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as e:
        raise UsageError(f"{option} must be all, none, every:K or comma-separated layers ({e})") from None
    bad = [l for l in layers if not 0 <= l < n_layers]
    if bad:
        from geolens.validation import out_of_range

        raise UsageError(out_of_range(f"{option} {bad[0]}", n_layers, "layers", allow_negative=False))
    return layers


def check_indices(values: Sequence[int] | None, count: int, what: str, option: str) -> list[int] | None:
    """Each of ``values`` checked by :func:`check_index` (``None`` stays ``None``)."""
    return None if values is None else [check_index(v, count, what, option) for v in values]


# --- models ----------------------------------------------------------------------------------------


def check_model_name(name: str, *, tiny: bool = False) -> str:
    """A model argument that :func:`geolens.models.load_model` can load, checked before it loads.

    In this order: a shipped name (``geolens.models.MODELS``), ``tiny-*`` when the command allows
    them, a local checkpoint folder (with ``config.json``), or a Hugging Face hub id with or
    without a slash (``gpt2``, ``EleutherAI/pythia-70m``): its snapshot folder when it is in the
    local Hugging Face cache (loading it never goes to the network), the id when the hub can be
    reached, else refused within seconds (:func:`geolens.model_cache.hub_checkpoint`; transformers'
    own retries take about a minute offline), with a "did you mean" for a misspelt shipped name: the
    message of :func:`geolens.load_model` for the same name, word for word
    (:func:`geolens.model_cache.checkpoint_for`, which imports no torch).
    """
    from geolens.model_cache import checkpoint_for

    known = list(SHIPPED_MODELS) + (list(TINY_MODELS) if tiny else [])
    if name in known:
        return name
    return checkpoint_for(name, known)


BACKENDS = {"tl": "transformer_lens", "hf": "hf"}
"""``--backend`` values → :func:`geolens.models.load_model`'s ``backend``."""


def load_run_model(args, name: str):
    """The model of a run, ``name`` checked by :func:`check_model_name`: autograd off, the thread
    count of :func:`geolens.threads.apply` (``--threads`` when the command has it and it is not 0,
    else ``GEOLENS_THREADS``, else the free cores), then :func:`geolens.models.load_model`
    (looked up now: tests replace it) with ``--compat``."""
    import torch

    from geolens import models

    torch.set_grad_enabled(False)
    from geolens.threads import apply

    apply(getattr(args, "threads", 0) or None)  # --threads, else GEOLENS_THREADS, else the free cores
    return models.load_model(name, compatibility_mode=args.compat)


def check_backend(backend: str, *, compat: bool = False) -> str:
    """The :func:`geolens.models.load_model` backend of a ``--backend`` value, or UsageError
    (an unknown value, or ``--compat``, TransformerLens' weight processing, with ``hf``).

    >>> check_backend("hf"), check_backend("tl", compat=True)
    ('hf', 'transformer_lens')
    """
    if backend not in BACKENDS:
        raise UsageError(f"--backend {backend!r}: choose tl or hf{did_you_mean(str(backend), BACKENDS)}")
    if compat and backend == "hf":
        raise UsageError(
            "--compat is TransformerLens' weight processing; --backend hf reads the raw transformers weights (drop one of them)"
        )
    return BACKENDS[backend]


# --- corpora and files -----------------------------------------------------------------------------


def check_corpus(name: str, option: str = "--corpus") -> str:
    """Refuse a corpus that cannot give documents, before the model loads.

    Offline names need the gensim wheel's data; ``hf:`` names are left to ``datasets`` (network);
    a local file is read once with :func:`geolens.data.load_corpus` (missing, a folder, empty,
    binary, not UTF-8, a ``.jsonl`` line without ``"text"``: all refused, naming the problem).
    """
    from geolens import data

    if name.startswith("hf:"):
        if len(name) <= 3:
            raise UsageError(f"{option} {name!r}: expected hf:<dataset>[:<config>]")
        return name
    try:
        if name in data.OFFLINE_CORPORA:
            path = data._gensim_test_data() / data.OFFLINE_CORPORA[name]
            if not path.is_file():
                raise UsageError(f"{option} {name}: the gensim wheel is installed without {path.name}")
        else:
            data.load_corpus(name)
    except (OSError, ValueError, ModuleNotFoundError) as err:
        raise UsageError(f"{option} {name}: {err}") from err
    return name


def check_out_dir(path: str | os.PathLike, option: str = "--out") -> Path:
    """Create a folder inside a command's output folder (if needed) and make sure files can be written in it."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise UsageError(f"{option} {out}: is an existing file, not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".geolens-", suffix=".probe", dir=out)
    except OSError as err:
        raise UsageError(f"{option} {out}: cannot write there ({err.strerror or type(err).__name__})") from err
    os.close(fd)
    os.unlink(probe)
    return out


def out_folder(args, command: str, *, resumable: bool = False) -> Path:
    """The command's output folder from ``--out`` / ``--name`` / ``--overwrite`` (and ``--resume``,
    ``--replot`` where the command has them), opened by :func:`geolens.run_folder.open_run_folder`:
    default ``geolens-runs/<command>/<time stamp>``, never a folder holding results unless asked,
    marked incomplete until the command returns."""
    from geolens.run_folder import open_run_folder

    folder = open_run_folder(
        args.out or None,
        command=command,
        name=getattr(args, "name", None),
        overwrite=getattr(args, "overwrite", False),
        resume=getattr(args, "resume", False),
        resumable=resumable,
        replot=getattr(args, "replot", False),
    )
    return folder.path


def corpus_windows(model, corpus: str, seq_len: int, n_sequences: int | None, option: str = "--corpus"):
    """:func:`geolens.data.corpus_windows`, with "too few windows" as a UsageError."""
    from geolens import data

    try:
        return data.corpus_windows(model, corpus, seq_len, n_sequences)
    except ValueError as err:
        raise UsageError(f"{option} {corpus}: {err}") from err


# --- shared option declarations ------------------------------------------------------------------


# The options every corpus command shares, in the order they are declared. Each entry: the
# argparse settings of the option; a help text may depend on the option's default (``{default}``)
# and on whether the command takes the tiny random models (``{tiny}``).
RUN_OPTIONS: dict[str, dict] = {
    "model": dict(help="smollm2-135m (default), gemma3-270m{tiny}, a local folder or a cached HF name"),
    "backend": dict(
        choices=("tl", "hf"),
        help="how the model is read: tl (TransformerLens: a TransformerBridge, or a HookedTransformer on TransformerLens 2.x) "
        "or hf (the transformers model itself, without TransformerLens; its attention reading is checked against its "
        "own forward when it loads); default {default}",
    ),
    "corpus": dict(
        help="default {default}; lee (news) or enwiki, the offline corpora of the gensim wheel; a local .txt/.jsonl file; or hf:<dataset>[:<config>] (needs the network)"
    ),
    "corpora": dict(
        nargs="+",
        help="one or more corpora: lee, enwiki (offline, gensim wheel), local .txt/.jsonl files or hf:<dataset>",
    ),
    "n_sequences": dict(type=positive_int, help="corpus windows"),
    "seq_len": dict(type=seq_len_int, help="tokens per window, BOS included"),
    "batch_size": dict(type=positive_int, help="sequences per forward pass"),
    "threads": dict(type=non_negative_int, help="torch threads (0: GEOLENS_THREADS, else the free cores)"),
}


def add_run_options(p, *, tiny: bool = False, own: dict[str, dict] | None = None, **defaults) -> None:
    """Declare the shared options named in ``defaults`` (``seq_len=128`` adds ``--seq-len`` with
    default 128), in the order of :data:`RUN_OPTIONS` whatever the order of the keywords.

    ``tiny``: ``--model`` also names the tiny random models. ``own``: a command's own argparse
    settings for an option, replacing the shared ones (``{"seq_len": {"help": None}}``: no help
    text; ``{"n_sequences": {"type": non_negative_int}}``; ``{"model": {"action": "append"}}``).
    """
    own = own or {}
    unknown = sorted(set(defaults) - set(RUN_OPTIONS)) + sorted(set(own) - set(defaults))
    if unknown:
        raise ValueError(f"add_run_options: no shared option (or no default given) for {unknown}")
    for name, shared in RUN_OPTIONS.items():
        if name not in defaults:
            continue
        shared = {
            **shared,
            "help": shared["help"].format(default=defaults[name], tiny=", " + "/".join(TINY_MODELS) if tiny else ""),
        }
        kwargs = {**shared, "default": defaults[name], **own.get(name, {})}
        p.add_argument("--" + name.replace("_", "-"), **kwargs)


def add_compat(p) -> None:
    """``--compat``: TransformerLens compatibility mode (HookedTransformer numerics), off by default."""
    p.add_argument(
        "--compat",
        action="store_true",
        help="TransformerLens compatibility mode: HookedTransformer numerics (folded norms, centred W_O, b_V folded into b_O); off by default",
    )


def add_out(p, *, help: str = "output folder", resumable: bool = False, optional: bool = False) -> None:
    """``--out``, ``--name`` and ``--overwrite`` (see :func:`out_folder`); ``optional``: the command
    writes files only when ``--out`` or ``--name`` is given."""
    default = "write nothing" if optional else f"geolens-runs/{p.prog.split()[-1]}/<date-time>"
    p.add_argument("--out", default=None, help=f"{help} (default: {default})")
    p.add_argument(
        "--name", default=None, help="folder name under geolens-runs/<command>/ instead of the date and time"
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the results already in the output folder"
        + (" (--resume continues them instead)" if resumable else ""),
    )
