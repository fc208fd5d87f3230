"""Generate the support matrix: which geolens quantities are verified on which model family and backend.

This script only runs and renders. The checks, each with its own reference, are in
``tests/support_checks.py`` (``tests/test_support_matrix.py`` runs them as parametrised tests,
families × backends, against the committed cells); the HF → HookedTransformer conversion is
:func:`geolens.families.convert.hooked_from_hf`, from each family's ``hooked_config``
(:mod:`geolens.families`). Here every family of :mod:`geolens.hf.tiny` (tiny random
``transformers`` models built offline from their configs) runs every check on every backend — the
HF-native backend (:mod:`geolens.hf`), TransformerLens 4.x's ``TransformerBridge`` and
TransformerLens 2.x's ``HookedTransformer`` over the same weights — and the cells are rendered to
docs/support.md and docs/support.json.

A cell is ``pass``, ``fail`` (with a one-line reason), ``unsupported`` (geolens refuses the
computation with a clear error, quoted) or ``not hosted`` (the backend cannot hold the family).

TransformerLens 2.x and 4.x cannot share an environment: the ``tl2-hooked`` column runs this script
under ``.venvs/tl2/bin/python`` (``--column tl2-hooked --to FILE``, JSON) and is merged; without
``.venvs/tl2`` the script stops with an error saying how to build it. Usage::

    python scripts/support_matrix.py            # writes docs/support.md and docs/support.json
    python scripts/support_matrix.py --out DIR  # elsewhere

``tests/test_support_matrix.py`` regenerates the matrix and fails when a cell changed or the
committed files are stale.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "tests"))  # the checks: tests/support_checks.py

from support_checks import CHECKS, available_backends, run_cell  # noqa: E402

from geolens.families import FAMILIES as FAMILY_MODULES  # noqa: E402
from geolens.hf.tiny import FAMILIES  # noqa: E402

BACKENDS = {
    "hf": "HF-native (geolens.hf, transformers eager attention)",
    "tl4-bridge": "TransformerLens 4.x TransformerBridge (compatibility mode off)",
    "tl2-hooked": "TransformerLens 2.x HookedTransformer (converted from the HF model, weights unprocessed; run in .venvs/tl2)",
}

TL2_PYTHON = ROOT / ".venvs" / "tl2" / "bin" / "python"

FAMILY_NOTES = {name: module.NOTE for name, module in FAMILY_MODULES.items()}
"""What each family's tiny model exercises (its ``NOTE`` in :mod:`geolens.families`)."""


class MissingBackend(RuntimeError):
    """A backend of the matrix that neither this environment nor ``.venvs/tl2`` can run."""


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for dist in ("torch", "transformers", "transformer-lens"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def column(backend: str, families=FAMILIES, checks=CHECKS, progress: bool = False) -> dict:
    """One backend's cells, ``{"versions": ..., "results": {family: {check: cell}}}``: computed in
    this process when it has the backend, else (``tl2-hooked``) by this script under
    ``.venvs/tl2/bin/python``. Raises :class:`MissingBackend` when neither can run it."""
    if backend in available_backends():
        results = {}
        for family in families:
            results[family] = run_cell(family, backend, checks)
            if progress:
                statuses = {c: r["status"] for c, r in results[family].items()}
                print(f"{family:9s} {backend:11s} {statuses}", file=sys.stderr)
        return {"versions": versions(), "results": results}
    return _Tl2Column(families, checks).result(progress) if backend == "tl2-hooked" else _missing(backend)


def _missing(backend: str):
    if backend in BACKENDS:
        raise MissingBackend(
            f"the {backend} column needs TransformerLens 4.x (TransformerBridge), which this Python lacks: run the script with the main environment's python"
        )
    raise ValueError(f"unknown backend {backend!r}: use one of {', '.join(BACKENDS)}")


class _Tl2Column:
    """The ``tl2-hooked`` column, computed by this script under ``.venvs/tl2/bin/python``
    (TransformerLens 2.x) in a subprocess started at construction and read by :meth:`result`, so
    that it runs beside this process's own columns."""

    def __init__(self, families, checks):
        if not TL2_PYTHON.exists():
            raise MissingBackend(
                f"the tl2-hooked column runs in .venvs/tl2 (TransformerLens 2.x), and {TL2_PYTHON} is missing: build it with `bash scripts/install.sh --tl2`"
            )
        self.dir = tempfile.TemporaryDirectory()
        self.out, self.log = Path(self.dir.name) / "column.json", Path(self.dir.name) / "stderr.txt"
        command = [str(TL2_PYTHON), str(Path(__file__).resolve()), "--column", "tl2-hooked", "--to", str(self.out)]
        command += ["--families", ",".join(families), "--checks", ",".join(checks)]
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        with open(self.log, "w", encoding="utf-8") as log:
            self.process = subprocess.Popen(
                command, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log
            )

    def result(self, progress: bool = False) -> dict:
        try:
            code = self.process.wait()
            log = self.log.read_text(encoding="utf-8", errors="replace")
            if progress:
                print(log, end="", file=sys.stderr)
            if code != 0 or not self.out.exists():
                last = (log.strip().splitlines() or ["no output"])[-1]
                raise MissingBackend(f"the tl2-hooked column failed in .venvs/tl2 (exit {code}): {last}")
            return json.loads(self.out.read_text(encoding="utf-8"))
        finally:
            self.close()

    def close(self) -> None:
        """Stop the subprocess if it still runs and remove its folder."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.dir.cleanup()


def support_matrix(families=FAMILIES, backends=None, progress: bool = False) -> dict:
    """The matrix as a JSON-ready dict: families, backends (default: all three, the TransformerLens
    2.x column computed in ``.venvs/tl2`` while this process computes the others), checks, each
    backend's package versions and every cell's result."""
    backends = list(BACKENDS) if backends is None else list(backends)
    here = available_backends()
    elsewhere = _Tl2Column(families, CHECKS) if "tl2-hooked" in backends and "tl2-hooked" not in here else None
    try:
        columns = {
            b: column(b, families, progress=progress) for b in backends if b != "tl2-hooked" or elsewhere is None
        }
        if elsewhere is not None:
            columns["tl2-hooked"] = elsewhere.result(progress)
    finally:
        if elsewhere is not None:
            elsewhere.close()
    return {
        "versions": {b: columns[b]["versions"] for b in backends},
        "checks": CHECKS,
        "backends": {b: BACKENDS[b] for b in backends},
        "families": {f: FAMILY_NOTES[f] for f in families},
        "results": {f: {b: columns[b]["results"][f] for b in backends} for f in families},
    }


MARK = {"pass": "✓", "fail": "✗", "unsupported": "–", "not hosted": "n/h"}


def _versions_line(versions: dict) -> str:
    """The package versions per backend, backends with the same versions together."""
    groups: dict[str, list[str]] = {}
    for backend, packages in versions.items():
        groups.setdefault(", ".join(f"{k} {v}" for k, v in packages.items()), []).append(f"`{backend}`")
    return "; ".join(f"{line} ({', '.join(backends)})" for line, backends in groups.items())


def markdown(matrix: dict) -> str:
    """docs/support.md from the matrix (see :func:`support_matrix`)."""
    checks, backends = list(matrix["checks"]), list(matrix["backends"])
    lines = [
        "# Support matrix",
        "",
        "<!-- generated by scripts/support_matrix.py: do not edit by hand -->",
        "",
        "Which geolens quantities are verified on which model family and backend. Every cell runs a",
        "tiny random model of the family (2 layers, d_model 32, built offline from its `transformers`",
        "config by `geolens.hf.tiny`) through geolens' public functions and compares the result with a",
        "reference computed independently: explicit float64 loops over the cached pattern and values, or",
        "full reruns of the model. `tests/test_support_matrix.py` regenerates this page and fails when",
        "a cell changes; CI runs it (`scripts/test.sh`), so a family that regresses fails there.",
        "",
        "Versions: " + _versions_line(matrix["versions"]) + ".",
        "",
        "Backends: " + "; ".join(f"`{b}` = {d}" for b, d in matrix["backends"].items()) + ".",
        "",
        "TransformerLens 2.x and 4.x cannot be installed side by side, so the `tl2-hooked` column is",
        "computed by the same script in its own environment (`.venvs/tl2`, built by",
        "`bash scripts/install.sh --tl2`; without it the script stops and says so). Its",
        "`HookedTransformer` is built from the same in-memory HF model as the other backends, with",
        "TransformerLens' own tools: a `HookedTransformerConfig` whose fields are mapped from the HF",
        "config per family as TransformerLens' `convert_hf_model_config` maps them (what that mapping",
        "leaves out, the sliding windows of Qwen2 and Phi-3 and Llama's rotary base, and the values it",
        "hard-codes for the released Gemma checkpoints are read from the config), and the weights",
        "converted by its `convert_*_weights` and loaded unprocessed (no norm folding, no centring,",
        "value biases kept). Its logits must equal the HF model's within 1e-5 before any check runs;",
        "otherwise, or where TransformerLens 2.x has no conversion for the family, its cells are n/h.",
        "Gemma 2/3 normalise after attention and a `HookedTransformer` has no hook before that norm:",
        "there `attention_rebuild` compares with the output of the attention module itself.",
        "",
        "Cells: ✓ verified, ✗ differs from the reference (reason below), – refused by geolens with a",
        "clear error (quoted below), n/h the backend cannot host the family.",
        "",
        "| family | what it exercises | backend | " + " | ".join(checks) + " |",
        "|---|---|---|" + "---|" * len(checks),
    ]
    notes: dict[tuple[str, str, str], list[str]] = {}  # (family, backend, reason) -> its checks, one note each
    for family, per_backend in matrix["results"].items():
        for backend in backends:
            cells = []
            for check in checks:
                r = per_backend[backend][check]
                mark = MARK[r["status"]]
                if r["reason"]:
                    notes.setdefault((family, backend, r["reason"]), []).append(check)
                    mark += f" [{list(notes).index((family, backend, r['reason'])) + 1}]"
                cells.append(mark)
            lines.append(f"| {family} | {matrix['families'][family]} | {backend} | " + " | ".join(cells) + " |")
    lines += ["", "Checks:", ""] + [f"- `{c}`: {d}." for c, d in matrix["checks"].items()]
    if notes:
        lines += ["", "Reasons:", ""]
        for n, ((family, backend, reason), where) in enumerate(notes.items(), start=1):
            lines.append(
                f"{n}. {family}, {backend}, {'every check' if where == checks else ', '.join(where)}: {reason}"
            )
    lines += USAGE
    return "\n".join(lines) + "\n"


USAGE = [
    "",
    "## The HF-native backend",
    "",
    "A `transformers` causal LM is analysed as it is, without TransformerLens:",
    "",
    "```python",
    "import geolens",
    "",
    'model = geolens.load_model("smollm2-135m", backend="hf")  # a transformers LlamaForCausalLM',
    'tokens = model.to_tokens("The cat sat on the mat.", prepend_bos=True)',
    "_, cache = geolens.run_with_cache(model, tokens, names_filter=geolens.names_filter(model))",
    'c = geolens.contribution_weights(model, cache, layer=5, mode="intra")',
    "```",
    "",
    "Any `PreTrainedModel` works the same way once `geolens.hf.prepare(model, tokenizer=...)` has given",
    "it geolens' entry points; its class and its Hugging Face forward are unchanged (and",
    "`geolens.adapter_for(model)` or `geolens.run_with_cache(model, ...)` alone change nothing on the",
    "model). Pattern, v and z are captured inside the family's own eager",
    "attention (a function registered in `transformers`' `AttentionInterface`), and before the first",
    "analysis the attention output rebuilt from them, Σ_h z^h W_O^h + b_O, is checked against the",
    "attention module's output in every layer: a model geolens would read wrongly raises an error",
    "naming its family and the layer. Families outside the table use a generic adapter (Llama's",
    "module layout) under the same check. `geolens.hf.streamed` computes each layer's quantities",
    "inside the forward and drops its pattern before the next layer.",
]


def write(matrix: dict, out: Path) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    md_path, json_path = out / "support.md", out / "support.json"
    md_path.write_text(markdown(matrix), encoding="utf-8")
    json_path.write_text(json.dumps(matrix, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return md_path, json_path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=ROOT / "docs", help="folder for support.md and support.json (default: docs/)"
    )
    parser.add_argument(
        "--column",
        choices=list(BACKENDS),
        help="compute only this backend's cells, in this environment, as JSON (see --to)",
    )
    parser.add_argument("--to", type=Path, help="with --column: the JSON file to write")
    parser.add_argument(
        "--families", default=",".join(FAMILIES), help="with --column: comma-separated families (default: all)"
    )
    parser.add_argument(
        "--checks", default=",".join(CHECKS), help="with --column: comma-separated checks (default: all)"
    )
    args = parser.parse_args(argv)
    families, checks = args.families.split(","), args.checks.split(",")
    if args.column and args.to is None:
        parser.error("--column needs --to FILE")
    if unknown := sorted(set(families) - set(FAMILIES)) + sorted(set(checks) - set(CHECKS)):
        parser.error(f"unknown families or checks: {', '.join(unknown)}")
    if args.column and args.column not in available_backends():
        parser.error(f"this environment cannot run the {args.column} column (it has {', '.join(available_backends())})")
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    torch.set_grad_enabled(True)
    if args.column:
        args.to.write_text(
            json.dumps(column(args.column, families, checks, progress=True), ensure_ascii=False), encoding="utf-8"
        )
        return 0
    try:
        matrix = support_matrix(progress=True)
    except MissingBackend as err:
        print(f"support_matrix.py: error: {err}", file=sys.stderr)
        return 1
    for path in write(matrix, args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
