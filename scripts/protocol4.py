"""Faithfulness protocol 4 (docs/faithfulness/v4/PROTOCOL.md) on one model, one part at a time.

    python scripts/protocol4.py beyond-norm --model smollm2-135m --out docs/faithfulness/v4/smollm2-135m-beyond-norm
    python scripts/protocol4.py matched-masking --model smollm2-135m --out docs/faithfulness/v4/smollm2-135m-masking [--resume]
    python scripts/protocol4.py addendum-correction --model smollm2-135m --out OUT

- ``beyond-norm`` (§1): a re-analysis of protocol 3's stored float64 per-term rows, no model.
- ``matched-masking`` (§2): the size-matched random controls, one document at a time (resumable with
  ``--resume``; one thread, as the stored rows it reuses), then the summary.
- ``addendum-correction`` (§3): the masking addendum's family without its duplicated comparison,
  written to ``OUT/corrected_family.json`` (publish it with ``--out docs/faithfulness/v3/masking/<model>``).

Each writes ``summary.json`` and ``README.md`` into ``--out`` (a folder outside docs/ unless
publishing; it must not hold results yet, or pass ``--overwrite`` / ``--resume``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTOCOL = ROOT / "docs" / "faithfulness" / "v4" / "protocol.json"
ADDENDUM = ROOT / "docs" / "faithfulness" / "v3" / "masking"
MODELS = ("smollm2-135m", "gemma3-270m")


def _check_source(entry: dict) -> Path:
    from geolens.files import file_sha256

    path = ROOT / entry["path"]
    if not path.is_file():
        raise SystemExit(f"error: {entry['path']} is missing")
    if file_sha256(path) != entry["sha256"]:
        raise SystemExit(f"error: {entry['path']} is not the file protocol 4 names (SHA-256 differs)")
    return path


def _header(protocol, part: str, model: str, command: str) -> dict:
    from geolens.preregistration import preregistration

    record = preregistration(protocol)
    return {
        "command": command,
        "protocol": str(PROTOCOL.relative_to(ROOT)),
        "protocol_version": protocol.version,
        "part": part,
        "model": model,
        "label": record["status"],
        "preregistration": record,
    }


def beyond_norm(args, protocol) -> dict:
    import pandas as pd

    from geolens.faithfulness.beyond_norm import beyond_norm_summary

    source = protocol["beyond_norm"]["source"][args.model]
    terms = pd.read_csv(_check_source(source["per_term_terms.csv.gz"]))
    positions = pd.read_csv(_check_source(source["per_term_positions.csv.gz"]))
    return beyond_norm_summary(terms, positions, protocol.settings)


def matched_masking(args, protocol, out: Path) -> dict:
    import pandas as pd
    import torch

    import geolens
    from geolens.data import load_corpus
    from geolens.faithfulness.matched_masking import matched_masking_document
    from geolens.faithfulness.preregistered import load_protocol, protocol_windows
    from geolens.resume import run_document_stage

    section = protocol["matched_masking"]
    from geolens.threads import apply

    apply(int(section["threads"]))  # the registered count, kept by load_model (geolens.threads)
    torch.set_grad_enabled(False)
    stored = pd.read_csv(_check_source(section["stored_rows"][args.model]))
    model = geolens.load_model(args.model)
    if torch.get_num_threads() != int(section["threads"]):
        raise SystemExit(f"error: the run needs {section['threads']} torch thread(s), got {torch.get_num_threads()}")
    addendum = load_protocol(ROOT / section["addendum"])
    windows, _ = protocol_windows(model, addendum, load_corpus("lee"))
    n = int(section["n_documents"]) if args.n_documents is None else int(args.n_documents)
    fingerprint = dict(stage="matched_masking", protocol_sha256=protocol.sha256, model=args.model, n_documents=n)

    def measure(d: int) -> dict:
        return {"rows": matched_masking_document(model, windows[d : d + 1], d, protocol=section, stored=stored)}

    tables = run_document_stage("matched_masking", out, fingerprint, n, measure, resume=args.resume, model=model)
    from geolens.faithfulness.matched_summary import matched_masking_summary  # imported after the run

    return matched_masking_summary(tables["rows"], stored, protocol.settings)


def addendum_correction(args, protocol) -> dict:
    import pandas as pd

    from geolens.faithfulness.matched_summary import corrected_addendum_family

    folder = ADDENDUM / args.model
    rows = pd.read_csv(_check_source(protocol["matched_masking"]["stored_rows"][args.model]))
    published = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    return corrected_addendum_family(rows, published, protocol.settings)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("part", choices=["beyond-norm", "matched-masking", "addendum-correction"])
    parser.add_argument("--model", required=True, choices=MODELS)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--resume", action="store_true", help="matched-masking: continue after the saved documents")
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument("--n-documents", type=int, default=None, help="fewer documents: an exploratory run")
    args = parser.parse_args(argv)

    from geolens.errors import UsageError
    from geolens.faithfulness.preregistered import load_protocol, write_json
    from geolens.run_folder import open_run_folder

    protocol = load_protocol(PROTOCOL)
    given = argv if argv is not None else sys.argv[1:]
    command = "python scripts/protocol4.py " + " ".join(a for a in given if a not in ("--overwrite", "--resume"))
    summary = _header(protocol, args.part, args.model, command)  # the commit and tree before anything is written
    try:
        folder = open_run_folder(
            args.out,
            command=f"protocol4 {args.part}",
            overwrite=args.overwrite,
            resume=args.resume,
            resumable=args.part == "matched-masking",
        )
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out = Path(folder.path)
    start = time.time()
    if args.part == "beyond-norm":
        summary.update(beyond_norm(args, protocol))
    elif args.part == "matched-masking":
        summary.update(matched_masking(args, protocol, out))
        if args.n_documents is not None:
            summary["label"] = "exploratory"
            summary["preregistration"]["reasons"] = summary["preregistration"].get("reasons", []) + [
                f"--n-documents {args.n_documents}"
            ]
    else:
        summary.update(addendum_correction(args, protocol))
    if summary["label"] != "pre-registered":
        from geolens.preregistration import withhold_verdicts

        for key in ("tests", "sensitivity_tests", "corrected_tests"):
            if key in summary:
                summary[key] = withhold_verdicts(summary[key])
    summary["seconds"] = round(time.time() - start, 1)
    name = "corrected_family.json" if args.part == "addendum-correction" else "summary.json"
    write_json(summary, out / name)
    from geolens.faithfulness.matched_summary import render_readme

    (out / ("corrected_family.md" if args.part == "addendum-correction" else "README.md")).write_text(
        render_readme(summary), encoding="utf-8"
    )
    folder.complete()
    print(f"{args.part} ({args.model}): {summary['label']}; results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
