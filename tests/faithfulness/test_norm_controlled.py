"""Protocol 3's per-term endpoint (docs/faithfulness/v3/PROTOCOL.md, geolens.faithfulness.norm_controlled):
the partial Spearman statistic against an explicit loop, float64 effects against full forwards,
the summary's fields, and an edited protocol running as exploratory."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from geolens.faithfulness.norm_controlled import (
    norm_controlled_document,
    norm_controlled_summary,
    partial_spearman,
    position_statistics,
)
from geolens.per_term import float64_exact, per_term_effects
from geolens.testing import tiny_bridge, tiny_tokens

pytestmark = pytest.mark.bridge_only  # float64_exact is about the TL 4.x bridge's softmax; built on tiny bridges

V3 = Path(__file__).parents[2] / "docs" / "faithfulness" / "v3"


def _loop_ranks(x: list[float]) -> list[float]:
    """Average ranks (1-based) by an explicit double loop."""
    out = []
    for a in x:
        below = sum(1 for b in x if b < a)
        equal = sum(1 for b in x if b == a)
        out.append(below + (equal + 1) / 2.0)
    return out


def _loop_pearson(a: list[float], b: list[float]) -> float:
    n = len(a)
    ma, mb = sum(a) / n, sum(b) / n
    num = sum((x - ma) * (y - mb) for x, y in zip(a, b))
    da = sum((x - ma) ** 2 for x in a) ** 0.5
    db = sum((y - mb) ** 2 for y in b) ** 0.5
    return num / (da * db)


def _loop_partial(s, e, n) -> float:
    rs, re_, rn = _loop_ranks(list(s)), _loop_ranks(list(e)), _loop_ranks(list(n))
    r_se, r_sn, r_en = _loop_pearson(rs, re_), _loop_pearson(rs, rn), _loop_pearson(re_, rn)
    return (r_se - r_sn * r_en) / ((1 - r_sn**2) * (1 - r_en**2)) ** 0.5


@pytest.mark.parametrize("seed", range(6))
def test_partial_spearman_equals_an_explicit_float64_loop(seed):
    rng = np.random.default_rng(seed)
    n = rng.lognormal(size=40)
    e = n**2 * rng.lognormal(0, 0.5, 40)
    s = rng.normal(size=40) + (np.round(n, 1) if seed % 2 else 0)  # ties on odd seeds
    s[:4] = s[0]  # more ties
    assert partial_spearman(s, e, n) == pytest.approx(_loop_partial(s, e, n), abs=1e-12)


def test_partial_spearman_is_zero_for_the_norm_and_nan_when_undefined():
    rng = np.random.default_rng(0)
    n, e = rng.lognormal(size=30), rng.lognormal(size=30)
    assert partial_spearman(n, e, n) == 0.0  # value-weighted is the norm
    assert partial_spearman(3 * n, e, n) == 0.0  # output-normalised inter: the norm over one ||o_i||
    assert partial_spearman(np.ones(30), e, n) == 0.0  # ranks nothing
    assert np.isnan(partial_spearman(e, n**2, n))  # effects rank as the norm: undefined
    assert np.isnan(partial_spearman(e, np.ones(30), n))


@pytest.fixture(scope="module")
def tiny_run():
    model = tiny_bridge("gqa").to(torch.float64)
    tokens = tiny_tokens(
        model, ("the cat sat on the mat.", "a dog ran far away!!", "seven wizards judge boxing"), length=24
    )
    parts = []
    with float64_exact(model):
        for d in range(3):
            parts.append(norm_controlled_document(model, tokens[d : d + 1], d, n_positions=2, queries=(8, 22)))
    terms = pd.concat([p[0] for p in parts], ignore_index=True)
    positions = pd.concat([p[1] for p in parts], ignore_index=True)
    return model, tokens, terms, positions


def test_document_tables_hold_every_term_and_the_floors(tiny_run):
    model, tokens, terms, positions = tiny_run
    assert len(positions) == 6 and (positions.floor > 0).all() and (positions.floor < 1e-12).all()
    for _, p in positions.iterrows():
        part = terms[(terms.document == p.document) & (terms.position == p.position)]
        assert len(part) == p.n_terms == model.cfg.n_heads * (p.query + 1)
        assert p.next_token == int(tokens[int(p.document), int(p.query) + 1])
    assert {"kl", "delta_logp_next", "norm", "head", "source", "layer", "query"} <= set(terms.columns)
    stats = position_statistics(terms[terms.position == 0].iloc[: model.cfg.n_heads * 9], 1e-16)
    assert stats["norm_controlled"]["value_weighted"] == 0.0


def test_summary_fields(tiny_run):
    _, _, terms, positions = tiny_run
    settings = json.loads((V3 / "protocol.json").read_text())
    settings["statistics"]["n_boot"] = 200
    part = norm_controlled_summary(terms, positions, settings)
    assert part["effects_dtype"] == "float64"
    nc = part["norm_controlled"]
    assert len(nc["pairs"]) == 9 and all("p_adj" in p and "verdict" in p for p in nc["pairs"])
    assert {m["metric"]: m["mean"] for m in nc["metrics"]}["value_weighted"] == 0.0
    assert nc["not_testable"][0]["verdict"] == "not testable"
    for key in ("per_layer", "resolvable", "signed", "plain", "strata", "top_decile", "numerical_floor"):
        assert key in part, key
    assert part["numerical_floor"]["kl_floor_max"] < 1e-12


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
