"""Paper claims, the samples behind them, and when a claim may read "holds".

A topic pipeline (:mod:`geolens.pipelines`) states each claim of the source papers next to what
its run measured, as a :class:`Claim`; the report (:mod:`geolens.report`) only shows them. This
module sits below both, so that no pipeline imports the report.

**The verdict rule.** A claim reads ``holds`` or ``does not hold`` only when both are true:

1. its criterion was decided by confidence intervals (``ci=True``: the intervals of
   :mod:`geolens.stats`, e.g. :func:`geolens.stats.verdict` or :func:`geolens.stats.holm_family`),
   not by comparing point estimates;
2. its sample reaches the claim's minimum (:func:`sample_size`'s ``minimum``):
   :data:`PROTOCOL_MIN_DOCUMENTS` documents for the faithfulness claims (the minimum that
   ``docs/faithfulness/protocol.json`` fixes), :data:`MIN_WINDOWS` windows for every other claim
   (below that a percentile interval over windows is too unstable to decide on), and at least two
   seeds when the claim compares with random orders; a run whose settings differ from its
   pre-registered protocol (exploratory) decides none of that protocol's claims.

Otherwise the claim is ``indicative``, shown with its sample, e.g. ``indicative (n = 8 corpus
windows)``, whatever its numbers say; ``descriptive`` when the paper gives no criterion, and
``undecided`` when the intervals were computed on enough data but could not decide (e.g. a failed
range check). The same rule gives the verdict column of a table of paired comparisons
(:func:`table_verdict`).

>>> c = Claim("X is small", "paper B", "x = 0.1", holds=True, criterion="x < 0.5", numbers={"sample": sample_size(8)})
>>> c.verdict, c.decision
('indicative (n = 8 corpus windows)', 'indicative')
>>> Claim("X is small", "paper B", "x = 0.1 [0.05, 0.2]", holds=True, criterion="95% CI below 0.5",
...       numbers={"sample": sample_size(64)}, ci=True).verdict
'holds (n = 64 corpus windows)'
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

MIN_WINDOWS = 20
"""The fewest windows (or documents) on which a claim other than faithfulness may be decided."""

PROTOCOL_MIN_DOCUMENTS = 100
"""The fewest documents on which a faithfulness claim may be decided (``docs/faithfulness/protocol.json``,
``primary.min_documents`` and ``data.n_documents``; a test keeps the two equal)."""

Decision = Literal["holds", "does not hold", "undecided", "indicative", "descriptive"]
DECISIONS: tuple[str, ...] = ("holds", "does not hold", "undecided", "indicative", "descriptive")


def sample_size(
    n_windows: int,
    *,
    windows: str = "corpus windows",
    n_seeds: int | None = None,
    minimum: int = MIN_WINDOWS,
    exploratory: bool = False,
) -> dict:
    """What a verdict rests on, as a JSON-ready dict.

    ``n_windows`` units of kind ``windows`` (e.g. "corpus windows", "documents"), ``n_seeds``
    (None when no random order is involved) and ``low_power``: fewer than ``minimum`` units, a
    single seed, or an ``exploratory`` run (its settings differ from its pre-registered protocol,
    whose claims it may not decide), with its reason.

    >>> s = sample_size(8)
    >>> s["low_power"], s["low_power_reason"]
    (True, '8 < 20 corpus windows')
    >>> sample_size(150, windows="documents", minimum=PROTOCOL_MIN_DOCUMENTS)["low_power"]
    False
    >>> sample_size(150, windows="documents", minimum=PROTOCOL_MIN_DOCUMENTS, exploratory=True)["low_power_reason"]
    'exploratory run: settings differ from the protocol'
    """
    if int(n_windows) < 0 or (n_seeds is not None and int(n_seeds) < 1) or int(minimum) < 1:
        raise ValueError(
            f"a sample needs n_windows ≥ 0, n_seeds ≥ 1 (or None) and minimum ≥ 1, got {n_windows}, {n_seeds} and {minimum}"
        )
    reasons = []
    if int(n_windows) < int(minimum):
        reasons.append(f"{int(n_windows)} < {int(minimum)} {windows}")
    if n_seeds is not None and int(n_seeds) < 2:
        reasons.append("one seed")
    if exploratory:
        reasons.append("exploratory run: settings differ from the protocol")
    return {
        "n_windows": int(n_windows),
        "windows": windows,
        "n_seeds": None if n_seeds is None else int(n_seeds),
        "minimum": int(minimum),
        "low_power": bool(reasons),
        "low_power_reason": "; ".join(reasons),
    }


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and the noun, singular for 1 and plural otherwise (``noun + "s"`` unless ``plural``):
    the one way figures and report text count sequences, windows, documents, heads, tokens, ...

    >>> counted(1, "sequence"), counted(3, "window"), counted(0, "query", "queries")
    ('1 sequence', '3 windows', '0 queries')
    """
    n = int(n)
    return f"{n} {noun if n == 1 else (plural or noun + 's')}"


