"""The CLI's lazy-import rule (:mod:`geolens.commands`): ``geolens --version``, ``--help``,
``geolens <command> --help`` and argument errors answer without importing torch, TransformerLens,
transformers, pandas, numpy or matplotlib, with the right exit code; and the constants the parsers
show (:mod:`geolens.commands._names`) equal those of the modules that own them.

Each case runs ``python -X importtime -m geolens …`` in a subprocess and reads the modules it
imported from the ``-X importtime`` lines on stderr. Nothing here is timed.
"""

from __future__ import annotations

import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import geolens.commands

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformer_lens", "transformers", "pandas", "numpy", "matplotlib")
COMMANDS = sorted(m.name for m in pkgutil.iter_modules(geolens.commands.__path__) if not m.name.startswith("_"))


def geolens_cli(*args: str, env: dict | None = None) -> tuple[int, set[str], list[str]]:
    """``python -X importtime -m geolens *args``: (exit code, top-level packages imported, the other stderr lines)."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "geolens", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
        timeout=120,  # a hang guard only
    )
    imported, other = set(), []
    for line in result.stderr.splitlines():
        if line.startswith("import time:"):
            name = line.rsplit("|", 1)[-1].strip()
            imported.add(name.split(".")[0])
        elif line.strip():
            other.append(line)
    return result.returncode, imported, other


def assert_light(imported: set[str]) -> None:
    assert "geolens" in imported  # the importtime lines were read
    heavy = sorted(set(HEAVY) & imported)
    assert not heavy, f"imported {heavy}"


@pytest.mark.parametrize("args", [["--version"], ["--help"]], ids=lambda a: a[0])
def test_version_and_help_import_nothing_heavy(args):
    code, imported, _ = geolens_cli(*args)
    assert code == 0
    assert_light(imported)


@pytest.mark.parametrize("command", COMMANDS)
def test_command_help_imports_nothing_heavy(command):
    code, imported, _ = geolens_cli(command, "--help")
    assert code == 0
    assert_light(imported)


@pytest.mark.parametrize(
    "args, message",
    [
        (["sinks", "--no-such-option"], "geolens sinks: error: unrecognized arguments: --no-such-option"),
        (["reprot"], "did you mean 'report'?"),
        (["flow", "a prompt", "--top-k", "0"], "--top-k"),
        (["faithfulness", "--ranking", "quey"], "did you mean 'query'?"),
        (["faithfulness", "--mc-task", "bigbench:general_knowledge"], "`geolens mc`"),
        (["sinks", "--lambdas", "1,x"], "--lambdas"),
        (["flow", "a prompt", "--model", "./no/such/folder"], "unknown model './no/such/folder'"),
        (["flow", "a prompt", "--model", "EleutherAI/pythia-70m"], "not in the local Hugging Face cache"),
    ],
)
def test_argument_errors_are_one_line_exit_2_and_import_nothing_heavy(args, message, tmp_path):
    code, imported, lines = geolens_cli(*args, env={"HF_HOME": str(tmp_path)})
    assert code == 2
    assert len(lines) == 1 and message in lines[0], lines
    assert_light(imported)
