"""``python -m geolens.stability``: the registered stability analysis (docs/stability/PROTOCOL.md).

    python -m geolens.stability --out docs/stability/results [--model M] [--family NAME]
    python -m geolens.stability --out docs/stability/results --render

Each (family, model) is written to ``OUT/<model>/<family>.json`` as it finishes (a second
invocation skips those already there unless ``--again``); ``--render`` writes ``OUT/stability.json``
and ``OUT/README.md`` from them. Re-analysis of stored rows only: no model is loaded.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from geolens.stability import assess, published_families
from geolens.stability.report import render

DOCS = Path(__file__).resolve().parents[2] / "docs"


def slug(name: str) -> str:
    """A file name for a family's name.

    >>> slug("protocol 3 addendum masking (corrected, 15 tests)")
    'protocol-3-addendum-masking-corrected-15-tests'
    """
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m geolens.stability", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", action="append", choices=["smollm2-135m", "gemma3-270m"])
    parser.add_argument("--family", action="append", help="only the families whose name contains this text")
    parser.add_argument("--again", action="store_true", help="recompute families already written")
    parser.add_argument(
        "--render", action="store_true", help="combine the families written into stability.json and README.md"
    )
    args = parser.parse_args(argv)
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
