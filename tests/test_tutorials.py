"""Every tutorial notebook runs top to bottom (nbclient, a fresh kernel each), so none can rot.

Slow tier: the notebooks use the real SmolLM2 model. The kernel is the ``python3`` kernel of this
interpreter (registered with ipykernel when missing). Cells must run without error; outputs are
not compared (numbers are checked by the unit tests).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TUTORIALS = sorted((Path(__file__).parent.parent / "tutorials").glob("[0-9][0-9]_*.ipynb"))
pytestmark = pytest.mark.slow


def _same_python(cmd: str) -> bool:
    if cmd in ("python", f"python{sys.version_info[0]}", "python%i.%i" % sys.version_info[:2]):
        return True  # jupyter_client starts such kernels with sys.executable
    found = shutil.which(cmd)
    return found is not None and os.path.realpath(found) == os.path.realpath(sys.executable)


def _kernel_name() -> str:
    """``python3`` if that kernel runs this interpreter, else a kernel registered for it."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        if _same_python(KernelSpecManager().get_kernel_spec("python3").argv[0]):
            return "python3"
    except NoSuchKernel:
        pass
    cmd = [sys.executable, "-m", "ipykernel", "install", "--user", "--name", "geolens-tests"]
    subprocess.run(cmd, check=True, capture_output=True)
    return "geolens-tests"


def test_there_are_tutorials():
    names = [p.name for p in TUTORIALS]
    assert "01_contribution_weights.ipynb" in names and "05_your_own_model.ipynb" in names


@pytest.mark.parametrize("path", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorial_runs(path, tmp_path):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name=_kernel_name(), resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors
