"""``geolens`` command line: one subcommand per module of :mod:`geolens.commands`.

Each module ``geolens/commands/<name>.py`` defines ``register(subparsers)`` (adds its parser
and sets ``func``), so capabilities add commands without touching this file.

User errors (:class:`geolens.errors.UsageError`, argparse errors included) are printed
as one line ``geolens <command>: error: <message>`` on stderr, with exit code 2 and no traceback.

Output folders (:mod:`geolens.run_folder`) are completed here when the command returns. An
interrupt (SIGINT, Ctrl-C: exit 130; SIGTERM: exit 143) ends the command with one line saying what
is left (``interrupted; nothing written`` or ``interrupted; partial results in … (incomplete)``)
and no traceback; one that arrives after the results are complete exits 0. A write that fails
(full disk, read-only or unwritable folder, quota, a file-size limit: SIGXFSZ is ignored while a
command runs, so ``ulimit -f`` makes the write fail with EFBIG instead of killing the process) is
one line naming the path and what to do, exit 1; files already saved (checkpoints included) stay
as they were. A saved file that cannot be read back (a truncated gzip, half-written JSON, an empty
pickle) is one line naming the file, exit 1. The folder of such a run stays marked incomplete.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import pkgutil
import signal
import sys
from contextlib import contextmanager

import geolens
import geolens.commands
from geolens.commands._options import ArgumentParser
from geolens.errors import UsageError


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="geolens", description="Geometry of attention for TransformerLens models.")
    parser.add_argument("--version", action="version", version=f"geolens {geolens.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(geolens.commands.__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"geolens.commands.{info.name}").register(sub)
    return parser


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM during a command (a KeyboardInterrupt, so ``finally`` blocks run)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def _signals_interrupt():
    """SIGINT and SIGTERM raise :class:`Interrupted` in the main thread while the command runs."""

    def handler(signum, frame):
        raise Interrupted(signum)

    previous = {}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, handler)
        # a file-size limit (ulimit -f): the write fails with EFBIG, said in one line, instead of a kill
        previous[signal.SIGXFSZ] = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    except ValueError:  # not the main thread: leave the handlers alone
        pass
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


# errno values of a write that cannot succeed as things are, and what the user can do about it
_IO_ADVICE = {
    errno.ENOSPC: "free some disk space or write elsewhere (--out)",
    errno.EDQUOT: "free some of your disk quota or write elsewhere (--out)",
    errno.EACCES: "check the permissions of that folder or write elsewhere (--out)",
    errno.EPERM: "check the permissions of that folder or write elsewhere (--out)",
    errno.EROFS: "that file system is read-only: write elsewhere (--out)",
    errno.EFBIG: "the file is larger than this process may write (ulimit -f, or the file system's limit): "
    "raise the limit or write elsewhere (--out)",
    errno.EIO: "the disk or the network file system failed: check it, or write elsewhere (--out)",
}

# errors of reading a damaged file (a truncated gzip, a half-written JSON, an empty pickle)
_READ_ERRORS = ("JSONDecodeError", "BadGzipFile", "EOFError", "error", "UnpicklingError", "UnicodeDecodeError")
_READ_MODULES = ("json", "json.decoder", "gzip", "builtins", "zlib", "_pickle", "pickle")


def _is_read_error(err: BaseException) -> bool:
    """A damaged file's read error (JSON, gzip, zlib, pickle, UTF-8), not a bug of geolens."""
    kind = type(err)
    return kind.__name__ in _READ_ERRORS and kind.__module__ in _READ_MODULES


def _file_in_traceback(err: BaseException) -> str | None:
    """The file being read when ``err`` was raised: the innermost frame's local (``path``, a file
    object's ``name``) that names an existing file; None when none does."""
    import os
    from pathlib import PurePath

    frames = []
    tb = err.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames):
        for value in list(frame.f_locals.values()):
            name = getattr(value, "name", None) if hasattr(value, "read") else value
            if isinstance(name, (str, PurePath)) and len(str(name)) < 4096:
                try:
                    if os.path.isfile(name):
                        return str(name)
                except (OSError, ValueError):
                    continue
    return None


def _read_error_line(err: BaseException, folders=()) -> str:
    """One line for a file that cannot be read back (damaged, truncated, not what it claims)."""
    from pathlib import Path

    where = getattr(err, "filename", None) or _file_in_traceback(err)
    ours = where is None  # a result of the run (its folder) or an input of the user's (check it)
    if where is not None:
        resolved = Path(where).resolve()
        ours = any(Path(f.path).resolve() in resolved.parents for f in folders)
    elif folders:
        where = "a file in " + ", ".join(str(f.path) for f in folders)
    detail = " ".join(str(err).split()) or type(err).__name__
    advice = "delete it, or rerun with --overwrite" if ours else "check or replace that file"
    return (
        f"cannot read {where or 'a saved file'}: it is damaged or truncated ({type(err).__name__}: {detail}); {advice}"
    )


