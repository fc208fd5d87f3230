"""Headless Debian ``chromium`` for the tests that render pages (tests/report/test_browser.py, the
site tests of tests/test_docs.py).

Every launch goes through :func:`run_chromium`: one profile per process, warmed once, a
``TIMEOUT``-second limit per launch with the whole process group killed when it is reached (a
renderer left behind can otherwise hold the output pipes open and block the test), and one retry
with a fresh profile when a launch times out, fails or writes nothing. ``CHROMIUM`` is ``None``
when no binary is installed (``bash scripts/install.sh --browser``).
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--disable-extensions",
    "--disable-breakpad",
    "--no-default-browser-check",
    "--password-store=basic",
    "--use-mock-keychain",
    "--mute-audio",
    "--hide-scrollbars",
    "--run-all-compositor-stages-before-draw",
    "--virtual-time-budget=10000",
]
TIMEOUT = 60  # seconds per launch (one launch takes about 1 s on an idle 2-core machine)


def _launch(page, profile, extra, timeout: float) -> subprocess.CompletedProcess:
    """One chromium run, its own process group, stdout/stderr to files (not pipes), killed as a
    group at ``timeout``. ``returncode`` is ``None`` when it was killed."""
    cmd = [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *extra, Path(page).resolve().as_uri()]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, text=True, start_new_session=True
        )
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        try:  # the browser, and whatever it left behind (renderer, zygote, crashpad), in any case
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
        out.seek(0), err.seek(0)
        stderr = err.read()
        if rc is None:
            stderr += f"\n[run_chromium: killed after {timeout:.0f} s]"
        return subprocess.CompletedProcess(cmd, rc, out.read(), stderr)


def _produced(run, extra) -> bool:
    """The launch wrote what it was asked for (a screenshot file, or a whole DOM)."""
    shots = [a.split("=", 1)[1] for a in extra if a.startswith("--screenshot=")]
    if run.returncode != 0:
        return False
    if shots:
        return all(Path(s).is_file() and Path(s).stat().st_size > 0 for s in shots)
    if "--dump-dom" in extra:
        return "</html>" in run.stdout
    return True


_PROFILE: dict[str, Path] = {}


def run_chromium(page, *extra, timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    """Run headless chromium on ``page`` with ``extra`` flags (``--dump-dom``, ``--screenshot=…``).

    Uses one profile for the whole module (created by the first launch, reused after); when a
    launch times out, fails or produces nothing, retries once with a fresh profile. The returned
    ``stderr`` records every attempt."""
    if "shared" not in _PROFILE:
        _PROFILE["shared"] = Path(tempfile.mkdtemp(prefix="geolens-chromium-"))
        atexit.register(shutil.rmtree, _PROFILE["shared"], ignore_errors=True)
    notes = []
    for attempt in (1, 2):
        fresh = None if attempt == 1 else tempfile.mkdtemp(prefix="geolens-chromium-retry-")
        t = time.perf_counter()
        try:
            run = _launch(page, fresh or _PROFILE["shared"], extra, timeout)
        finally:
            if fresh:
                shutil.rmtree(fresh, ignore_errors=True)
        notes.append(f"[attempt {attempt}: exit {run.returncode}, {time.perf_counter() - t:.1f} s]")
        if _produced(run, extra):
            break
    run.stderr = run.stderr + "\n" + " ".join(notes)
    if os.environ.get("GEOLENS_CHROMIUM_LOG"):  # every launch's attempts, for docs/test-robustness.md
        with open(os.environ["GEOLENS_CHROMIUM_LOG"], "a") as log:
            log.write(" ".join(notes) + "\n")
    return run
