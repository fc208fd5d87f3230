"""Execute the tutorials and store them with their outputs (text, tables, figures), in place.

    python scripts/run_tutorials.py                       # every tutorials/NN_*.ipynb, one at a time
    python scripts/run_tutorials.py tutorials/06_*.ipynb  # some of them

Each notebook runs top to bottom in a fresh kernel of this interpreter (nbclient), with a
temporary working directory, then is written back with its outputs so that a reader sees the
results without running anything. Kept small and stable for review:

- the per-cell execution timestamps nbclient adds are dropped;
- consecutive stream outputs are merged and keep only their final state (tqdm rewrites one line
  with carriage returns), without tqdm's "IProgress not found" warning (ipywidgets is not
  installed, so bars are plain text);
- a circuitsvis view inlines its 1.3 MB JavaScript bundle; the stored notebook keeps the view
  (its ``<div>`` and ``CircuitsVis.render(...)`` call with the numbers, a few kB) without the
  bundle, marked ``data-geolens-needs-bundle``, and a one-line text note. The documentation site
  loads the bundle once per page that shows a view (docs/_hooks/circuitsvis.py), so the view is
  interactive there; GitHub and an untrusted Jupyter do not run that JavaScript anyway (run the
  cell, or ``.save()`` the view, to see it there).

A cell that raises stops the run with an error naming the notebook; nothing is written for that
notebook. ``tests/test_tutorials.py`` executes the same notebooks in memory (never writing them)
and checks that the stored copies carry outputs.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUNDLE_MARK = "CircuitsVis.render("
MAX_HTML = 100_000  # characters; larger HTML outputs are circuitsvis views with their bundle
MAX_VIEW = 400_000  # characters: a view (its numbers) stored without the bundle, at most
NEEDS_BUNDLE = "data-geolens-needs-bundle"  # docs/_hooks/circuitsvis.py adds the bundle to such pages
# The <script> element that holds the bundle (an IIFE defining CircuitsVis; circuitsvis_bundle()
# removed every "</script>" from it, so the first one closes the element).
BUNDLE_SCRIPT = re.compile(r'<script>\s*(?:"use strict";)?\s*var CircuitsVis\b.*?</script>\n?', re.S)


def _same_python(cmd: str) -> bool:
    if cmd in ("python", f"python{sys.version_info[0]}", "python%i.%i" % sys.version_info[:2]):
        return True  # jupyter_client starts such kernels with sys.executable
    found = shutil.which(cmd)
    return found is not None and os.path.realpath(found) == os.path.realpath(sys.executable)


def kernel_name() -> str:
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


def _final_line_state(text: str) -> str:
    """What a terminal shows after carriage returns: the last segment of every line."""
    return "\n".join(next((seg for seg in reversed(line.split("\r")) if seg), "") for line in text.split("\n"))


TQDM_WIDGET_WARNING = re.compile(
    r"^.*TqdmWarning: IProgress not found.*\n(?:\s+from \.autonotebook import .*\n)?", re.M
)


def _merged_streams(outputs: list) -> list:
    """Consecutive stream outputs of the same name joined into one, as a terminal shows them."""
    merged = []
    for out in outputs:
        if (
            out.get("output_type") == "stream"
            and merged
            and merged[-1].get("output_type") == "stream"
            and merged[-1].get("name") == out.get("name")
        ):
            merged[-1]["text"] = merged[-1].get("text", "") + out.get("text", "")
        else:
            merged.append(out)
    for out in merged:
        if out.get("output_type") == "stream":
            out["text"] = _final_line_state(TQDM_WIDGET_WARNING.sub("", out.get("text", "")))
    return [o for o in merged if o.get("output_type") != "stream" or o["text"].strip()]


def clean_outputs(nb) -> None:
    """Drop timestamps, collapse progress bars, store circuitsvis views without their bundle."""
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        cell.metadata.pop("execution", None)
        cell.outputs = _merged_streams(cell.get("outputs", []))
        for out in cell.outputs:
            data = out.get("data", {})
            html_text = data.get("text/html", "")
            if isinstance(html_text, list):
                html_text = "".join(html_text)
            if BUNDLE_MARK in html_text and len(html_text) > MAX_HTML and "var CircuitsVis" in html_text:
                components = sorted(set(re.findall(r"CircuitsVis\.render\([^,]+,\s*CircuitsVis\.(\w+)", html_text)))
                view = BUNDLE_SCRIPT.sub("", html_text)
                note = (
                    f"[interactive circuitsvis view ({', '.join(components) or 'component'}), stored without its "
                    "1.3 MB JavaScript bundle: the documentation site shows it; here, run the cell or "
                    ".save('view.html') the view.]"
                )
                out["data"] = {"text/plain": note}
                if len(view) <= MAX_VIEW and "var CircuitsVis" not in view:
                    out["data"]["text/html"] = f"<div {NEEDS_BUNDLE}>{view}</div>"


def run_notebook(path: Path, *, timeout: int = 900, write: bool = True):
    """Execute ``path`` in a fresh kernel; return the executed notebook (written in place if ``write``)."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory(prefix="geolens-tutorial-") as workdir:
        client = NotebookClient(
            nb, timeout=timeout, kernel_name=kernel_name(), resources={"metadata": {"path": workdir}}
        )
        try:
            client.execute()
        except CellExecutionError as err:
            raise SystemExit(f"{path.name}: a cell failed, notebook not written:\n{err}") from None
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    clean_outputs(nb)
    if write:
        nbformat.write(nb, path)
    return nb


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: tutorials/NN_*.ipynb")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per cell")
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted((ROOT / "tutorials").glob("[0-9][0-9]_*.ipynb"))
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        parser.error(f"no such notebook: {', '.join(missing)}")
    for path in paths:
        start = time.perf_counter()
        run_notebook(path, timeout=args.timeout)
        print(f"{path.name}: executed and stored with outputs in {time.perf_counter() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
