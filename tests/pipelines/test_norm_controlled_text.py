"""Protocol 3's per-term endpoint in words (geolens.pipelines.norm_controlled_text), from a
hand-built ``per_term_effects``: the printed lines and the README section put each metric's mean
partial ρ and interval in its row (sorted by the mean), sort the metrics into the right sentence by
where their interval lies, and keep a tiny non-zero bound readable."""

from __future__ import annotations

import re

from geolens.faithfulness.ground_truth import TERM_METRICS
from geolens.pipelines.norm_controlled_text import norm_controlled_markdown, norm_controlled_text


def _m(metric: str, mean: float, low: float, high: float, n: int = 40) -> dict:
    return dict(metric=metric, mean=mean, ci_low=low, ci_high=high, n_positions=n)


METRICS = [
    _m("raw_attention", -0.05, -0.09, -0.01),
    _m("contribution", 0.21, 0.15, 0.27),
    _m("value_weighted", 0.0, 0.0, 0.0),
    _m("random", 0.01, -0.02, 0.04),
]
PAIRS = [
    dict(a="raw_attention", b="contribution", estimate=0.26, ci_low=0.18, ci_high=0.33, p_adj=0.0012, verdict="holds"),
    dict(a="raw_attention", b="random", estimate=0.06, ci_low=-0.00004, ci_high=0.0001, p_adj=0.5, verdict="tie"),
    dict(a="contribution", b="contribution_abs", estimate=-0.1, ci_low=None, ci_high=None, verdict="reversed"),
]


def _part() -> dict:
    groups = [
        dict(group=g, metric=m, mean=mean, ci_low=mean - 0.1, ci_high=mean + 0.1, n_positions=n)
        for g, n in (("layers 0-1", 12), ("layers 2-3", 14))
        for m, mean in (("raw_attention", -0.2), ("contribution", 0.3))
    ] + [dict(group="layer 0", metric="contribution", mean=9.0, ci_low=8.0, ci_high=10.0, n_positions=6)]
    return dict(
        n_positions=40,
        n_documents=10,
        n_terms=1234,
        norm_controlled=dict(
            metrics=METRICS,
            pairs=PAIRS,
            n_boot=500,
            claimed_order_beyond_norm="not supported",
            not_testable=[dict(a="value_weighted", b="output_normalized_inter", why="both 0 by construction")],
        ),
        plain=dict(metrics=[_m("contribution", 0.55, 0.5, 0.6)]),
        numerical_floor=dict(kl_floor_median=1.23e-9, kl_floor_max=4.5e-8, kl_min_median=2e-6, kl_max_median=0.5),
        resolvable=dict(
            share_of_terms=0.875, n_terms=1234, factor=10.0, partial=dict(metrics=[_m("random", 0.02, -0.01, 0.05, 30)])
        ),
        strata=dict(metrics=[_m("contribution", 0.4, 0.3, 0.5, 38)]),
        top_decile=dict(partial=dict(metrics=[])),
        signed=dict(
            partial=dict(metrics=[]), magnitude=dict(partial=dict(metrics=[_m("grad_x_act", -0.3, -0.4, -0.2)]))
        ),
        per_layer=dict(groups=groups),
    )


def _row(text: str, start: str) -> str:
    [row] = [line for line in text.splitlines() if line.startswith(start)]
    return row


def test_the_printed_lines_sort_the_metrics_by_their_mean_and_list_the_pairs():
    lines = norm_controlled_text(_part()).splitlines()
    assert lines[0].startswith("per-term endpoint, protocol 3 (40 positions, 10 documents, 1234 terms; float64)")
    assert [line.split()[0] for line in lines[1:5]] == ["contribution", "random", "value_weighted", "raw_attention"]
    assert lines[1].split() == ["contribution", "+0.210", "[+0.150,", "+0.270]"]
    assert lines[5] == "pairs (one Holm family):"
    assert lines[6] == "  raw_attention -> contribution: +0.260 [+0.180, +0.330]  holds"
    assert lines[8] == "  contribution -> contribution_abs: -0.100  reversed"  # no interval, no None
    assert not re.search(r"\bNone\b|\bnan\b", "\n".join(lines))


