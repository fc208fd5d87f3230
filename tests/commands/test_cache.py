"""geolens cache path|verify|clear (geolens.commands.cache), on a cache folder of the test's own: the
folder printed, an empty cache, a damaged model reported with exit 1, an unknown model a one-line
usage error, and clear removing what is there (and saying when nothing is). Verifying an intact
converted model: tests/test_run_folder.py and tests/test_model_cache.py."""

from __future__ import annotations

import pytest

from geolens.cli import main


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GEOLENS_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _out(capsys) -> list[str]:
    return capsys.readouterr().out.splitlines()


def test_path_and_an_empty_cache(cache, capsys):
    assert main(["cache", "path"]) == 0 and _out(capsys) == [str(cache)]
    assert main(["cache", "verify"]) == 0 and _out(capsys) == [f"no converted model in {cache / 'models'}"]
    assert main(["cache", "clear"]) == 0 and _out(capsys) == [f"nothing to remove in {cache / 'models'}"]


def test_a_damaged_model_is_reported_and_cleared(cache, capsys):
    folder = cache / "models" / "smollm2-135m-f32"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    assert main(["cache", "verify"]) == 1
    [line] = _out(capsys)
    assert line.startswith("smollm2-135m: DAMAGED (no manifest") and line.endswith("the next load converts it again")
    assert main(["cache", "clear", "smollm2-135m"]) == 0 and _out(capsys) == [
        f"removed 1 item(s) from {cache / 'models'}"
    ]
    assert not folder.exists()


def test_an_unknown_model_is_a_usage_error(cache, capsys):
    assert main(["cache", "verify", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("geolens cache: error: unknown model 'nope' (cached models are named ") and "\n" not in err
