"""Threads on a shared machine (geolens.threads): the free-core rule, the order of the overrides,
the passive wait set only before torch loads, and the policy recorded. Run in subprocesses where
the environment or torch's import order matters, so that the test process keeps its own setting."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import types

import pytest
import torch

from geolens import threads


def _run(code: str, **env) -> dict:
    environ = {
        k: v
        for k, v in os.environ.items()
        if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "GEOLENS_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
    }
    environ.update(env)
    out = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_free_cores_subtracts_the_busy_cores_and_keeps_at_least_one():
    assert threads.free_cores(2, 0.0) == 2
    assert threads.free_cores(2, 0.6) == 1  # 1.4 rounds to 1
    assert threads.free_cores(2, 3.0) == 1
    assert threads.free_cores(4, 1.4) == 3
    assert threads.free_cores(4, -1.0) == 4  # never more than the cores


def test_busy_cores_sees_another_process_and_not_this_one():
    """Measured over 0.1 s from /proc/stat: a child spinning on one core counts (about 1 core, on a
    machine that is not busier), this process spinning does not. No timing is asserted beyond the
    share of one core a spinning process shows; skipped without /proc/stat."""
    if threads.busy_cores() is None:
        pytest.skip("no /proc/stat here")
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        import time

        time.sleep(0.5)
        seen = threads.busy_cores(0.5)
    finally:
        spin.kill()
        spin.wait()
    assert seen >= 0.6  # the child's core (the machine's other work can only add)


def test_busy_cores_leaves_out_this_process_own_use(monkeypatch):
    """The arithmetic, on made-up ticks: two cores at 100 ticks each over the span, 150 busy in
    all, while this process used 0.5 s of CPU in 1 s: 1.5 − 0.5 = 1.0 core busy elsewhere."""
    ticks = iter([{0: (0, 0), 1: (0, 0)}, {0: (100, 100), 1: (50, 100)}])
    clock = iter([0.0, 1.0])
    cpu = iter([(0.0, 0.0, 0, 0, 0), (0.5, 0.0, 0, 0, 0)])
    monkeypatch.setattr(threads, "_cpu_jiffies", lambda cpus: next(ticks))
    monkeypatch.setattr(threads.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(threads.time, "sleep", lambda s: None)
    monkeypatch.setattr(threads.os, "times", lambda: next(cpu))
    assert threads.busy_cores() == pytest.approx(1.0)
    monkeypatch.setattr(threads, "_cpu_jiffies", lambda cpus: None)
    monkeypatch.setattr(threads.time, "monotonic", lambda: 0.0)
    monkeypatch.setattr(threads.os, "times", lambda: (0.0, 0.0, 0, 0, 0))
    assert threads.busy_cores() is None  # no /proc/stat: free_cores falls back on the load average


def test_this_process_own_load_is_measured():
    code = (
        "import json, time, geolens.threads as t; end = time.monotonic() + 1.5\n"
        "while time.monotonic() < end: pass\n"
        "print(json.dumps(t.own_load()))"
    )
    # a process that kept one core busy: some of it, whatever else the machine runs (a busy machine
    # gives it less than half a core), never more than the one core it can use
    assert 0.05 < _run(code) <= 1.1


def test_own_load_is_the_cpu_seconds_over_the_wall_seconds_since_geolens_loaded(monkeypatch):
    monkeypatch.setattr(threads, "_SINCE", (10.0, 2.0))
    monkeypatch.setattr(threads.time, "monotonic", lambda: 14.0)
    monkeypatch.setattr(threads.os, "times", lambda: (3.0, 0.5, 0, 0, 0))
    assert threads.own_load() == pytest.approx((3.5 - 2.0) / 4.0)
    monkeypatch.setattr(threads.time, "monotonic", lambda: 10.5)
    assert threads.own_load() == 0.0  # its first second: not measured yet


def test_passive_wait_is_set_before_torch_only_and_never_over_the_environment():
    code = (
        "import json, os, geolens, torch; print(json.dumps(dict(w=os.environ.get('OMP_WAIT_POLICY'), "
        "s=os.environ.get('GOMP_SPINCOUNT'), p=geolens.threads.policy()['wait_policy'])))"
    )
    got = _run(code)  # the spin follows the load at import, which a busy CI machine may have
    assert got["w"] == "PASSIVE" and got["s"] in ("0", str(threads.SPIN_COUNT))
    assert re.fullmatch(
        rf"PASSIVE, GOMP_SPINCOUNT={got['s']} \(set by geolens; cores other processes kept busy at import: ([0-9.]+|not measured)\)",
        got["p"],
    )
    assert _run(code, OMP_WAIT_POLICY="active") == dict(w="active", s=None, p="ACTIVE")
    yours = _run(code, GOMP_SPINCOUNT="0")  # your spin count is kept; the policy is still geolens'
    assert yours == dict(w="PASSIVE", s="0", p="PASSIVE, GOMP_SPINCOUNT=0 (the policy set by geolens)")
    after = "import json, os, torch, geolens; print(json.dumps(dict(w=os.environ.get('OMP_WAIT_POLICY'), s=os.environ.get('GOMP_SPINCOUNT'))))"
    assert _run(after) == dict(w=None, s=None)  # torch came first: its OpenMP policy is decided


def test_the_brief_spin_only_when_no_other_process_keeps_a_core_busy(monkeypatch):
    """spin_count: SPIN_COUNT on a free machine, a plain passive wait (0) beside busy processes or
    where the load cannot be measured; prefer_passive_wait sets it from busy_cores at import."""
    assert threads.spin_count(0.0, 2) == threads.spin_count(0.4, 2) == threads.SPIN_COUNT
    assert threads.spin_count(0.6, 2) == threads.spin_count(3.0, 2) == threads.spin_count(None, 2) == 0
    for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):  # recorded as they are now, put back after the test
        monkeypatch.setenv(name, "recorded")
    monkeypatch.setattr(threads, "sys", types.SimpleNamespace(modules={}))  # as before torch's import
    monkeypatch.setattr(threads, "_state", dict(threads._state))
    monkeypatch.setattr(threads, "cores", lambda: 2)
    for busy, expected in ((0.0, threads.SPIN_COUNT), (2.0, 0)):
        for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
            threads.os.environ.pop(name, None)
        monkeypatch.setattr(threads, "busy_cores", lambda interval=0.1, b=busy: b)
        assert threads.prefer_passive_wait()
        assert threads.os.environ["GOMP_SPINCOUNT"] == str(expected)
        assert (
            f"GOMP_SPINCOUNT={expected} (set by geolens; cores other processes kept busy at import: {busy:g})"
            in (threads.policy()["wait_policy"])
        )


def test_the_overrides_in_order():
    explicit = (
        "import json, geolens.threads as t; t.free_cores = lambda *a, **k: 1; a = t.apply(3); b = t.apply(); "
        "print(json.dumps([a['threads'], a['source'], b['threads'], b['source']]))"
    )
    assert _run(explicit) == [3, "--threads", 3, "--threads"]  # a command's --threads holds for its run
    free = (
        "import json, torch, geolens.threads as t; t.free_cores = lambda *a, **k: 1; "
        "b = t.apply(); torch.set_num_threads(2); c = t.apply(); "
        "print(json.dumps([b['threads'], b['source'], c['threads'], c['source']]))"
    )
    assert _run(free) == [1, "free cores", 2, "yours"]  # your own count, set after geolens's, is kept
    before = (
        "import json, torch, geolens.threads as t; t.free_cores = lambda *a, **k: 1; n = 2 if t.cores() == 1 else 1; "
        "torch.set_num_threads(n); a = t.apply(); print(json.dumps([a['threads'], a['source'], n]))"
    )
    got = _run(before)  # set before geolens chose any: not torch's default of one per core, so yours
    assert got[:2] == [got[2], "yours"]
    assert _run(free, GEOLENS_THREADS="2")[:2] == [2, "GEOLENS_THREADS"]
    assert _run(free, OMP_NUM_THREADS="1")[1] == "OMP_NUM_THREADS"


def test_a_bad_geolens_threads_is_one_line():
    from geolens.errors import UsageError

    os.environ[threads.ENV] = "two"
    try:
        with pytest.raises(UsageError, match="GEOLENS_THREADS='two'"):
            threads.choose()
    finally:
        del os.environ[threads.ENV]


def test_load_model_applies_the_policy():
    code = (
        "import json, geolens, geolens.threads as t; t.free_cores = lambda *a, **k: 1; "
        "geolens.load_model('tiny-gqa'); import torch; print(json.dumps([torch.get_num_threads(), t.policy()['source']]))"
    )
    assert _run(code) == [1, "free cores"]


def test_a_large_call_takes_every_core_and_gives_them_back():
    code = (
        "import json, torch, geolens.threads as t; t.free_cores = lambda *a, **k: 1; t.cores = lambda: 2; t.apply(); "
        "out = [torch.get_num_threads()]\n"
        "with t.for_rows(t.LARGE_ROWS) as n: out += [n, torch.get_num_threads()]\n"
        "out.append(torch.get_num_threads())\n"
        "with t.for_rows(t.LARGE_ROWS - 1) as n: out += [n, torch.get_num_threads()]\n"
        "try:\n"
        "    with t.for_rows(10**6): raise KeyError\n"
        "except KeyError: out.append(torch.get_num_threads())\n"
        "print(json.dumps(out))"
    )
    # large: both cores, then the free-core count again (also when the block raises); small: unchanged
    assert _run(code) == [1, 2, 2, 1, 1, 1, 1]


@pytest.mark.parametrize(
    "setup, env",
    [
        ("t.apply(); torch.set_num_threads(1)", {}),  # your own count (set after geolens chose 2)
        ("t.apply()", {"GEOLENS_THREADS": "1"}),
        ("t.apply(1)", {}),  # a command's --threads
        ("", {}),  # geolens chose nothing yet
    ],
)
def test_a_large_call_keeps_a_count_that_is_not_geolens_free_core_choice(setup, env):
    code = (
        "import json, torch, geolens.threads as t; t.free_cores = lambda *a, **k: 2; t.cores = lambda: 2; "
        f"torch.set_num_threads(1); {setup}\n"
        "with t.for_rows(10**6) as n: print(json.dumps([n, torch.get_num_threads()]))"
    )
    assert _run(code, **env) == [1, 1]


def test_integrated_gradients_and_value_zeroing_size_their_products(monkeypatch, tiny_gqa):
    import geolens
    from geolens.flow.baselines import integrated_gradients
    from geolens.flow.erasure import erase

    model = tiny_gqa[0]
    t = tiny_gqa[1][0, :10]
    seen = []
    real = threads.for_rows

    def spy(rows):
        seen.append(rows)
        return real(rows)

    monkeypatch.setattr(threads, "for_rows", spy)
    integrated_gradients(model, t, erase(t, torch.arange(10) > 0, 5), 9, n_steps=4, batch_size=3)
    geolens.value_zeroing(model, t[None], layers=[0])
    geolens.value_zeroing(model, t[None], layers=[0], chunk_size=2)
    assert seen == [3 * 10, 10 * 11 // 2, 2 * 10]
    text = "one two three four five six seven eight"
    geolens.attribute(model, text, ["integrated_gradients", "value_zeroing_rollout"], ig_batch=4)
    n = len(geolens.attribute(model, text, "alti").tokens)
    assert seen[3:] == [4 * n] + [n * (n + 1) // 2] * model.cfg.n_layers  # Value Zeroing: one call per layer
