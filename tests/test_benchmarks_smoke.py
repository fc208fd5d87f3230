"""Every benchmark script runs: ``python benchmarks/<name>.py --smoke`` on a tiny model, end to end.

Each smoke run goes through the script's whole path (children, tables, its JSON written into a
folder, here ``GEOLENS_SMOKE_OUT``) in seconds to a minute; its figures mean nothing. A benchmark
added to ``benchmarks/`` is picked up here and must have a ``--smoke`` mode. The benchmarks run in
the main (TransformerLens 4.x) environment, as the README says, hence ``bridge_only``; those whose
smoke run takes more than about 20 s are in the slow tier. The scripts that need packages beyond
geolens' core dependencies (scipy: ``pip install 'geolens[bench]'``) must say so in one line before
timing anything.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p.name for p in (ROOT / "benchmarks").glob("*.py") if not p.name.startswith("_"))
SLOW = {
    "contributions.py",
    "corpus_scale.py",
    "first_hour.py",
    "gpu.py",
    "value_zeroing.py",
    "wait_policy.py",
}  # smoke runs over ~20 s on 2 cores
OUTPUTS = {  # what each smoke run writes into GEOLENS_SMOKE_OUT
    "contributions.py": ["contributions.json", "scaling.png"],
    "corpus_scale.py": ["corpus_scale.json"],
    "flow.py": ["flow.json"],
    "first_hour.py": ["first_hour.json"],
    "gpu.py": ["gpu.json"],
    "ig_default.py": ["ig_default.json", "ig_paths.png"],
    "long_context_probe.py": ["long_context.json"],
    "masking.py": ["masking.json"],
    "per_term.py": ["per_term.json"],
    "value_zeroing.py": ["value_zeroing.json"],
    "wait_policy.py": ["wait_policy.json"],
}

pytestmark = pytest.mark.bridge_only


def _run(
    script: str, out: Path, extra_env: dict | None = None, timeout: float = 300, args: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    env = {**os.environ, "GEOLENS_SMOKE_OUT": str(out), "PYTHONWARNINGS": "ignore", **(extra_env or {})}
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--smoke", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_every_benchmark_is_covered():
    assert SCRIPTS and set(SCRIPTS) == set(OUTPUTS), "a new benchmark needs a --smoke mode and an entry in OUTPUTS"


@pytest.mark.parametrize("script", [pytest.param(s, marks=pytest.mark.slow) if s in SLOW else s for s in SCRIPTS])
def test_benchmark_smoke_run(script, tmp_path):
    run = _run(script, tmp_path)
    assert run.returncode == 0, f"{script} --smoke failed:\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}"
    for name in OUTPUTS[script]:
        path = tmp_path / name
        assert path.is_file() and path.stat().st_size > 0, (
            f"{script} --smoke wrote no {name}: {sorted(os.listdir(tmp_path))}"
        )
        if name.endswith(".json"):
            assert json.loads(path.read_text())  # complete, readable JSON
    assert f"figures: {tmp_path}" in run.stdout


def test_contributions_backends_side_by_side_smoke_run(tmp_path):
    """``contributions.py --backend hf --smoke``: both backends timed in the same rounds, each
    ratio and their ratio recorded per length, and the verdict line printed."""
    run = _run("contributions.py", tmp_path, args=("--backend", "hf"))
    assert run.returncode == 0, (
        f"contributions.py --backend hf --smoke failed:\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}"
    )
    record = json.loads((tmp_path / "backends.json").read_text())
    (row,) = record["lengths"]
    assert row["seq_len"] == 32 and set(row["rounds"]) == {"a_tl", "b_tl", "a_hf", "b_hf"}
    assert all(len(times) == record["repeats"] == 2 and min(times) > 0 for times in row["rounds"].values())
    for backend in ("tl", "hf"):
        ratios = [b / a for b, a in zip(row["rounds"][f"b_{backend}"], row["rounds"][f"a_{backend}"])]
        assert abs(row[f"ratio_{backend}"]["geometric_mean"] - (ratios[0] * ratios[1]) ** 0.5) < 1e-9
    assert "HF-native ratio / TransformerLens ratio" in run.stdout and f"figures: {tmp_path}" in run.stdout


def test_contributions_backend_hf_refuses_the_tl_only_parts(tmp_path):
    run = _run("contributions.py", tmp_path, args=("--backend", "hf", "--scaling", "16", "32"), timeout=120)
    assert (
        run.returncode == 2
        and "--backend hf times the two backends side by side only" in run.stderr.strip().splitlines()[-1]
    )


@pytest.mark.parametrize("script", ["contributions.py", "value_zeroing.py"])
def test_missing_scipy_is_one_line_before_any_timing(script, tmp_path):
    """With scipy unimportable, the script stops at once: one line naming scipy and the extra."""
    stub = tmp_path / "stub" / "scipy"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('scipy is hidden by this test')\n")
    run = _run(
        script,
        tmp_path / "out",
        {"PYTHONPATH": os.pathsep.join(p for p in [str(stub.parent), os.environ.get("PYTHONPATH")] if p)},
        timeout=120,
    )
    assert run.returncode != 0
    message = run.stderr.strip().splitlines()
    assert message and "scipy" in message[-1] and "pip install 'geolens[bench]'" in message[-1], run.stderr[-2000:]
    assert run.stdout.strip() == "", run.stdout[-2000:]  # nothing timed, nothing printed
