"""Threads on a shared machine: OpenMP's passive wait (after a brief spin on a free machine), and a
thread count that follows the free cores.

By default torch runs one thread per core and OpenMP makes idle threads spin (its *active* wait
policy; libgomp, the OpenMP of torch's Linux wheels, spins about 3 ms before it sleeps). Beside
other busy processes that is the worst case: the spinning threads burn the cores the other jobs
need, and every parallel region waits for a thread that is not scheduled. A thread that sleeps at
once (the *passive* wait) has the opposite cost on an idle machine: a model's small operations
(one query's head, a layer's 64 positions) start and end a parallel region every few
microseconds, and waking a sleeping thread for each one made such calls up to 1.7 times as slow as
a brief spin before the sleep (docs/benchmarks.md#the-wait-policy). geolens therefore, unless told
otherwise:

- sets ``OMP_WAIT_POLICY=PASSIVE`` and libgomp's ``GOMP_SPINCOUNT`` when ``import geolens`` comes
  before torch's (:func:`prefer_passive_wait`; OpenMP reads both once, when torch loads it, so a
  torch imported earlier keeps its policy). The spin count is :data:`SPIN_COUNT` when no other
  process keeps a core busy at that moment (measured over 0.05 s): a waiting thread spins for some
  tens of microseconds, which covers the gap between two small operations, then sleeps. Beside
  busy processes it is 0, a plain passive wait: there the spin made calls slower, not faster
  (:func:`spin_count`). The choice holds for the process's life (OpenMP reads it once) and passes
  to its children; it was measured on 2 cores, and on a larger machine any other busy core turns
  the spin off, the plain passive wait of before. The measurement adds 0.05 s to the import;
- uses as many threads as there are free cores, the cores this process may run on
  (``os.sched_getaffinity``) minus the cores other processes keep busy, at least 1
  (:func:`free_cores`), when a model is loaded (:func:`geolens.models.load_model`) and a command
  starts. The busy cores are measured now, over 0.1 s, from ``/proc/stat`` on this process's cores
  less this process's own use (:func:`busy_cores`); the one-minute load average lags by a minute
  (a command started just after another had finished saw a busy machine and ran on one thread),
  and serves only where ``/proc/stat`` cannot be read (less this process's share, :func:`own_load`).

One exception: a call whose matrix products are large (:data:`LARGE_ROWS` rows or more, e.g.
integrated gradients or Value Zeroing on 128 tokens; :func:`geolens.flow.baselines.integrated_gradients`
and :func:`geolens.value_zeroing` size their own products) runs on every core of the affinity while it
lasts (:func:`for_rows`), even beside busy processes. Beside processes busy at import the wait has
no spin, so an extra thread costs the others nothing while it waits, and on large products it turns a fair share of the
machine into work: beside three busy processes on two cores, one thread gets about half a core and two
threads about four fifths (docs/benchmarks.md#the-first-hour). On small products the second
thread mostly waits to be scheduled at each synchronisation, so a short call keeps the free cores.

Overrides, strongest first: a command's ``--threads N``; ``GEOLENS_THREADS=N`` in the environment;
``OMP_NUM_THREADS`` (or ``MKL_NUM_THREADS``) in the environment; a ``torch.set_num_threads`` of your
own, before or after the first model is loaded (geolens then leaves the count alone; before it,
a count other than torch's default of one thread per core is taken as yours); ``OMP_WAIT_POLICY``
or ``GOMP_SPINCOUNT`` set in the environment. :func:`policy` says what is in force, and the report
records it in ``report.json`` (``params.threads``).
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager

ENV = "GEOLENS_THREADS"
SPIN_COUNT = 3000
"""libgomp's spins before a waiting thread sleeps (``GOMP_SPINCOUNT``), set with the passive wait;
libgomp counts about 100 000 spins to the millisecond, so about 30 µs. Other OpenMP runtimes ignore it
and wait passively."""
_state: dict = {"passive_set_by_geolens": False, "spin_set_by_geolens": False, "busy_at_import": None, "applied": None}
_SINCE = (time.monotonic(), sum(os.times()[:2]))  # wall and CPU seconds of this process when geolens loaded


def cores() -> int:
    """The cores this process may run on (its CPU affinity; ``os.cpu_count()`` where that is unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def load_average() -> float:
    """The one-minute load average (0.0 where the platform has none)."""
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        return 0.0


def own_load() -> float:
    """This process's share of the load average: its CPU seconds over its wall seconds since geolens
    loaded (0.0 in its first second). The load average counts this process too; what it has been
    using is not taken by *other* work."""
    wall = time.monotonic() - _SINCE[0]
    return 0.0 if wall < 1.0 else (sum(os.times()[:2]) - _SINCE[1]) / wall


def _cpu_jiffies(cpus) -> dict[int, tuple[int, int]] | None:
    """``{cpu: (busy, total)}`` clock ticks of ``cpus`` since boot (``/proc/stat``); None where unreadable."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    out = {}
    for line in lines:
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            ticks = [int(x) for x in fields[:8]]  # user nice system idle iowait irq softirq steal
            out[int(name[3:])] = (sum(ticks) - ticks[3] - ticks[4], sum(ticks))
    return out or None


def busy_cores(interval: float = 0.1) -> float | None:
    """The cores of this process's affinity that *other* processes keep busy, measured over
    ``interval`` seconds: the busy share of each core (``/proc/stat``) summed, less this process's
    own CPU use over the same span. None where ``/proc/stat`` cannot be read."""
    try:
        cpus = set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = set(range(os.cpu_count() or 1))
    before, own_before, start = _cpu_jiffies(cpus), sum(os.times()[:2]), time.monotonic()
    if before is None:
        return None
    time.sleep(interval)
    after, own, wall = _cpu_jiffies(cpus), sum(os.times()[:2]) - own_before, time.monotonic() - start
    if after is None:
        return None
    busy = sum((after[c][0] - before[c][0]) / max(1, after[c][1] - before[c][1]) for c in after if c in before)
    return max(0.0, busy - own / max(wall, 1e-9))


def free_cores(n_cores: int | None = None, busy: float | None = None) -> int:
    """The cores not taken by other work: ``n_cores − busy``, rounded, between 1 and ``n_cores``.
    ``busy``: the cores other processes keep busy (default: :func:`busy_cores`, measured now; where
    that cannot be read, the load average less this process's share, :func:`own_load`).

    >>> free_cores(2, 0.1), free_cores(2, 3.0), free_cores(16, 5.4), free_cores(4, -1.0)
    (2, 1, 11, 4)
    """
    n = cores() if n_cores is None else int(n_cores)
    if busy is None:
        busy = busy_cores()
    if busy is None:
        busy = load_average() - own_load()
    return max(1, min(n, int(n - max(0.0, float(busy)) + 0.5)))


def spin_count(busy: float | None, n_cores: int | None = None) -> int:
    """The ``GOMP_SPINCOUNT`` geolens sets: :data:`SPIN_COUNT` when no other process keeps a core
    busy (``busy``: the cores other processes keep busy, :func:`busy_cores`), else 0, a plain
    passive wait: beside busy processes the spin cost more than it saved (docs/benchmarks.md#the-wait-policy).
    ``busy`` None (not measured): 0.

    >>> spin_count(0.1, 2), spin_count(2.0, 2), spin_count(None, 2)
    (3000, 0, 0)
    """
    if busy is None:
        return 0
    n = cores() if n_cores is None else int(n_cores)
    return SPIN_COUNT if free_cores(n, busy) >= n else 0


def prefer_passive_wait() -> bool:
    """Set ``OMP_WAIT_POLICY=PASSIVE``, with ``GOMP_SPINCOUNT`` = :func:`spin_count` of the cores
    other processes keep busy now (measured over 0.05 s) unless the environment has one, when neither
    the environment nor an imported torch has decided the policy; True when this call set it."""
    if "OMP_WAIT_POLICY" in os.environ or "torch" in sys.modules:
        return False
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    if "GOMP_SPINCOUNT" not in os.environ:
        busy = busy_cores(0.05)
        os.environ["GOMP_SPINCOUNT"] = str(spin_count(busy))
        _state["spin_set_by_geolens"] = True
        _state["busy_at_import"] = None if busy is None else round(busy, 2)
    _state["passive_set_by_geolens"] = True
    return True


def _env_threads() -> int | None:
    value = os.environ.get(ENV, "").strip()
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        from geolens.errors import UsageError

        raise UsageError(f"{ENV}={value!r}: give a positive number of threads")
    return int(value)


def choose(explicit: int | None = None) -> tuple[int | None, str]:
    """``(threads, source)``: ``explicit`` (a command's ``--threads``), else ``GEOLENS_THREADS``, else
    the free cores; ``(None, "yours")`` when torch's count was already changed by the caller.

    >>> choose(3)
    (3, '--threads')
    """
    n, source, _ = _choose(explicit)
    return n, source


def _choose(explicit: int | None) -> tuple[int | None, str, float | None]:
    """:func:`choose` with the busy cores measured for it (None: not measured)."""
    if explicit:
        return int(explicit), "--threads", None
    env = _env_threads()
    if env is not None:
        return env, ENV, None
    import torch

    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        if os.environ.get(name, "").strip():
            return None, name, None  # the environment decided torch's count
    applied = _state["applied"]
    if applied is None and torch.get_num_threads() != cores():
        return None, "yours", None  # torch's default is one thread per core: a torch.set_num_threads of the caller's
    if applied is not None:
        if torch.get_num_threads() != applied["threads"]:
            return None, "yours", None  # torch.set_num_threads was called after geolens set the count
        if applied["source"] == "--threads":  # a command's explicit count holds for its whole run
            return applied["threads"], "--threads", None
    busy = busy_cores()
    return free_cores(busy=busy), "free cores", None if busy is None else round(busy, 2)


LARGE_ROWS = 512
"""Rows (batch × positions) from which a call's matrix products take every core (:func:`for_rows`)."""


@contextmanager
def for_rows(rows: int):
    """The threads of one call whose matrix products have ``rows`` rows (batch × positions): from
    :data:`LARGE_ROWS` on, every core of the affinity while the block runs, then the count before
    it; below it, or when the count was not geolens' free-core choice (``--threads``,
    ``GEOLENS_THREADS``, ``OMP_NUM_THREADS``, your own ``torch.set_num_threads``), nothing changes.
    Yields the thread count in force.

    >>> import torch
    >>> with for_rows(8) as n:
    ...     n == torch.get_num_threads()
    True
    """
    import torch

    before = torch.get_num_threads()
    applied = _state["applied"]
    ours = applied is not None and applied["source"] == "free cores" and before == applied["threads"]
    wanted = cores() if ours and int(rows) >= LARGE_ROWS else before
    if wanted == before:
        yield before
        return
    torch.set_num_threads(wanted)
    try:
        yield wanted
    finally:
        torch.set_num_threads(before)


def apply(explicit: int | None = None) -> dict:
    """Set torch's thread count by :func:`choose` and return :func:`policy`."""
    import torch

    n, source, busy = _choose(explicit)
    if n is not None:
        torch.set_num_threads(n)
        _state["applied"] = dict(threads=n, source=source, busy=busy)
    return policy(source)


def policy(source: str | None = None) -> dict:
    """What is in force: torch's threads and where that count came from, the OpenMP wait policy, the
    cores, and the cores other processes kept busy when the count was chosen (None: not measured)
    with the load average now.

    >>> sorted(policy())
    ['busy_cores', 'cores', 'load_average', 'source', 'threads', 'wait_policy']
    """
    import torch

    wait = os.environ.get("OMP_WAIT_POLICY", "").upper() or "ACTIVE (OpenMP's default)"
    spin = os.environ.get("GOMP_SPINCOUNT", "").strip()
    if spin:
        wait += f", GOMP_SPINCOUNT={spin}"
    if _state["passive_set_by_geolens"] and _state["spin_set_by_geolens"]:
        busy = _state["busy_at_import"]
        seen = "not measured" if busy is None else f"{busy:g}"
        wait += f" (set by geolens; cores other processes kept busy at import: {seen})"
    elif _state["passive_set_by_geolens"]:
        wait += " (the policy set by geolens)" if spin else " (set by geolens)"
    applied = _state["applied"] or {}
    return dict(
        threads=int(torch.get_num_threads()),
        source=source or applied.get("source", "torch's default"),
        wait_policy=wait,
        cores=cores(),
        busy_cores=applied.get("busy"),
        load_average=round(load_average(), 2),
    )


__all__ = [
    "ENV",
    "SPIN_COUNT",
    "apply",
    "busy_cores",
    "choose",
    "cores",
    "for_rows",
    "free_cores",
    "LARGE_ROWS",
    "load_average",
    "policy",
    "prefer_passive_wait",
    "spin_count",
]