def describe_sample(sample: dict) -> str:
    """``"n = 64 held-out windows, 3 seeds"``.

    >>> describe_sample(sample_size(8))
    'n = 8 corpus windows'
    """
    text = f"n = {sample['n_windows']} {sample.get('windows', 'windows')}"
    if sample.get("n_seeds") is not None:
        text += f", {sample['n_seeds']} seed{'s' if sample['n_seeds'] != 1 else ''}"
    return text


def table_verdict(verdict: str | None, sample: dict, *, decided: bool = True) -> str:
    """The verdict cell of a table of paired comparisons, under the same rule as a claim: the
    interval's verdict (holds / reversed / tie, from :mod:`geolens.stats`) only when the run may
    decide (``decided``: False for an exploratory run) and ``sample`` reaches its minimum;
    "not testable" as it is (the pair differs by nothing); otherwise ``indicative (n = …)``.

    >>> table_verdict("holds", sample_size(8))
    'indicative (n = 8 corpus windows)'
    >>> table_verdict("reversed", sample_size(150, windows="documents", minimum=PROTOCOL_MIN_DOCUMENTS))
    'reversed'
    >>> table_verdict("holds", sample_size(150), decided=False), table_verdict("not testable", sample_size(8))
    ('indicative (n = 150 corpus windows)', 'not testable')
    """
    if verdict == "not testable":
        return verdict
    if not decided or verdict is None or sample["low_power"]:
        return f"indicative ({describe_sample(sample)})"
    return str(verdict)


_NUMBER = r"[+\-−]?(?:\d+\.?\d*|\.\d+)(?:[eE][+\-]?\d+)?%?"
_INTERVAL = re.compile(rf"\[({_NUMBER}), ({_NUMBER})\]")


def estimate_text(value: float, low: float | None, high: float | None, n: int, *, fmt: str = "+.3f") -> str:
    """A value with its interval, ``+0.120 [+0.050, +0.200]``, or without one when it would say
    nothing: ``n = 1, no interval`` below two units (one window gives a zero-width bootstrap
    interval), ``no interval`` when none was computed, and ``interval of zero width`` when both
    ends print the same. No zero-width interval is ever printed.

    >>> estimate_text(0.12, 0.05, 0.2, 8)
    '+0.120 [+0.050, +0.200]'
    >>> estimate_text(0.214, 0.214, 0.214, 1)
    '+0.214 (n = 1, no interval)'
    >>> estimate_text(0.5, 0.50001, 0.49999, 8, fmt=".2f"), estimate_text(3.0, None, None, 8, fmt=".1f")
    ('0.50 (interval of zero width)', '3.0 (no interval)')
    """
    text = format(value, fmt)
    if int(n) < 2:
        return f"{text} (n = {int(n)}, no interval)"
    if low is None or high is None:
        return f"{text} (no interval)"
    lo, hi = format(low, fmt), format(high, fmt)
    if lo == hi:
        return f"{text} (interval of zero width)"
    return f"{text} [{lo}, {hi}]"


