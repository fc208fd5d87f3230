"""Shared fixtures: tiny random models (offline, fast) for both TransformerLens families.

In the TransformerLens 4.x environment the tiny models are ``TransformerBridge``s (GQA Llama, MHA
GPT-2 with biases, Gemma 3 with a post-attention norm). In a TransformerLens 2.x/3.x environment
(``.venvs/tl2``, run by ``.ci/run``) they are ``HookedTransformer``s; tests marked ``bridge_only``
are skipped there.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # for `import reference`

from geolens import names_filter  # noqa: E402
from geolens.testing import HOOKED_TINY_KINDS, TINY_KINDS, tiny_tokens  # noqa: E402

try:
    from transformer_lens.model_bridge import TransformerBridge  # noqa: F401

    HAS_BRIDGE = True
except ImportError:
    HAS_BRIDGE = False

try:
    from transformer_lens import HookedTransformer  # noqa: F401

    HAS_HOOKED = True
except ImportError:
    HAS_HOOKED = False

TINY_KINDS = list(TINY_KINDS if HAS_BRIDGE else HOOKED_TINY_KINDS)

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def _share_the_cores_between_xdist_workers() -> None:
    """Under pytest-xdist, each worker (and every process its tests start: CLI and benchmark runs,
    notebook kernels, the .venvs/tl2 column) computes with cores // workers threads, at least one,
    unless OMP_NUM_THREADS is set. torch's default, one thread per core in every worker,
    oversubscribes the cores, and OpenMP threads then wait for each other: on 2 cores with another
    busy process, a SmolLM2 forward took 10-25x longer with 2 threads than with 1."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))  # set by xdist in its workers
    if workers < 2 or "OMP_NUM_THREADS" in os.environ:
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    threads = max(1, cores // workers)
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)


_share_the_cores_between_xdist_workers()


def load_script(name: str):
    """``scripts/<name>.py`` imported as a module (a fresh one per call), for tests of the scripts
    and of what they share with the package."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pytest_collection_modifyitems(config, items):
    for item in items:  # the tier of each test, in --junitxml reports (scripts/test.sh counts per tier)
        item.user_properties.append(("tier", "slow" if "slow" in item.keywords else "fast"))
    if HAS_BRIDGE:
        return
    skip = pytest.mark.skip(reason="needs TransformerLens 4.x TransformerBridge")
    for item in items:
        if "bridge_only" in item.keywords or ("slow" in item.keywords and "tl2_slow" not in item.keywords):
            item.add_marker(skip)


def run_examples(obj, name: str) -> None:
    """Run the ``>>>`` examples of ``obj``'s docstring as ``--doctest-modules`` does (its module's
    names in scope): skipped where their TransformerBridge models do not exist (TL 2.x/3.x), a
    failure names how many examples failed. The one runner of tests/test_public_api.py (the names
    of ``geolens.__all__``) and tests/test_api_reference.py (the other entries of docs/api.md)."""
    import doctest

    if not HAS_BRIDGE:
        pytest.skip("the examples use TransformerLens 4.x TransformerBridge models")
    finder = doctest.DocTestFinder(recurse=False)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    tests = finder.find(obj, name=name, globs=dict(vars(sys.modules[obj.__module__])))
    assert tests and tests[0].examples, name
    for t in tests:
        runner.run(t)
    res = runner.summarize(verbose=False)
    assert res.failed == 0, f"{name}: {res.failed} of {res.attempted} examples failed (run pytest -s to see them)"


def make_tiny(kind: str, *, compatibility_mode: bool = False, seed: int = 0, n_layers: int = 2):
    if HAS_BRIDGE:
        from geolens.testing import tiny_bridge

        return tiny_bridge(kind, compatibility_mode=compatibility_mode, seed=seed, n_layers=n_layers)
    from geolens.testing import tiny_hooked

    return tiny_hooked(kind, seed=seed, n_layers=n_layers)


def random_corpus(n: int, seq: int, seed: int) -> torch.Tensor:
    """``[n, seq]`` random token windows for the tiny models (ids 4–39), BOS (id 0) first."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(4, 40, (n, seq), generator=g)
    t[:, 0] = 0  # BOS of the tiny tokenizer
    return t


def git(repo, *args: str) -> str:
    """``git -C repo args`` (a real git, its own identity), its stdout stripped; fails the test on error."""
    import subprocess

    ident = ["-c", "user.email=tests@geolens.invalid", "-c", "user.name=geolens tests", "-c", "commit.gpgsign=false"]
    done = subprocess.run(["git", "-C", str(repo), *ident, *args], capture_output=True, text=True)
    assert done.returncode == 0, f"git {' '.join(args)}: {done.stderr}"
    return done.stdout.strip()


def git_commit(repo, message: str = "commit") -> str:
    """Commit everything in the git repository holding ``repo`` (``git init`` there when none); its full SHA."""
    import subprocess

    inside = subprocess.run(["git", "-C", str(repo), "rev-parse", "--is-inside-work-tree"], capture_output=True)
    if inside.returncode != 0:
        git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def register_in_git(protocol_json, registered_at: str = "2026-12-06") -> str:
    """Register the protocol at ``protocol_json`` as a study does: commit its text and twin in the git
    repository of their folder (``git init`` there when none), write REGISTERED.json naming that commit,
    commit it. Returns the registration's commit."""
    from geolens.preregistration import register

    folder = Path(protocol_json).parent
    commit = git_commit(folder, "protocol text and twin, fixed before any run")
    register(protocol_json, registered_at=registered_at, commit=commit)
    git_commit(folder, "register the protocol")
    return commit


@pytest.fixture(scope="session", autouse=True)
def _effects_cache(tmp_path_factory):
    """evaluate_attribution's on-disk effects cache in a folder of this test session's own, never
    the user's (geolens.faithfulness.effects_cache.FOLDER)."""
    from geolens.faithfulness import effects_cache

    effects_cache.FOLDER = tmp_path_factory.mktemp("effects")
    yield
    effects_cache.FOLDER = None


@pytest.fixture(scope="session", params=TINY_KINDS)
def tiny(request):
    """(model, tokens, full cache) for each tiny architecture."""
    torch.manual_seed(0)
    model = make_tiny(request.param)
    tokens = tiny_tokens(model, length=12)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    return model, tokens, cache


@pytest.fixture(scope="session")
def tiny_gqa():
    model = make_tiny("gqa")
    tokens = tiny_tokens(model, length=12)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=names_filter(model))
    return model, tokens, cache


@pytest.fixture(scope="session")
def smollm2():
    """The real SmolLM2-135M bridge, loaded once per test session (slow tier)."""
    from geolens import load_model

    return load_model("smollm2-135m")


@pytest.fixture(scope="session")
def smollm2_tokens(smollm2):
    """``[4, 64]`` windows of the offline Lee corpus, BOS first."""
    from geolens.data import corpus_windows

    return corpus_windows(smollm2, "lee", seq_len=64, n_sequences=4)
