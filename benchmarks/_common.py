"""What every benchmark script shares: its import check, the output folder of ``--smoke``, and the
per-round ratio interval with its verdict against a goal.

Standard library only at import (the interval imports numpy and scipy when it is called), so that
importing it adds nothing to a process whose memory is measured (``value_zeroing.py`` runs inseq in
a child process of its own).
"""

from __future__ import annotations

import atexit
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager


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


def ratio_interval(num: list[float], den: list[float], level: float = 0.95) -> dict:
    """Geometric mean of the per-round ratios num/den with a t-interval on their logs (the two
    columns ran in the same round, so a slow spell of the machine hits both). numpy and scipy are
    imported here, when called, so that importing this module adds nothing to a measured process."""
    import numpy as np
    from scipy import stats

    logs = np.log(np.asarray(num) / np.asarray(den))
    n = len(logs)
    mean = float(logs.mean())
    half = float(stats.t.ppf((1 + level) / 2, n - 1) * logs.std(ddof=1) / np.sqrt(n)) if n > 1 else float("inf")
    return dict(
        geometric_mean=float(np.exp(mean)),
        low=float(np.exp(mean - half)),
        high=float(np.exp(mean + half)),
        rounds=n,
        level=level,
    )


def verdict(ci: dict, goal: float, *, at_most: bool = True) -> str:
    """'met' when the whole interval is on the goal's side (at or below it, or with ``at_most=False``
    at or above), 'not met' when it is wholly on the other, else 'undecided' at this number of rounds."""
    if at_most:
        return (
            "met" if ci["high"] <= goal else ("not met" if ci["low"] > goal else f"undecided at {ci['rounds']} rounds")
        )
    return "met" if ci["low"] >= goal else ("not met" if ci["high"] < goal else f"undecided at {ci['rounds']} rounds")


def machine() -> str:
    """The machine in a few words, for a record: its cores, CPU model and widest vector unit
    (``/proc/cpuinfo``; the cores alone where that cannot be read). Seconds measured on two
    machines compare only through this.

    >>> machine().split(" cores")[0].isdigit()
    True
    """
    text = f"{os.cpu_count()} cores"
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            info = f.read()
    except OSError:
        return text
    fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    flags = set(fields.get("flags", "").split())
    vector = "AVX-512" if "avx512f" in flags else "AVX2, no AVX-512" if "avx2" in flags else "no AVX2"
    model = fields.get("model name")
    return f"{text}, {model}, {vector}" if model else f"{text}, {vector}"


@contextmanager
def busy_processes(n: int):
    """``n`` single-threaded busy processes (``while True: pass``) for the block, started a second
    before it and killed after it, also when it raises; a second is waited after the block in every
    case (``n`` 0: none started), so that each measurement starts on a settled machine."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    if procs:
        time.sleep(1.0)
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
        time.sleep(1.0)


def commit(folder) -> str:
    """The short commit of the repository at ``folder``, for a record ("unknown" outside git)."""
    run = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=folder)
    return run.stdout.strip() or "unknown"