def without_empty_intervals(text: str, n: int) -> str:
    """``text`` (a claim's measured numbers) with every interval ``[a, b]`` that says nothing taken
    out: all of them when the sample has fewer than two units (``n = 1, no interval``), otherwise
    those whose two ends print the same.

    >>> without_empty_intervals("Δ = +0.214 [+0.214, +0.214]; x = 1 [0, 2]", 1)
    'Δ = +0.214 (n = 1, no interval); x = 1 (n = 1, no interval)'
    >>> without_empty_intervals("Δ = +0.214 [+0.214, +0.214]; x = 1 [0, 2]", 8)
    'Δ = +0.214 (interval of zero width); x = 1 [0, 2]'
    """
    if not isinstance(text, str):
        return text

    def replace(m: re.Match) -> str:
        if int(n) < 2:
            return f"(n = {int(n)}, no interval)"
        return "(interval of zero width)" if m.group(1) == m.group(2) else m.group(0)

    return _INTERVAL.sub(replace, text)


@dataclass
class Claim:
    """A paper claim next to what this run measured.

    ``holds`` is the outcome of ``criterion`` on this run's numbers (``None`` when the paper gives
    no criterion, or when the intervals could not decide); ``ci`` says whether that outcome was
    decided by confidence intervals; ``numbers`` are the values behind ``measured``, with the
    sample under ``numbers["sample"]`` (:func:`sample_size`). What the claim *reads* follows the
    verdict rule of the module docstring: :attr:`decision` and :attr:`verdict`.
    """

    claim: str
    source: str
    measured: str
    holds: bool | None
    criterion: str
    numbers: dict[str, Any] = field(default_factory=dict)
    ci: bool = False

    @property
    def sample(self) -> dict | None:
        return self.numbers.get("sample")

    @property
    def decision(self) -> Decision:
        """holds / does not hold / undecided / indicative / descriptive (the module's rule)."""
        if self.holds is None and not self.ci:
            return "descriptive"
        if not self.ci or self.sample is None or self.sample["low_power"]:
            return "indicative"
        if self.holds is None:
            return "undecided"
        return "holds" if self.holds else "does not hold"

    @property
    def verdict(self) -> str:
        """What the report prints: the decision with its sample, e.g. ``indicative (n = 8 corpus windows)``."""
        d = self.decision
        return d if d == "descriptive" or self.sample is None else f"{d} ({describe_sample(self.sample)})"

    @property
    def why(self) -> str:
        """Why the claim is not decided ("" when it is, or when it is descriptive)."""
        if self.decision != "indicative":
            return ""
        reasons = [] if self.ci else ["no confidence interval"]
        if self.sample is None:
            reasons.append("no sample recorded")
        elif self.sample["low_power"]:
            reasons.append(f"below the minimum sample: {self.sample['low_power_reason']}")
        return "; ".join(reasons)

    @classmethod
    def from_json(cls, data: dict) -> "Claim":
        """A claim read back from a ``report.json`` entry. Entries written before the verdict rule
        (no ``ci`` key) read as decided by point estimates: never holds / does not hold."""
        holds = data.get("criterion_met", data.get("holds"))
        return cls(
            data["claim"],
            data.get("source", ""),
            data["measured"],
            holds,
            data.get("criterion", ""),
            dict(data.get("numbers") or {}),
            ci=bool(data.get("ci", False)),
        )


__all__ = [
    "DECISIONS",
    "MIN_WINDOWS",
    "PROTOCOL_MIN_DOCUMENTS",
    "Claim",
    "Decision",
    "describe_sample",
    "estimate_text",
    "sample_size",
    "table_verdict",
    "without_empty_intervals",
]
