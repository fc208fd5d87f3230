"""Every tutorial notebook runs top to bottom (nbclient, a fresh kernel each), so none can rot.

Execution is slow tier: the notebooks use the real SmolLM2 model. The kernel is the ``python3``
kernel of this interpreter (registered with ipykernel when missing). Cells must run without error;
outputs are not compared (numbers are checked by the unit tests), and the stored notebooks are
never written here: ``python scripts/run_tutorials.py`` regenerates their stored outputs. A fast
test checks that the stored copies carry outputs (executed in order, no error, figures, no
inlined 1.3 MB circuitsvis bundle: views are stored without it, and the documentation site loads
it once per page).
"""

from __future__ import annotations

from pathlib import Path

import pytest

TUTORIALS = sorted((Path(__file__).parent.parent / "tutorials").glob("[0-9][0-9]_*.ipynb"))


def _kernel_name() -> str:
    """The kernel ``scripts/run_tutorials.py`` uses (one definition for the script and the test)."""
    from conftest import load_script

    return load_script("run_tutorials").kernel_name()


def test_there_are_tutorials():
    names = [p.name for p in TUTORIALS]
    assert "01_contribution_weights.ipynb" in names and "05_your_own_model.ipynb" in names
    assert "06_induction_heads.ipynb" in names


@pytest.mark.parametrize("path", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_stored_tutorial_shows_its_outputs(path):
    nbformat = pytest.importorskip("nbformat")  # the dev extra (absent from the TL 2.x test environment)

    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    counts = [c.get("execution_count") for c in code]
    assert counts == list(range(1, len(code) + 1)), f"{path.name} is not stored executed top to bottom: {counts}"
    outputs = [o for c in code for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"], f"{path.name} stores an error"
    assert sum(bool(c.get("outputs")) for c in code) >= len(code) // 2, f"{path.name}: most cells have no output"
    assert any("image/png" in o.get("data", {}) for o in outputs), f"{path.name} shows no figure"
    assert path.stat().st_size < 1_500_000, (
        f"{path.name} is {path.stat().st_size} bytes (an inlined circuitsvis bundle?)"
    )


@pytest.mark.slow
@pytest.mark.parametrize("path", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorial_runs(path, tmp_path):
    import nbformat
    from nbclient import NotebookClient

    stored = path.read_bytes()
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=600, kernel_name=_kernel_name(), resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    errors = [
        o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.get("output_type") == "error"
    ]
    assert not errors, errors
    assert path.read_bytes() == stored  # CI re-executes in memory; the stored outputs stay as they are


def test_run_tutorials_cleans_stored_outputs():
    nbformat = pytest.importorskip("nbformat")
    from conftest import load_script
    from nbformat.v4 import new_code_cell, new_notebook, new_output

    run_tutorials = load_script("run_tutorials")
    bundle = '"use strict";var CircuitsVis=(()=>{' + "x" * 200_000
    cell = new_code_cell("view", execution_count=1, metadata={"execution": {"iopub.status.busy": "2026-01-01"}})
    cell.outputs = [
        new_output(
            "stream",
            name="stderr",
            text="/tqdm/auto.py:21: TqdmWarning: IProgress not found. Please update\n  from .autonotebook import tqdm as notebook_tqdm\n",
        ),
        new_output("stream", name="stderr", text="\rbar:   0%|  | 0/4"),
        new_output("stream", name="stderr", text="\rbar: 100%|##| 4/4\n"),
        new_output("stream", name="stdout", text="result 42\n"),
        new_output(
            "display_data",
            data={
                "text/html": f'<script>{bundle}</script><script>CircuitsVis.render("id1", CircuitsVis.AttentionHeads, {{}});</script>',
                "text/plain": "HTMLView",
            },
        ),
        new_output("display_data", data={"text/html": "<table></table>", "text/plain": "df"}),
    ]
    nb = new_notebook(cells=[cell])
    run_tutorials.clean_outputs(nb)
    out = nb.cells[0].outputs
    assert "execution" not in nb.cells[0].metadata
    assert [o.get("text") for o in out[:2]] == ["bar: 100%|##| 4/4\n", "result 42\n"]
    # the view kept without its bundle, marked for the site's hook (docs/_hooks/circuitsvis.py)
    assert sorted(out[2]["data"]) == ["text/html", "text/plain"] and "AttentionHeads" in out[2]["data"]["text/plain"]
    view = out[2]["data"]["text/html"]
    assert view.startswith("<div data-geolens-needs-bundle>") and "var CircuitsVis" not in view
    assert 'CircuitsVis.render("id1", CircuitsVis.AttentionHeads, {});' in view and len(view) < 1000
    assert out[3]["data"]["text/html"] == "<table></table>"
    nbformat.validate(nb)
