"""Files created with the user's umask, and JSON files read with a one-line error.

``tempfile.mkstemp``/``mkdtemp`` create files and folders with mode 0600/0700 whatever the umask,
so a model cache or a checkpoint written through them would be unreadable to the other users of
a shared machine; the helpers here give such paths the mode a plain ``open``/``mkdir`` would have.

The one home of paths inside a result folder (:mod:`geolens.run_folder`, :mod:`geolens.folder_lock`):
:func:`check_name` for a name built from user input, :func:`inside` for a path listed by a
manifest or a marker, :func:`open_nofollow` / :func:`write_text_nofollow` for the lock and the
marker, each refusing in one line (:class:`UnsafePath`) what would lead outside the folder or
through a symbolic link.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
from pathlib import Path

from geolens.errors import UsageError


def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of a file's bytes, hex, read 1 MiB at a time: the one hash of a file that
    manifests, registrations and results folders record.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     _ = (Path(folder) / "x").write_bytes(b"abc")
    ...     file_sha256(Path(folder) / "x")[:16]
    'ba7816bf8f01cfea'
    """
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def umask() -> int:
    """The process umask (read without changing it where ``/proc`` allows)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    current = os.umask(0o022)
    os.umask(current)
    return current


def apply_umask(path: str | os.PathLike, *, folder: bool | None = None) -> None:
    """Give ``path`` the mode a plain ``open``/``mkdir`` would have: 0666 (0777 for a folder) less the umask.

    ``tempfile.mkstemp``/``mkdtemp`` create 0600/0700 files and folders, which a cache shared by
    the users of one machine cannot use.
    """
    folder = os.path.isdir(path) if folder is None else folder
    os.chmod(path, (0o777 if folder else 0o666) & ~umask())


def apply_umask_tree(root: str | os.PathLike) -> None:
    """:func:`apply_umask` on a folder and everything in it."""
    apply_umask(root, folder=True)
    for parent, dirs, files in os.walk(root):
        for name in dirs:
            apply_umask(os.path.join(parent, name), folder=True)
        for name in files:
            apply_umask(os.path.join(parent, name), folder=False)


def read_json(path: str | os.PathLike, what: str):
    """The JSON value in the UTF-8 file ``path``; ValueError (one line: ``what``, the parser's
    message and its line) when the text is not JSON.

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> _ = (folder / "ok.json").write_text('{"a": [1, 2]}'); _ = (folder / "bad.json").write_text('{"a": }')
    >>> read_json(folder / "ok.json", "settings")
    {'a': [1, 2]}
    >>> read_json(folder / "bad.json", "settings")
    Traceback (most recent call last):
    ValueError: settings: not valid JSON (Expecting value, line 1)
    """
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{what}: not valid JSON ({err.msg}, line {err.lineno})") from None


# --- paths inside a result folder: never outside it, never through a link -------------------------

_NEVER = "geolens never writes, moves or deletes outside a result folder or through a symbolic link"


class UnsafePath(UsageError):
    """A path inside a result folder that would lead outside it or through a symbolic link, or a
    name from user input that is not a plain file name (one line; the command line exits 2)."""


def check_name(name, *, what: str, advice: str = "use a plain name such as 'run1'") -> str:
    """``name`` (from user input: a run name, a model name made into a folder name) if it can name
    one file or folder inside a result folder; else :class:`UnsafePath` naming ``what``, ending with
    ``advice``.

    >>> check_name("run-1", what="--name")
    'run-1'
    >>> check_name("..", what="--name")
    Traceback (most recent call last):
    geolens.files.UnsafePath: --name '..' cannot name a file or folder inside the results: '..' is the folder above; use a plain name such as 'run1'
    """
    text = str(name) if isinstance(name, (str, os.PathLike)) else None
    if text is None:
        raise TypeError(f"{what} must be a string, got {type(name).__name__}")
    why = (
        "it is empty"
        if not text.strip()
        else "'..' is the folder above"
        if text == ".."
        else "'.' is the folder itself"
        if text == "."
        else "it is an absolute path"
        if os.path.isabs(text)
        else "it contains a path separator"
        if "/" in text or os.sep in text or (os.altsep and os.altsep in text)
        else "it contains a NUL character"
        if "\0" in text
        else None
    )
    if why:
        raise UnsafePath(f"{what} {text!r} cannot name a file or folder inside the results: {why}; {advice}")
    return text


def folder_name(name: str, *, what: str) -> str:
    """``name`` (a model: a shipped name, a hub id or a local folder) made into one folder name:
    characters other than letters, digits and ``-_.`` become ``_``; one that would still lead out
    of its parent (``.``, ``..``) is refused (:func:`check_name`, naming ``what``).

    >>> folder_name("EleutherAI/pythia-70m", what="--model")
    'EleutherAI_pythia-70m'
    """
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in str(name).strip("/")) or "model"
    return check_name(safe, what=f"{what} {name}: its sub-folder", advice="give its folder by another path (../NAME)")


def _link_target(path: str | os.PathLike) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


def refuse_link(path: str | os.PathLike, *, what: str) -> None:
    """:class:`UnsafePath` when ``path`` is a symbolic link (``what`` says what the file is for)."""
    if os.path.islink(path):
        raise UnsafePath(
            f"{path} is a symbolic link (to {_link_target(path)}), where geolens keeps {what}; {_NEVER}: remove the link"
        )


def inside(folder: str | os.PathLike, rel, *, what: str) -> Path:
    """``folder / rel`` when that path lies inside ``folder`` without passing through a symbolic link
    (``rel`` relative, no ``..``, no part of it a link, the resolved path under the resolved
    folder); else :class:`UnsafePath`, one line naming ``what`` (where ``rel`` comes from).

    >>> inside("/tmp", "../etc/passwd", what="manifest.json entry")
    Traceback (most recent call last):
    geolens.files.UnsafePath: manifest.json entry '../etc/passwd' points outside /tmp ('..'); geolens never writes, moves or deletes outside a result folder or through a symbolic link: nothing was changed
    """
    folder = Path(folder)
    if not isinstance(rel, str) or not rel or "\0" in rel:
        raise UnsafePath(f"{what} {rel!r} is not a file name inside {folder}; {_NEVER}: nothing was changed")
    parts = Path(rel).parts
    if os.path.isabs(rel) or ".." in parts:
        why = "an absolute path" if os.path.isabs(rel) else "'..'"
        raise UnsafePath(f"{what} {rel!r} points outside {folder} ({why}); {_NEVER}: nothing was changed")
    path = folder
    for part in parts:
        path = path / part
        if os.path.islink(path):
            raise UnsafePath(
                f"{what} {rel!r} lies behind a symbolic link ({path} → {_link_target(path)}); {_NEVER}: nothing was changed"
            )
    root = folder.resolve()
    if not path.resolve().is_relative_to(root):
        raise UnsafePath(f"{what} {rel!r} points outside {folder}; {_NEVER}: nothing was changed")
    return path


def links_out_of(folder: str | os.PathLike) -> list[tuple[str, str]]:
    """The entries directly in ``folder`` that are symbolic links leading outside it (or nowhere):
    ``(name, target)`` pairs; a writer opening one of them by name would write outside the folder."""
    folder = Path(folder)
    root = folder.resolve()
    out = []
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.is_symlink() and not (folder / entry.name).resolve().is_relative_to(root):
                out.append((entry.name, _link_target(folder / entry.name)))
    return sorted(out)


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def open_nofollow(path: str | os.PathLike, flags: int, mode: int = 0o666, *, what: str) -> int:
    """``os.open(path, flags | O_NOFOLLOW)``: a descriptor of ``path`` itself, never of what a
    symbolic link at ``path`` names (:class:`UnsafePath` then; ``what`` says what the file is for)."""
    refuse_link(path, what=what)  # where O_NOFOLLOW is missing, and for a clear message
    try:
        return os.open(path, flags | _NOFOLLOW, mode)
    except OSError as err:
        if err.errno == errno.ELOOP or os.path.islink(path):  # a link put there in between
            refuse_link(path, what=what)
        raise


def write_text_nofollow(path: str | os.PathLike, text: str, *, what: str) -> None:
    """Write ``text`` (UTF-8) to ``path``, refusing a symbolic link there (:func:`open_nofollow`)."""
    fd = open_nofollow(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, what=what)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


def create_writable_folder(path: Path, option: str) -> list[Path]:
    """Create ``path`` (and missing parents) and check that it takes a file; the folders created,
    deepest first. A folder that cannot be written is refused in one line, what was created removed."""
    created = []
    probe = path
    while not probe.exists():
        created.append(probe)
        probe = probe.parent
    try:
        path.mkdir(parents=True, exist_ok=True)
        test = path / f".geolens-probe-{os.getpid()}"
        test.write_bytes(b"")
        test.unlink()
    except OSError as err:
        remove_created(created)
        raise UsageError(
            f"{option} {path}: cannot write there ({err.strerror or type(err).__name__}); choose another --out"
        ) from err
    return created


def remove_created(created: list[Path]) -> None:
    """Remove the folders a refused opening created, deepest first, while they are empty."""
    for folder in created:
        try:
            folder.rmdir()
        except OSError:
            break