def _io_error_line(err: OSError, folders=()) -> str | None:
    """One line for an I/O error the user can act on, or None for any other OSError.

    A cached model that cannot be read or rebuilt says so itself (:class:`geolens.model_cache.CacheError`);
    a write error names its file, or the output folder when the error does not say which file.
    """
    from geolens.checkpoint import WriteError
    from geolens.model_cache import CacheError

    if isinstance(err, CacheError):
        return str(err)
    if _is_read_error(err):
        return _read_error_line(err, folders)
    if err.errno not in _IO_ADVICE:
        if err.filename and err.strerror:  # any other fault of a named file: one line too
            return f"{err.filename}: {err.strerror}"
        return None
    text = str(err) if isinstance(err, WriteError) else None
    if text is None and err.filename and _while_reading(err):
        advice = (
            "make it readable (check its permissions) or write elsewhere (--out)"
            if err.errno in (errno.EACCES, errno.EPERM)
            else _IO_ADVICE[err.errno]
        )
        return f"cannot read {err.filename}: {err.strerror or type(err).__name__}; {advice}"
    if text is None:
        where = (
            f" {err.filename}"
            if err.filename
            else (" into " + ", ".join(str(f.path) for f in folders) if folders else "")
        )
        text = f"cannot write{where}: {err.strerror or type(err).__name__}"
    return f"{text}; {_IO_ADVICE[err.errno]}"


def _while_reading(err: BaseException) -> bool:
    """Whether the innermost Python frames of ``err`` were reading (``read_text``, ``load``, ...)."""
    names = []
    tb = err.__traceback__
    while tb is not None:
        names.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    return any(("read" in name or "load" in name) for name in names[-2:])


def main(argv: list[str] | None = None) -> int:
    from geolens import run_folder

    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:
            command = getattr(args, "command", None)
            raise UsageError(
                f"unrecognized arguments: {' '.join(extra)}", prog=f"geolens {command}" if command else None
            )
    except UsageError as err:
        print(f"{err.prog or parser.prog}: error: {err}", file=sys.stderr)
        return 2
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    # commands turn autograd off; a caller's setting is restored. torch is imported by the commands
    # that need it (the lazy-import rule of geolens.commands); a fresh import starts with autograd on
    torch = sys.modules.get("torch")
    grad = torch.is_grad_enabled() if torch is not None else True
    prog = f"geolens {args.command}"
    run_folder.forget_all()

    def all_complete() -> bool:
        folders = run_folder.open_folders()
        return bool(folders) and all(f.state == "complete" for f in folders)

    def interrupted(err) -> int:
        signum = int(getattr(err, "signum", signal.SIGINT))
        if all_complete():
            where = ", ".join(str(f.path) for f in run_folder.open_folders())
            print(f"{prog}: interrupted after the results were complete in {where}", file=sys.stderr)
            return 0
        left = run_folder.leave_all()
        print(f"{prog}: interrupted; {'; '.join(left) if left else 'nothing written'}", file=sys.stderr)
        return 128 + signum

    try:
        with _signals_interrupt():
            try:
                code = int(args.func(args) or 0)
                if code == 0:
                    run_folder.complete_all()
                else:
                    run_folder.leave_all()
                return code
            except UsageError as err:
                run_folder.leave_all()
                print(f"{err.prog or prog}: error: {err}", file=sys.stderr)
                return 2
            except KeyboardInterrupt as err:
                return interrupted(err)
            except OSError as err:
                line = _io_error_line(err, run_folder.open_folders())
                left = run_folder.leave_all()
                if line is None:
                    raise
                kept = [s for s in left if not s.startswith("nothing written")]
                print(f"{prog}: error: {line}" + (f" ({'; '.join(kept)})" if kept else ""), file=sys.stderr)
                return 1
            except (ValueError, EOFError) as err:
                if isinstance(err, UsageError) or not _is_read_error(err):
                    run_folder.leave_all()  # a bug: the folder stays marked incomplete, the traceback shows
                    raise
                line = _read_error_line(err, run_folder.open_folders())
                left = run_folder.leave_all()
                kept = [s for s in left if not s.startswith("nothing written")]
                print(f"{prog}: error: {line}" + (f" ({'; '.join(kept)})" if kept else ""), file=sys.stderr)
                return 1
            except ModuleNotFoundError as err:
                left = run_folder.leave_all()
                if err.name is not None:  # a failed import: a bug or a broken install, the traceback shows
                    raise
                kept = [s for s in left if not s.startswith("nothing written")]
                print(f"{prog}: error: {err}" + (f" ({'; '.join(kept)})" if kept else ""), file=sys.stderr)
                return 1  # geolens' own message: a model wheel or an extra that is not installed
            except BaseException:
                run_folder.leave_all()  # a bug: the folder stays marked incomplete, the traceback shows
                raise
    except KeyboardInterrupt as err:  # a second interrupt, while the first one was being handled
        return interrupted(err)
    finally:
        run_folder.forget_all()
        torch = sys.modules.get("torch")
        if torch is not None:
            torch.set_grad_enabled(grad)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