def test_the_readme_section_puts_each_number_in_its_row():
    text = norm_controlled_markdown(dict(per_term_effects=_part()))
    assert text.startswith("## Per-term endpoint, controlled for the norm (protocol 3)\n")
    assert "40 (layer, query) positions of 10 documents, 1234 attention terms" in text and "(B = 500)" in text
    assert (
        "In words (per-metric 95 % intervals, before any correction): predict the KL beyond the norm (interval above "
        "0): contribution; rank against it once the norm is fixed (interval below 0): raw_attention; cannot be told "
        "from 0: random; 0 by construction: value_weighted." in text
    )
    assert (
        _row(text, "| contribution | +0.210")
        == "| contribution | +0.210 | [+0.150, +0.270] | +0.550 [+0.500, +0.600] |"
    )
    assert _row(text, "| random | +0.010") == "| random | +0.010 | [-0.020, +0.040] | – |"  # no plain ρ
    assert "beyond the norm: **not supported**." in text
    assert (
        _row(text, "| raw_attention → contribution")
        == "| raw_attention → contribution | +0.260 | [+0.180, +0.330] | 0.0012 | holds |"
    )
    # an interval bound that rounds to ±0.000 but is not 0 keeps two significant digits
    tiny_bound = _row(text, "| raw_attention → random")
    assert tiny_bound == "| raw_attention → random | +0.060 | [-4e-05, +0.0001] | 0.5 | tie |"
    assert (
        _row(text, "| contribution → contribution_abs")
        == "| contribution → contribution_abs | -0.100 | – | – | reversed |"
    )
    assert _row(text, "| value_weighted → output_normalized_inter") == (
        "| value_weighted → output_normalized_inter | – | – | – | not testable (both 0 by construction) |"
    )
    assert (
        "median 1.2e-09 nats (max 4.5e-08); the smallest effect of a position has median 2e-06, the largest 0.5."
        in text
    )
    assert "87.5 % of the 1234 terms are resolvable (KL ≥ 10 × floor)." in text
    assert not re.search(r"\bNone\b|\bnan\b", text)


def _table(text: str, header: str) -> dict[str, str]:
    """The rows of the table under ``header``, by their first cell."""
    lines = text[text.index(header) :].splitlines()[2:]
    rows = lines[: next((i for i, line in enumerate(lines) if not line.startswith("|")), len(lines))]
    return {row.split(" | ")[0].removeprefix("| "): row for row in rows}


def test_the_exploratory_tables_have_a_row_per_metric_and_a_dash_where_none_was_run():
    text = norm_controlled_markdown(dict(per_term_effects=_part()))
    table = _table(text, "| metric | strata ρ | resolvable partial | top-decile partial |")
    assert list(table) == list(TERM_METRICS)
    assert table["contribution"] == "| contribution | +0.400 [+0.300, +0.500] (n=38) | – | – | – | – |"
    assert table["grad_x_act"] == "| grad_x_act | – | – | – | – | -0.300 [-0.400, -0.200] (n=40) |"
    assert table["random"] == "| random | – | +0.020 [-0.010, +0.050] (n=30) | – | – | – |"
    # per third of the stack: the "layers …" groups only, each column with its n
    thirds = _table(text, "| metric | layers 0-1 (n=12) | layers 2-3 (n=14) |")
    assert list(thirds) == list(TERM_METRICS)
    assert thirds["contribution"] == "| contribution | +0.300 [+0.200, +0.400] | +0.300 [+0.200, +0.400] |"
    assert thirds["raw_attention"] == "| raw_attention | -0.200 [-0.300, -0.100] | -0.200 [-0.300, -0.100] |"
    assert thirds["value_weighted"] == "| value_weighted | – | – |"
    assert "+9.000" not in text  # the single layer's group stays in summary.json
