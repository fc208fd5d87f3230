"""The on-disk cache of per-term effects (geolens.faithfulness.effects_cache): a second metric on the
same texts reuses the first one's effects; a damaged, foreign or linked file is measured again."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
import torch

from geolens.faithfulness import effects_cache
from geolens.faithfulness.effects_cache import effects_key, load_effects, save_effects

TEXTS = ["the cat sat on the mat again.", "a dog ran far away from home!"]


def _frames():
    terms = pd.DataFrame(
        dict(layer=[0, 0], query=[3, 3], head=[0, 1], source=[1, 2], kl=[1e-3, 2e-15], norm=[0.5, 1.5])
    )
    positions = pd.DataFrame(dict(document=[0], position=[0], layer=[0], query=[3], floor=[1e-16]))
    return terms, positions


def test_save_and_load_round_trip_bit_for_bit(tmp_path):
    terms, positions = _frames()
    path = save_effects("k1", terms, positions, tmp_path)
    assert path == tmp_path / "k1.npz" and not [p for p in tmp_path.iterdir() if p.name.startswith(".effects-")]
    got_terms, got_positions = load_effects("k1", tmp_path)
    pd.testing.assert_frame_equal(got_terms, terms)
    pd.testing.assert_frame_equal(got_positions, positions)
    assert load_effects("absent", tmp_path) is None


def test_a_file_that_does_not_read_back_is_not_trusted(tmp_path):
    terms, positions = _frames()
    save_effects("k1", terms, positions, tmp_path)
    os.replace(tmp_path / "k1.npz", tmp_path / "k2.npz")  # another key's name: its key inside differs
    assert load_effects("k2", tmp_path) is None
    (tmp_path / "k3.npz").write_bytes(b"not a zip file")
    assert load_effects("k3", tmp_path) is None
    save_effects("k4", terms, positions, tmp_path)
    data = (tmp_path / "k4.npz").read_bytes()
    (tmp_path / "k4.npz").write_bytes(data[: len(data) // 2])  # truncated
    assert load_effects("k4", tmp_path) is None
    save_effects("k5", terms, positions, tmp_path / "elsewhere")
    (tmp_path / "k5.npz").symlink_to(tmp_path / "elsewhere" / "k5.npz")  # a link is not followed
    assert load_effects("k5", tmp_path) is None
    save_effects("k6", terms.drop(columns=["kl"]), positions, tmp_path)  # a table without effects
    assert load_effects("k6", tmp_path) is None


def test_an_unwritable_cache_warns_and_goes_on(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.warns(UserWarning, match="could not cache"):
        assert save_effects("k", *_frames(), blocker / "effects") is None


def test_the_cache_folder_follows_geolens_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(effects_cache, "FOLDER", None)  # the suite's own folder (tests/conftest.py) unset
    monkeypatch.setenv("GEOLENS_CACHE", str(tmp_path))
    assert effects_cache.cache_folder() == tmp_path / "effects"


def test_the_key_names_everything_the_effects_depend_on(monkeypatch):
    t = torch.tensor([[1, 2, 3, 4]])
    base = effects_key("w", t, 0, 2, (8, 126), 128)
    for changed in (
        effects_key("w2", t, 0, 2, (8, 126), 128),
        effects_key("w", t + 1, 0, 2, (8, 126), 128),
        effects_key("w", t, 0, 1, (8, 126), 128),
        effects_key("w", t, 0, 2, (8, 60), 128),
        effects_key("w", t, 0, 2, (8, 126), 64),
    ):
        assert changed != base
    monkeypatch.setattr(effects_cache, "protocol_sha256", lambda: "another protocol")
    assert effects_key("w", t, 0, 2, (8, 126), 128) != base


def test_a_second_metric_reuses_the_measured_effects(tiny_gqa, tmp_path, monkeypatch):
    """The first call measures and caches each document's effects; the second (another metric)
    measures nothing and gives the same effects; cache=False measures again."""
    import geolens
    import geolens.faithfulness.evaluation as evaluation

    monkeypatch.setattr(effects_cache, "FOLDER", tmp_path / "effects")
    model = tiny_gqa[0]
    first = geolens.evaluate_attribution("contribution", model, TEXTS, n_boot=50, progress=False)
    assert len(list((tmp_path / "effects").glob("*.npz"))) == len(TEXTS)
    measured = []
    real = evaluation.norm_controlled_document
    monkeypatch.setattr(evaluation, "norm_controlled_document", lambda *a, **k: measured.append(1) or real(*a, **k))
    second = geolens.evaluate_attribution("raw_attention", model, TEXTS, n_boot=50, progress=False)
    assert measured == []
    assert np.array_equal(first.terms.kl.to_numpy(), second.terms.kl.to_numpy())
    assert first.row(metric="raw_attention")["mean"] == second.partial
    again = geolens.evaluate_attribution("contribution", model, TEXTS, n_boot=50, progress=False, cache=False)
    assert measured == [1] * len(TEXTS) and again.partial == first.partial
    other = geolens.evaluate_attribution("contribution", model, TEXTS, n_positions=1, n_boot=50, progress=False)
    assert len(list((tmp_path / "effects").glob("*.npz"))) == 2 * len(TEXTS) and len(other.positions) == len(TEXTS)
