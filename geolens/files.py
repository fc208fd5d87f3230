"""Files created with the user's umask, and JSON files read with a one-line error.

``tempfile.mkstemp``/``mkdtemp`` create files and folders with mode 0600/0700 whatever the umask,
so a model cache or a checkpoint written through them would be unreadable to the other users of
a shared machine; the helpers here give such paths the mode a plain ``open``/``mkdir`` would have.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


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
