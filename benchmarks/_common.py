"""What every benchmark script shares: its import check and the output folder of ``--smoke``.

Standard library only, so that importing it adds nothing to a process whose memory is measured
(``value_zeroing.py`` runs inseq in a child process of its own).
"""

from __future__ import annotations

import atexit
import importlib
import os
import shutil
import sys
import tempfile


def require(*modules: tuple[str, str]) -> None:
    """Exit at once, in one line, when a (module, pip extra) the running benchmark needs is missing.

    Called before any timing starts, so a missing package never costs a run.
    """
    script = os.path.basename(sys.argv[0]) or "this benchmark"
    for module, extra in modules:
        try:
            importlib.import_module(module)
        except ImportError:
            raise SystemExit(
                f"benchmarks/{script} needs {module}, which is not installed: pip install 'geolens[{extra}]'"
            ) from None


def smoke_folder() -> str:
    """A temporary folder for a --smoke run's output, removed when the script exits; the folder
    named by the environment variable GEOLENS_SMOKE_OUT instead, kept, when it is set."""
    if os.environ.get("GEOLENS_SMOKE_OUT"):
        os.makedirs(os.environ["GEOLENS_SMOKE_OUT"], exist_ok=True)
        return os.environ["GEOLENS_SMOKE_OUT"]
    folder = tempfile.mkdtemp(prefix="geolens-bench-smoke-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder
