"""Build a report: run each available section on one model and corpus, then write HTML and JSON.

A section is listed only when the geolens modules it needs are installed (a section whose module
does not exist is left out, never filled with placeholder numbers). The quick report shows only
current protocols; the full report adds superseded material in an appendix after every section
(:attr:`ReportContext.shared` ``["appendix"]``: protocol 1's all-layer masking curves, which the
faithfulness section asks for). Each section is a module of
:mod:`geolens.report.sections` with

- ``analyses(ctx) -> dict[str, CorpusAnalysis]`` (optional): the streaming corpus analyses it
  needs. The analyses of all sections run together in **one** pass over the corpus
  (:func:`geolens.runner.run_corpus`), so the model's forward passes are shared;
- ``build(ctx, analyses) -> Section``: everything the section shows, computed in this run (its
  own interventions or extra forwards included) by its topic's pipeline
  (:mod:`geolens.pipelines`, given the analyses already run), which the topic's command runs too.

**Samples and verdicts.** Every claim carries ``numbers["sample"]``
(:func:`geolens.claims.sample_size`): the number of windows behind it (corpus or held-out windows,
as the section says; the corpus windows by default), the number of seeds when the verdict compares
with random orders (pruning), and ``low_power`` below the claim's minimum. A claim reads holds /
does not hold only when decided by confidence intervals on at least that minimum
(:mod:`geolens.claims`); otherwise its verdict reads e.g. "indicative (n = 8 corpus windows)".
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

from geolens.claims import MIN_WINDOWS, PROTOCOL_MIN_DOCUMENTS, sample_size
from geolens.report.document import Report, Section, render_html, report_json, versions
from geolens.runner import run_corpus
from geolens.validation import check_layer

DEFAULT_PROMPT = "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is"


@dataclass
class ReportConfig:
    """Parameters of one report run (all recorded in the JSON).

    ``quick`` shrinks every section's workload (fewer sequences, shorter windows, fewer
    layers/fractions) so that the whole report finishes in under two minutes on a laptop CPU.
    ``n_heldout`` windows (after the ``n_sequences`` of the corpus pass) are kept apart for the
    interventions that need data not used to build their references (faithfulness, pruning).
    """

    model: str = "smollm2-135m"
    corpus: str = "lee"
    n_sequences: int = 64
    n_heldout: int = 8
    seq_len: int = 128
    batch_size: int = 8
    quick: bool = False
    prompt: str = DEFAULT_PROMPT
    example_layer: int | None = None
    sections: list[str] | None = None
    seed: int = 0

    @classmethod
    def quick_defaults(cls, **overrides) -> "ReportConfig":
        # batch_size 2: the 8 windows make 4 batches, so the corpus-pass bar advances 4 times
        # instead of sitting at 0/1 for the whole pass (the analyses stream, results do not depend
        # on the batch size).
        base = dict(n_sequences=8, n_heldout=1, seq_len=64, batch_size=2, quick=True)
        base.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**base)


@dataclass
class ReportContext:
    """What every section builder gets: the model, the corpus windows and the configuration."""

    model: object
    tokens: torch.Tensor  # [n_sequences, seq_len], BOS first: the shared corpus pass
    heldout: torch.Tensor  # [n_heldout, seq_len]: windows the corpus pass never sees
    config: ReportConfig
    progress: bool = True
    shared: dict = field(default_factory=dict)  # results one section leaves for a later one
    # shared["appendix"]: builders (ctx -> Section) of superseded material a section asks for; they run
    # after every section and their sections come last, marked ``appendix`` (full report only)

    @property
    def prompt_tokens(self) -> torch.Tensor:
        return self.model.to_tokens(self.config.prompt, prepend_bos=True)


@dataclass(frozen=True)
class SectionSpec:
    key: str
    builder: str  # module of geolens.report.sections with a build(ctx) function
    requires: tuple[str, ...] = ()

    def available(self) -> bool:
        return all(_module_exists(m) for m in self.requires)

    def load(self):
        return importlib.import_module(f"geolens.report.sections.{self.builder}")


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


# In report order. A section appears only when every module it requires is installed.
SECTIONS: list[SectionSpec] = [
    SectionSpec("sinks", "sinks", requires=("geolens.sinks", "geolens.viz.sinks")),
    SectionSpec("contributions", "contributions"),
    SectionSpec("selection", "selection", requires=("geolens.selection.analysis", "geolens.viz.selection")),
    SectionSpec("taxonomy", "taxonomy", requires=("geolens.taxonomy", "geolens.viz.taxonomy")),
    SectionSpec(
        "faithfulness",
        "faithfulness",
        requires=(
            "geolens.faithfulness",
            "geolens.faithfulness.ground_truth",
            "geolens.faithfulness.norm_controlled",
            "geolens.viz.faithfulness",
        ),
    ),
    SectionSpec(
        "flow", "flow", requires=("geolens.flow", "geolens.flow.erasure", "geolens.flow.routes", "geolens.viz.flow")
    ),
    SectionSpec("pruning", "pruning", requires=("geolens.pruning", "geolens.taxonomy", "geolens.viz.faithfulness")),
]


def available_sections() -> list[str]:
    return [s.key for s in SECTIONS if s.available()]


def _select(keys: Sequence[str] | None) -> list[SectionSpec]:
    specs = [s for s in SECTIONS if s.available()]
    if keys is None:
        return specs
    known = {s.key for s in SECTIONS}
    unknown = [k for k in keys if k not in known]
    if unknown:
        raise ValueError(f"unknown report sections {unknown}: choose from {[s.key for s in SECTIONS]}")
    missing = [k for k in keys if k not in {s.key for s in specs}]
    if missing:
        raise ValueError(f"report sections {missing} need geolens modules that are not installed")
    return [s for s in specs if s.key in keys]


def mark_sample_sizes(sections: Sequence[Section], n_corpus_windows: int) -> None:
    """Give every claim its ``numbers["sample"]``: the corpus windows unless the section set one."""
    for section in sections:
        for claim in section.claims:
            claim.numbers["sample"] = claim.numbers.get("sample") or sample_size(n_corpus_windows)


def shared_analyses(analyses: Sequence) -> tuple[list, list[tuple]]:
    """``(distinct, twins)``: the analyses to run, and ``(twin, original)`` pairs for each one that
    equals an earlier one (same class, same ``config()``), whose state is the original's after the pass.

    >>> from geolens.taxonomy import TaxonomyAnalysis
    >>> a, b, c = TaxonomyAnalysis(2, 4), TaxonomyAnalysis(2, 4), TaxonomyAnalysis(2, 4, space="projected")
    >>> distinct, twins = shared_analyses([a, b, c])
    >>> distinct == [a, c], twins == [(b, a)]
    (True, True)
    """
    distinct, twins = [], []
    for a in analyses:
        config = getattr(a, "config", None)
        same = [
            d
            for d in distinct
            if callable(config)
            and type(d) is type(a)
            and callable(getattr(d, "config", None))
            and d.config() == config()
        ]
        if same:
            twins.append((a, same[0]))
        else:
            distinct.append(a)
    return distinct, twins


def _timed(build: Callable[[], Section]) -> Section:
    """``build()``'s section with its wall seconds and this process's CPU seconds (all threads)."""
    start, start_cpu = time.perf_counter(), time.process_time()
    section = build()
    section.seconds, section.cpu_seconds = time.perf_counter() - start, time.process_time() - start_cpu
    return section


def build_report(model, tokens: torch.Tensor, config: ReportConfig, *, progress: bool = True) -> Report:
    """Run every selected, available section on ``model`` and ``tokens`` and collect the report.

    The last ``config.n_heldout`` windows of ``tokens`` are held out of the corpus pass
    (:attr:`ReportContext.heldout`); the others are the corpus (:attr:`ReportContext.tokens`).
    """
    if tokens.ndim != 2 or tokens.shape[1] < 2:
        raise ValueError(f"tokens must be [n_sequences, seq_len ≥ 2], got {tuple(tokens.shape)}")
    specs = _select(config.sections)
    n_layers = int(model.cfg.n_layers)
    if config.example_layer is not None:
        check_layer(config.example_layer, n_layers, name="example_layer")  # IndexError out of range
    h = int(config.n_heldout)
    if h < 1 or tokens.shape[0] <= h:
        raise ValueError(f"need more windows ({tokens.shape[0]}) than n_heldout={h} (≥ 1)")
    corpus, heldout = tokens[:-h], tokens[-h:]
    began, began_cpu = time.perf_counter(), time.process_time()
    ctx = ReportContext(model=model, tokens=corpus, heldout=heldout, config=config, progress=progress)
    modules = {spec.key: spec.load() for spec in specs}
    wanted = {key: (m.analyses(ctx) if hasattr(m, "analyses") else {}) for key, m in modules.items()}
    distinct, twins = shared_analyses([a for per_section in wanted.values() for a in per_section.values()])
    start, start_cpu = time.perf_counter(), time.process_time()
    if distinct:
        run_corpus(model, corpus, distinct, batch_size=config.batch_size, progress=progress, desc="corpus pass")
    for twin, original in twins:  # an analysis two sections ask for runs once; each gets its own state
        twin.load_state_dict(copy.deepcopy(original.state_dict()))
    corpus_seconds, corpus_cpu = time.perf_counter() - start, time.process_time() - start_cpu
    sections = []
    for key, module in modules.items():
        sections.append(_timed(lambda: module.build(ctx, wanted[key])))
    for build_appendix in ctx.shared.get("appendix", []):  # superseded material, after every current section
        sections.append(_timed(lambda: build_appendix(ctx)))
    mark_sample_sizes(sections, int(corpus.shape[0]))
    params = asdict(config)
    from geolens.threads import policy

    if config.quick:  # what quick mode samples down, one line (the run line and the command print it)
        notes = [m.quick_sample(ctx) for m in modules.values() if hasattr(m, "quick_sample")]
        params["quick_sample"] = "; ".join(notes) + "; the full report keeps the published protocols"
    params["threads"] = policy()  # torch's threads, where the count came from, OpenMP's wait policy, the load
    params["corpus_pass_seconds"] = round(corpus_seconds, 2)
    params["corpus_pass_cpu_seconds"] = round(corpus_cpu, 2)  # this process's CPU time, all its threads
    params["report_seconds"] = round(time.perf_counter() - began, 2)  # the corpus pass and every section
    params["report_cpu_seconds"] = round(time.process_time() - began_cpu, 2)
    params["n_sequences"], params["seq_len"] = int(corpus.shape[0]), int(tokens.shape[1])
    params["verdict_rule"] = (
        "holds / does not hold only when decided by confidence intervals on at least the claim's minimum sample "
        f"({PROTOCOL_MIN_DOCUMENTS} documents for faithfulness, {MIN_WINDOWS} windows and two seeds otherwise); else indicative"
    )
    claims = [c for s in sections for c in s.claims]
    params["n_low_power_claims"] = sum(bool(c.numbers["sample"]["low_power"]) for c in claims)
    params["n_decided_claims"] = sum(c.decision in ("holds", "does not hold") for c in claims)
    params["model_config"] = {
        k: getattr(model.cfg, k, None) for k in ("n_layers", "n_heads", "d_model", "d_head", "n_key_value_heads")
    }
    return Report(sections=sections, params=params, versions=versions(model))


def write_report(report: Report, out: str | Path) -> dict[str, Path]:
    """Write ``report.html`` and ``report.json`` into the folder ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    html_path, json_path = out / "report.html", out / "report.json"
    html_path.write_text(render_html(report), encoding="utf-8")
    json_path.write_text(json.dumps(report_json(report), indent=1, allow_nan=False), encoding="utf-8")
    return {"html": html_path, "json": json_path}
