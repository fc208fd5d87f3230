"""The user errors of the command line (geolens.errors): a UsageError is one line whatever its
message, keeps the command it belongs to, and is a ValueError (so Python callers catch it as one);
the refusals of saved work and of folders in use are UsageErrors too."""

from __future__ import annotations

import pytest

from geolens.errors import ResumeRefused, UsageError
from geolens.folder_lock import FolderInUse
from geolens.resume import refuse


def test_a_usage_error_is_one_line_and_keeps_its_command():
    err = UsageError("--layer 99:\n  out of range\t(the model has 30 layers)  ", prog="geolens sinks")
    assert str(err) == "--layer 99: out of range (the model has 30 layers)" and err.prog == "geolens sinks"
    assert UsageError("x").prog is None
    with pytest.raises(ValueError, match="^bad value$"):
        raise UsageError("bad\nvalue")


def test_refusals_are_usage_errors():
    assert issubclass(ResumeRefused, UsageError) and issubclass(FolderInUse, UsageError)
    err = refuse("out/p.json", "its rows\nare damaged")
    assert isinstance(err, ResumeRefused) and "\n" not in str(err)
    assert (
        str(err)
        == "cannot resume from out/p.json: its rows are damaged; rerun with --overwrite (or a new --out) to start again"
    )
