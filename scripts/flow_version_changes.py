"""What changes between two versions of the flow erasure protocol on one model (docs/flow/v2/
PROTOCOL.md §4: "the comparison with version 1 is reported per pair"): each method's nAOPC in both
runs (primary replacement), the pairs whose Holm verdict differs, and the most faithful method of
each direction. Reads the two finished runs' summary.json; computes nothing new.

    python scripts/flow_version_changes.py docs/flow/gemma3-270m docs/flow/v2/gemma3-270m
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from geolens.flow.summary import verdict_changes


def load(folder: Path) -> dict:
    path = folder / "summary.json"
    if not path.is_file():
        raise ValueError(f"{path} does not exist (is the run finished?)")
    summary = json.loads(path.read_text(encoding="utf-8"))
    if "families" not in summary:
        raise ValueError(f"{path} is not a flow erasure summary")
    return summary


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", type=Path, help="results folder of the earlier version")
    parser.add_argument("new", type=Path, help="results folder of the later version")
    args = parser.parse_args(argv)
    try:
        old, new = load(args.old), load(args.new)
    except ValueError as err:
        print(f"flow_version_changes: {err}", file=sys.stderr)
        return 2
    if old["model"] != new["model"]:
        print(f"flow_version_changes: the runs are of {old['model']} and {new['model']}", file=sys.stderr)
        return 2
    a, b = old["families"]["primary"], new["families"]["primary"]
    va, vb = old.get("protocol_version"), new.get("protocol_version")
    print(f"{new['model']}: version {va} ({a['n_predictions']} predictions) -> version {vb} ({b['n_predictions']})")
    before = {(m["direction"], m["method"]): m for m in a["methods"]}
    for m in b["methods"]:
        o = before.get((m["direction"], m["method"]))
        was = f"{o['naopc']:.3f} [{o['ci_low']:.3f}, {o['ci_high']:.3f}]" if o else "-"
        print(
            f"  {m['direction']:17s} {m['method']:22s} {was:>24s} -> {m['naopc']:.3f} [{m['ci_low']:.3f}, {m['ci_high']:.3f}]"
        )
    changes = verdict_changes(a["pairs"], b["pairs"])
    print(f"verdicts that change ({len(changes)} of {len(b['pairs'])} pairs, each family Holm-corrected):")
    for c in changes:
        print(f"  {c['direction']:17s} {c['a']} vs {c['b']}: {c['primary']} -> {c['robustness']}")
    for d, best in new["most_faithful"].items():
        was = old["most_faithful"].get(d) or {}
        print(f"most faithful, {d}: {was.get('method')} -> {(best or {}).get('method')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
