"""The text ``geolens sinks`` prints (geolens.pipelines.sinks_text), from hand-built summaries and
results: the corpus pass's headline, the sink-intervention controls and the dose-matched controls,
every number in its place and no None or nan for a pair that has no interval."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd

from geolens.pipelines.sinks_text import controls_text, dose_header, dose_text, sinks_text

NO_NONE = re.compile(r"\bNone\b|\bnan\b")


def test_sinks_text_gives_the_headline_numbers_and_the_drift_table():
    summary = dict(
        seconds=3.2,
        gu_sink_rate=0.8125,
        mean_sink_rate=0.4567,
        proj_norm_ratio_median=0.1234,
        value_norm_ratio_median=0.5678,
        proj_cos_tail_mean=-0.25,
        share_heads_proj_cos_tail_negative=0.75,
        norm_curve=dict(head_share_convex_argmin_inside=0.5, head_n_fitted=8),
    )
    lines = sinks_text(summary, Path("runs/sinks"), eps=0.3).splitlines()
    assert lines == [
        "wrote runs/sinks/ in 3.2 s",
        "Gu et al. sink rate (ε=0.3): 0.812; mean α_i0 0.457",
        "median ‖ṽ_0‖/‖ṽ_j‖ 0.123, ‖v_0‖/‖v_j‖ 0.568",
        "mean cos(ṽ_0, ṽ_j) -0.250; heads with negative mean: 75%",
        "norm curve: convex with argmin in (0,1) for 50% of 8 heads",
    ]
    drift = SimpleNamespace(summary=pd.DataFrame([dict(layer=0, drift=0.123456789)]))
    with_drift = sinks_text(summary, Path("runs/sinks"), eps=0.3, drift=drift).splitlines()
    assert with_drift[:5] == lines and with_drift[5].split() == ["layer", "drift"]
    assert with_drift[6].split() == ["0", "0.1235"]


def test_controls_text_shows_the_all_layers_edits_and_the_scopes():
    conditions = pd.DataFrame(
        [
            dict(scope="all", edit="zero", delta_ppl=1.5, delta_ppl_lo=1.0, delta_ppl_hi=2.0, out_norm_ratio=0.9)
            | dict(delta_cos=-0.01, extra=7),
            dict(scope="layer 0", edit="zero", delta_ppl=9.0, delta_ppl_lo=8.0, delta_ppl_hi=10.0, out_norm_ratio=0.5)
            | dict(delta_cos=-0.2, extra=7),
        ]
    )
    scopes = pd.DataFrame([dict(scope="all", claim="holds"), dict(scope="layer 0", claim="does not hold")])
    res = SimpleNamespace(n_windows=4, seq_len=32, clean_ppl=12.3456, conditions=conditions, scopes=scopes)
    lines = controls_text(res).splitlines()
    assert lines[0] == "sink controls: 4 windows × 32 tokens, clean PPL 12.346"
    assert lines[1].split() == ["edit", "delta_ppl", "delta_ppl_lo", "delta_ppl_hi", "out_norm_ratio", "delta_cos"]
    assert lines[2].split() == ["zero", "1.5", "1", "2", "0.9", "-0.01"]  # the all-layers row only
    assert lines[3].split() == ["scope", "claim"]  # layer 0's edit is not in the table
    assert lines[4].split() == ["all", "holds"] and lines[5].split() == ["layer", "0", "does", "not", "hold"]
    no_all = SimpleNamespace(**{**vars(res), "conditions": conditions[conditions.scope != "all"]})
    assert controls_text(no_all).splitlines()[1].split() == ["scope", "claim"]  # no empty table


def test_dose_header_names_the_protocol_the_sample_and_each_difference():
    info = dict(protocol_version=2, protocol_file="docs/sinks/protocol.json", protocol_sha256="0123456789abcdef" * 4)
    tokens = np.zeros((6, 64), dtype=int)
    documents = np.array([0, 0, 1, 2, 2, 2])
    registration = dict(status="exploratory", reasons=["model tiny-gqa", "6 windows, not 200"])
    text = dose_header(info, tokens, documents, registration, threads=2)
    assert text.splitlines() == [
        "dose-matched sink controls, protocol v2 (docs/sinks/protocol.json, sha256 0123456789ab…): 6 windows of 64 "
        "tokens from 3 documents; exploratory; torch threads 2",
        "  differs: model tiny-gqa",
        "  differs: 6 windows, not 200",
    ]


def test_dose_text_gives_each_pair_its_interval_or_its_label():
    row = dict(scope="all", edit="rotate", lam=0.5, degrees=30.0, dose=0.25, n_seeds=3)
    row |= dict(delta_ppl=0.5, delta_ppl_low=0.25, delta_ppl_high=0.75, kl=0.01, kl_low=0.005, kl_high=0.02, other=1)
    res = SimpleNamespace(dose_response=pd.DataFrame([row]))
    decided = dict(scope="all", statistic="ΔKL(zero − rotate)", estimate=0.0123, ci_low=0.001, ci_high=0.0234)
    decided |= dict(level=0.025, p=0.0012, p_adj=0.0036, verdict="holds", outcome="kl")
    undecided = dict(decided, scope="layer 1", verdict=None)  # an exploratory run withholds it
    ppl = dict(scope="all", statistic="ΔPPL slope", estimate=None, ci_low=None, verdict=None, outcome="ppl")
    summary = dict(pairs=[decided, undecided], exploratory_pairs=[ppl], label="exploratory")
    lines = dose_text(res, summary).splitlines()
    columns = "scope edit lam degrees dose n_seeds delta_ppl delta_ppl_low delta_ppl_high kl kl_low kl_high"
    assert lines[0].split() == columns.split()
    assert lines[1].split() == [
        "all",
        "rotate",
        "0.5",
        "30",
        "0.25",
        "3",
        "0.5",
        "0.25",
        "0.75",
        "0.01",
        "0.005",
        "0.02",
    ]
    assert lines[2:] == [
        "all: ΔKL(zero − rotate) +0.0123 [+0.001, +0.0234] at 0.0250, p 0.0012, p_adj 0.0036: holds",
        "layer 1: ΔKL(zero − rotate) +0.0123 [+0.001, +0.0234] at 0.0250, p 0.0012, p_adj 0.0036: exploratory",
        "all: ΔPPL slope: exploratory",
    ]
    assert not NO_NONE.search("\n".join(lines))
