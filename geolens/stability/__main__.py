"""``python -m geolens.stability``: the registered stability analysis (docs/stability/PROTOCOL.md).

    python -m geolens.stability --out docs/stability/results [--model M] [--family NAME]
    python -m geolens.stability --out docs/stability/results --render
    python -m geolens.stability --out docs/stability/results --annotate

Each (family, model) is written to ``OUT/<model>/<family>.json`` as it finishes (a second
invocation skips those already there unless ``--again``); ``--render`` writes ``OUT/stability.json``
and ``OUT/README.md`` from them, and, when ``OUT`` is the published ``docs/stability/results``, refills the
stability paragraphs of ``docs/results.md``; ``--annotate`` adds each family's labels to its results file
(:func:`annotate`). Re-analysis of stored rows only: no model is loaded.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from geolens.files import file_sha256
from geolens.stability import _relative, assess, published_families
from geolens.stability.report import fill_markers, render

DOCS = Path(__file__).resolve().parents[2] / "docs"


def slug(name: str) -> str:
    """A file name for a family's name.

    >>> slug("protocol 3 addendum masking (corrected, 15 tests)")
    'protocol-3-addendum-masking-corrected-15-tests'
    """
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


SUMMARY_FILES = ("summary.json", "controls_summary.json", "corrected_family.json")


def annotate(combined: dict, root: Path) -> list[Path]:
    """Add to each family's results file (its folder's ``summary.json``, ``controls_summary.json``
    or, for the corrected addendum family, protocol 4's ``corrected_family.json``) a ``stability``
    entry keyed by the family's name: each test's verdict, the shares kept and its label. The
    published numbers are left as they are; the folder's manifest gets the file's new size and
    SHA-256 (refused for a results file that is not the one its manifest lists)."""
    import hashlib

    from geolens.checkpoint import atomic_write_bytes

    plan = []
    for family in combined["families"]:  # every file checked before any is written
        folder = root / _relative(family["folder"])
        if "corrected" in family["family"]:
            folder = root / "docs" / "faithfulness" / "v4" / f"{family['model']}-addendum-correction"
        name = next((n for n in SUMMARY_FILES if (folder / n).is_file()), None)
        if name is None:
            raise SystemExit(f"error: no summary file in {folder}; nothing annotated")
        manifest_path = folder / "manifest.json"
        manifest = json.loads(manifest_path.read_text(encoding="utf-8")) if manifest_path.is_file() else None
        entry = None if manifest is None else manifest["files"].get(name)
        if entry is not None and file_sha256(folder / name) != entry["sha256"]:
            raise SystemExit(f"error: {folder / name} is not the file its manifest lists; nothing annotated")
        plan.append((family, folder, name))
    changed = []
    for family, folder, name in plan:
        manifest_path = folder / "manifest.json"
        summary = json.loads((folder / name).read_text(encoding="utf-8"))
        summary.setdefault("stability", {})[family["family"]] = dict(
            plan="docs/stability/PROTOCOL.md",
            results="docs/stability/results/stability.json",
            fragile_below=combined["fragile_below"],
            tests=[
                dict(
                    test=t["test"],
                    verdict=t["verdict"],
                    documents_kept=None if t["label"] is None else t["documents"]["share"],
                    layers_kept=None if t["label"] is None or t["layers"] is None else t["layers"]["share"],
                    label=t["label"],
                )
                for t in family["tests"]
            ],
        )
        data = (json.dumps(summary, indent=1, ensure_ascii=False) + "\n").encode("utf-8")
        atomic_write_bytes(folder / name, data)
        if manifest_path.is_file():
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
            if name in manifest["files"]:
                manifest["files"][name] = dict(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
                atomic_write_bytes(manifest_path, json.dumps(manifest, indent=1, sort_keys=True).encode())
        changed.append(folder / name)
    return changed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m geolens.stability", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", action="append", choices=["smollm2-135m", "gemma3-270m"])
    parser.add_argument("--family", action="append", help="only the families whose name contains this text")
    parser.add_argument("--again", action="store_true", help="recompute families already written")
    parser.add_argument(
        "--render", action="store_true", help="combine the families written into stability.json and README.md"
    )
    parser.add_argument(
        "--annotate",
        action="store_true",
        help="add each family's labels to its result folder's summary (after --render)",
    )
    args = parser.parse_args(argv)
    if args.annotate:
        if args.out.resolve() != (DOCS / "stability" / "results").resolve():
            print(
                "error: --annotate labels the published results files: use --out docs/stability/results",
                file=sys.stderr,
            )
            return 2
        path = args.out / "stability.json"
        if not path.is_file():
            print(f"error: {path} is missing: run --render first", file=sys.stderr)
            return 2
        changed = annotate(json.loads(path.read_text(encoding="utf-8")), DOCS.parent)
        print(f"stability: labels added to {len(changed)} summaries")
        return 0
    if args.render:
        results = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(args.out.glob("*/*.json"))]
        if not results:
            print(f"error: no family results under {args.out}", file=sys.stderr)
            return 2
        combined, text = render(results)
        (args.out / "stability.json").write_text(
            json.dumps(combined, indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
        )
        (args.out / "README.md").write_text(text, encoding="utf-8")
        results_md = DOCS / "results.md"
        published = args.out.resolve() == (DOCS / "stability" / "results").resolve()
        if (
            published and results_md.is_file()
        ):  # the paragraphs beside each family's verdicts (docs/ only when --out is)
            results_md.write_text(fill_markers(results_md.read_text(encoding="utf-8"), combined), encoding="utf-8")
        print(f"stability: {len(results)} families rendered into {args.out}")
        return 0
    models = tuple(args.model or ("smollm2-135m", "gemma3-270m"))
    for family in published_families(DOCS, models):
        if args.family and not any(f in family.name for f in args.family):
            continue
        path = args.out / family.model / f"{slug(family.name)}.json"
        if path.is_file() and not args.again:
            continue
        result = assess(family)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
