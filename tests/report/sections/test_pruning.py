"""The report's pruning section (geolens.report.sections.pruning): its claim (regime order below the
random orders) follows its own curves table."""

from __future__ import annotations

import pytest


def test_the_pruning_claim_follows_its_table(tiny_report):
    _, report, _ = tiny_report
    sections = {s.key: s for s in report.sections}
    assert "pruning" in sections  # the quick tiny report builds every section
    df = sections["pruning"].numbers["curves"]
    mean = df.groupby("order").delta_ppl.mean()
    random_mean = mean[[o for o in mean.index if o.startswith("random")]].mean()
    [claim] = sections["pruning"].claims
    assert claim.holds == (mean["regime"] < random_mean)
    assert claim.numbers["regime"] == pytest.approx(mean["regime"])
