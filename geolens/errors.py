"""The user errors of the command line: :class:`UsageError`.

Every user error of a ``geolens`` command (a bad argument, a missing file, an output folder in
the way) is a :class:`UsageError`, raised by the validators of :mod:`geolens.commands._options`,
by the run folders of :mod:`geolens.run_folder` and by the commands, and caught by
:func:`geolens.cli.main`, which prints it as one line ``geolens <command>: error: <message>`` on
stderr and returns 2, without a traceback.

>>> err = UsageError("--layer 99:\\n  out of range", prog="geolens sinks")
>>> str(err), err.prog, isinstance(err, ValueError)
('--layer 99: out of range', 'geolens sinks', True)
"""

from __future__ import annotations


class UsageError(ValueError):
    """A user error of a command: bad argument, missing file, unwritable output, ... (a ValueError).

    Raised by the validators of :mod:`geolens.commands._options` (and by commands and run
    folders), caught by :func:`geolens.cli.main`. The message is always one line.
    """

    def __init__(self, message: str, *, prog: str | None = None):
        super().__init__(" ".join(str(message).split()))  # always one line
        self.prog = prog


class ResumeRefused(UsageError):
    """Saved work that cannot be resumed: unreadable, damaged, edited, or made under other
    settings or another model (one line, naming the file and how to start again; raised by
    :mod:`geolens.resume` and :mod:`geolens.checkpoint`)."""
