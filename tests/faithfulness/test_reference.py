"""The shipped reference sets (geolens.faithfulness.reference): protocol 3's published effects, copied
bit for bit, and scoring against them reproducing the published statistics and Holm verdicts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from geolens.faithfulness.reference import (
    DATA,
    MODELS,
    POSITION_COLUMNS,
    TERM_COLUMNS,
    check_norms,
    has_reference,
    load_reference,
)

ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = ROOT / "docs" / "faithfulness" / "v3"


def _published(model_name: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    folder = PUBLISHED / model_name
    terms = pd.read_csv(folder / "per_term_terms.csv.gz", float_precision="round_trip")
    positions = pd.read_csv(folder / "per_term_positions.csv.gz", float_precision="round_trip")
    return terms, positions


@pytest.mark.parametrize("model_name", MODELS)
def test_the_reference_set_is_the_published_table_bit_for_bit(model_name):
    """Every shipped value equals the published CSV's (read at full precision), the record names
    the published files by their manifest's SHA-256, and the windows give each position's next token."""
    assert has_reference(model_name)
    ref = load_reference(model_name)
    terms, positions = _published(model_name)
    for c in POSITION_COLUMNS:
        assert np.array_equal(ref.positions[c].to_numpy(), positions[c].to_numpy()), c
    for c in (*TERM_COLUMNS, "layer", "query"):
        assert np.array_equal(ref.terms[c].to_numpy(), terms[c].to_numpy()), c
    manifest = json.loads((PUBLISHED / model_name / "manifest.json").read_text())
    for name in ("per_term_terms.csv.gz", "per_term_positions.csv.gz"):
        assert (
            ref.info["source_files"][f"docs/faithfulness/v3/{model_name}/{name}"] == manifest["files"][name]["sha256"]
        )
    registered = json.loads((PUBLISHED / "REGISTERED.json").read_text())
    assert ref.info["protocol_sha256"] == registered["text_sha256"]
    rows, cols = (torch.as_tensor(ref.positions[c].to_numpy().copy()) for c in ("document", "query"))
    nxt = ref.tokens[rows, cols + 1].numpy()
    assert np.array_equal(nxt, ref.positions.next_token.to_numpy())
    assert ref.tokens.shape == (100, 128) and ref.n_documents == 100


def test_subset_and_refusals(tmp_path):
    ref = load_reference("smollm2-135m")
    part = ref.subset(3)
    assert part.n_documents == 3 and set(part.positions.document) == {0, 1, 2} == set(part.terms.document)
    assert len(part.terms) == int(part.positions.n_terms.sum())
    for bad in (0, 101):
        with pytest.raises(ValueError, match="n_documents must be between 1 and 100"):
            ref.subset(bad)
    with pytest.raises(ValueError, match="no reference set for 'gpt2'"):
        load_reference("gpt2")
    assert not has_reference("gpt2") and not has_reference(None)
    # a changed file is refused, not read
    for suffix in (".npz", ".json"):
        shutil.copy(DATA / f"smollm2-135m{suffix}", tmp_path / f"smollm2-135m{suffix}")
    data = bytearray((tmp_path / "smollm2-135m.npz").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (tmp_path / "smollm2-135m.npz").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="does not match its record"):
        load_reference("smollm2-135m", tmp_path)


def test_check_norms_refuses_another_model():
    stored = np.array([1.0, 2.0, 3.0])
    check_norms("smollm2-135m", stored * (1 + 1e-9), stored)
    with pytest.raises(ValueError, match="not the one the smollm2-135m reference set was measured on"):
        check_norms("smollm2-135m", stored * 1.01, stored)
    with pytest.raises(ValueError, match="differ by up to"):
        check_norms("smollm2-135m", np.array([1.0, np.nan, 3.0]), stored)


def test_a_reference_model_refuses_its_own_positions_settings(monkeypatch):
    """The reference set's positions are protocol 3's: drawing others is refused before any work
    (a stand-in named smollm2-135m: nothing runs a forward)."""
    import geolens
    import geolens.faithfulness.evaluation as evaluation

    stand_in = object()
    monkeypatch.setattr(evaluation, "resolve_model", lambda model, backend: (model, "smollm2-135m"))
    monkeypatch.setattr(evaluation, "model_mode", lambda model: "bridge")
    for kwargs in ({"n_positions": 1}, {"queries": (8, 60)}):
        with pytest.raises(ValueError, match="reference set has its own positions"):
            geolens.evaluate_attribution("contribution", stand_in, **kwargs)


PUBLISHED_FORWARD = ("raw_attention", "output_normalized_intra", "output_normalized_inter", "contribution")


@pytest.mark.slow
@pytest.mark.parametrize("model_name", MODELS)
def test_scoring_against_the_reference_set_reproduces_the_published_family(model_name):
    """The published metrics scored against the reference set (forward passes only) give protocol
    3's published per-metric means, intervals, and every pair of its Holm family with its verdict.
    The metrics a forward cannot give (gradient × activation, the protocol's seeded random scores)
    come from the published table."""
    import geolens
    from geolens.faithfulness.norm_controlled import norm_controlled_summary
    from geolens.models import load_model

    model = load_model(model_name)
    results = geolens.evaluate_attribution(list(PUBLISHED_FORWARD), model, n_boot=10_000, seed=0, progress=False)
    terms, positions = _published(model_name)
    rebuilt = terms.copy()
    for r in results:
        assert r.settings["effects"].startswith(f"the {model_name} reference set")
        assert r.settings["n_positions"] == len(positions) and r.settings["n_terms"] == len(terms)
        # each method's scores equal the published ones to float64 rounding (the thread count orders sums)
        assert np.allclose(r.terms.score.to_numpy(), terms[r.method].to_numpy(), rtol=1e-9, atol=1e-15), r.method
        rebuilt[r.method] = r.terms.score.to_numpy()
    settings = dict(json.loads((PUBLISHED / "protocol.json").read_text()), n_layers=int(model.cfg.n_layers))
    mine = norm_controlled_summary(rebuilt, positions, settings)["norm_controlled"]
    summary = json.loads((PUBLISHED / model_name / "summary.json").read_text())["per_term_effects"]["norm_controlled"]
    for got, want in zip(mine["metrics"], summary["metrics"]):
        assert got["metric"] == want["metric"]
        for key in ("mean", "ci_low", "ci_high"):
            assert got[key] == pytest.approx(want[key], abs=1e-9), (got["metric"], key)
    for got, want in zip(mine["pairs"], summary["pairs"]):
        assert (got["a"], got["b"], got["verdict"], got["rank"]) == (
            want["a"],
            want["b"],
            want["verdict"],
            want["rank"],
        )
        assert got["estimate"] == pytest.approx(want["estimate"], abs=1e-9)
    assert mine["claimed_order_beyond_norm"] == summary["claimed_order_beyond_norm"]
    # the evaluation's own rows: the method's mean partial is the published metric's
    published = {m["metric"]: m for m in summary["metrics"]}
    for r in results:
        assert r.partial == pytest.approx(published[r.method]["mean"], abs=1e-9)
        assert r.row(metric="raw_attention")["mean"] == pytest.approx(published["raw_attention"]["mean"], abs=1e-12)


@pytest.mark.slow
@pytest.mark.tl2_slow
def test_either_transformerlens_scores_the_reference_set_alike():
    """The first 3 documents scored against the SmolLM2 set: the bridge (TransformerLens 4.x) or the
    HookedTransformer of the same checkpoint (2.x, its RMS norms folded into the weights in float32,
    norms within 3.1e-6 of the set's: accepted) give the published mean partial of |c| over those
    positions, within 1e-6."""
    from conftest import HAS_BRIDGE

    import geolens
    from geolens.faithfulness.norm_controlled import position_statistics
    from geolens.models import converted_checkpoint, hooked_llama_from_checkpoint, load_model

    if HAS_BRIDGE:
        model = load_model("smollm2-135m")
    else:
        model, _ = hooked_llama_from_checkpoint(str(converted_checkpoint("smollm2-135m")))
        object.__setattr__(model, "geolens_name", "smollm2-135m")
    result = geolens.evaluate_attribution("contribution_abs", model, n_documents=3, n_boot=100, progress=False)
    terms, positions = _published("smollm2-135m")
    published = [
        position_statistics(terms[(terms.document == p.document) & (terms.position == p.position)], float(p.floor))[
            "norm_controlled"
        ]["contribution_abs"]
        for p in positions[positions.document < 3].itertuples()
    ]
    assert result.settings["effects"].startswith("the smollm2-135m reference set")
    assert result.partial == pytest.approx(float(np.mean(published)), abs=1e-6)
