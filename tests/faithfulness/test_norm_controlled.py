"""Protocol 3's per-term endpoint (docs/faithfulness/v3/PROTOCOL.md, geolens.faithfulness.norm_controlled):
a document's tables (every term, the floors), an edited protocol running as exploratory and
resuming, and (slow tier) stored terms recomputed with the naive float64 path. The statistics:
test_norm_controlled_stats.py; the summary: test_norm_controlled_summary.py; float64_exact:
tests/per_term/test_exact.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from geolens.faithfulness.norm_controlled import (
    position_statistics,
)
from geolens.per_term import float64_exact, per_term_effects

pytestmark = pytest.mark.bridge_only  # float64_exact is about the TL 4.x bridge's softmax; built on tiny bridges

V3 = Path(__file__).parents[2] / "docs" / "faithfulness" / "v3"


@pytest.fixture
def corpus(tmp_path):
    words = "the quick brown fox jumps over the lazy dog while seven wizards quietly judge boxing matches".split()
    docs = [" ".join(words[(k * d) % len(words)] for k in range(400)) for d in (1, 2)]
    path = tmp_path / "docs.txt"
    path.write_text("\n\n".join(docs))
    return str(path)


def test_an_edited_v3_protocol_runs_exploratory_and_resumes(tmp_path, corpus, capsys):
    from geolens.cli import main

    folder = tmp_path / "protocol"
    folder.mkdir()
    for name in ("PROTOCOL.md", "protocol.json", "REGISTERED.json"):
        shutil.copy(V3 / name, folder / name)
    spec = json.loads((folder / "protocol.json").read_text())
    spec["data"].update(n_documents=1, models=spec["data"]["models"] + ["tiny-gqa"], scored_positions=[8, 20])
    spec["primary"]["positions_per_document"] = {"tiny-gqa": 1}
    spec["statistics"]["n_boot"] = 100
    (folder / "protocol.json").write_text(json.dumps(spec))
    out = tmp_path / "run"
    args = ["faithfulness", "--protocol", str(folder / "protocol.json"), "--model", "tiny-gqa", "--corpus", corpus]
    args += ["--stage", "per_term", "--out", str(out)]
    assert main(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["label"] == "exploratory" and summary["protocol_version"] == 3
    assert any("protocol.json was edited" in r for r in summary["preregistration"]["reasons"])
    part = summary["per_term_effects"]
    assert part["effects_dtype"] == "float64" and part["n_positions"] == 1
    assert all(p["verdict"] in ("not decided (exploratory)", "not testable") for p in part["norm_controlled"]["pairs"])
    assert (out / "per_term_terms.csv.gz").is_file() and (out / "per_term_positions.csv.gz").is_file()
    readme = (out / "README.md").read_text()
    assert "controlled for the norm" in readme and "Exploratory run" in readme
    assert main(args + ["--resume"]) == 0
    assert "resuming after 1 documents" in capsys.readouterr().out
    assert main(args[:-4] + ["--stage", "masking", "--out", str(tmp_path / "other")]) == 2


@pytest.mark.slow
@pytest.mark.parametrize("model_name", ["smollm2-135m", "gemma3-270m"])
def test_stored_terms_recompute_with_the_naive_float64_path(model_name):
    """A sample of the stored terms of a protocol-3 run, recomputed by a full float64 forward per term."""
    folder = V3 / model_name
    path = folder / "per_term_terms.csv.gz"
    if not path.is_file():
        pytest.skip(f"{path} is absent (the run has not been made)")
    import geolens
    from geolens.data import load_corpus
    from geolens.faithfulness.preregistered import protocol_windows
    from geolens.preregistration import load_protocol

    terms = pd.read_csv(path)
    positions = pd.read_csv(folder / "per_term_positions.csv.gz")
    model = geolens.load_model(model_name).to(torch.float64)
    windows, _ = protocol_windows(model, load_protocol(V3 / "protocol.json"), load_corpus("lee"), n_documents=2)
    first = positions[positions.document < 2].iloc[0]
    part = terms[(terms.document == first.document) & (terms.position == first.position)]
    sample = part.sort_values("kl").iloc[np.linspace(0, len(part) - 1, 6).astype(int)]
    pairs = [(int(h), int(j)) for h, j in zip(sample["head"], sample["source"])]
    with float64_exact(model):
        naive = per_term_effects(
            model,
            windows[int(first.document) : int(first.document) + 1],
            int(first.layer),
            int(first.query),
            method="naive",
            terms=pairs,
            outcome=("kl",),
        )
    for (h, j), stored in zip(pairs, sample.kl):
        assert float(naive.kl[h, j]) == pytest.approx(stored, rel=1e-6, abs=100 * float(first.floor))


def test_document_tables_hold_every_term_and_the_floors(norm_controlled_run):
    model, tokens, terms, positions = norm_controlled_run
    assert len(positions) == 6 and (positions.floor > 0).all() and (positions.floor < 1e-12).all()
    for _, p in positions.iterrows():
        part = terms[(terms.document == p.document) & (terms.position == p.position)]
        assert len(part) == p.n_terms == model.cfg.n_heads * (p.query + 1)
        assert p.next_token == int(tokens[int(p.document), int(p.query) + 1])
    assert {"kl", "delta_logp_next", "norm", "head", "source", "layer", "query"} <= set(terms.columns)
    stats = position_statistics(terms[terms.position == 0].iloc[: model.cfg.n_heads * 9], 1e-16)
    assert stats["norm_controlled"]["value_weighted"] == 0.0
