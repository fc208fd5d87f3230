"""Re-summarise the published pre-registered runs from their stored stage files and compare them
with the committed files, timings aside: the check that a move of code changed no number in docs/.

Protocol 4's scripts and the stability analysis are re-run the same way. Run from a clean checkout (a git worktree of the commit under test), one model at a time; every
command resumes a finished run, so it only reloads the model and recomputes the statistics:

    git worktree add /tmp/regen HEAD && cd /tmp/regen && python scripts/regenerate_check.py

Each results folder is rewritten in place; the script then reports, per changed file, whether it
equals the committed one once the timing fields (``seconds``, ``completed``, ``stage_seconds``,
``erasure_seconds``, ``versions``), the command history of a resumed checkpoint and the provenance
fields (the run's commit and working tree, how the registration was confirmed, a checkpoint's
writer) are set aside, and exits 1 on any other difference. The resumes here re-summarise finished
runs that git vouches for (tracked, unchanged since the last commit): their records may predate
the digests and writers that a resume otherwise requires (:mod:`geolens.resume`). Two differences are expected and not counted: a manifest's
file hashes (they follow the timings), and the flow runs' known-answer induction check, which the
flow command recomputes with forward passes (its gaps move at float32 rounding with the thread
count; its counts do not), reported as a warning. A run still marked INCOMPLETE is skipped: resuming
it would continue the experiment, not re-summarise it.
"""

from __future__ import annotations

import difflib
import json
import os
import subprocess
import sys

RUNS = [
    "faithfulness --protocol docs/faithfulness/protocol.json --model {m} --corpus lee --stage all --out docs/faithfulness/{m} --resume --threads 1",
    "mc --protocol docs/faithfulness/protocol.json --model {m} --out docs/faithfulness/{m}-mc --resume",
    "flow --erasure --protocol docs/flow/protocol.json --model {m} --out docs/flow/{m} --resume",
    "flow --erasure --protocol docs/flow/v2/protocol.json --model {m} --out docs/flow/v2/{m} --resume",
    "flow --erasure --protocol docs/flow/v3/protocol.json --model {m} --out docs/flow/v3/{m} --resume",
    "faithfulness --protocol docs/faithfulness/v3/protocol.json --model {m} --corpus lee --stage per_term --out docs/faithfulness/v3/{m} --resume --threads 1",
    "mc --protocol docs/faithfulness/v3/masking/protocol.json --model {m} --out docs/faithfulness/v3/masking/{m}-mc --resume",
]
# protocol 4 (docs/faithfulness/v4/PROTOCOL.md): scripts, each re-summarising its stored rows
SCRIPT_RUNS = [
    "scripts/protocol4.py beyond-norm --model {m} --out docs/faithfulness/v4/{m}-beyond-norm --overwrite",
    "scripts/protocol4.py addendum-correction --model {m} --out docs/faithfulness/v4/{m}-addendum-correction --overwrite",
    "scripts/protocol4.py matched-masking --model {m} --out docs/faithfulness/v4/{m}-masking --resume",
]
# the stability of every verdict (docs/stability/PROTOCOL.md), after the runs it reads
AFTER = [
    "-m geolens.stability --out docs/stability/results --again",
    "-m geolens.stability --out docs/stability/results --render",
]
MODELS = ("smollm2-135m", "gemma3-270m")
TIMING = {"seconds", "completed", "erasure_seconds", "stage_seconds", "versions", "commands"}
# where and with what the re-summary ran (issue #46): its commit and working tree, how the registration
# was confirmed, the writer of a rewritten checkpoint, the geolens versions a resume crossed
PROVENANCE = {"run_commit", "working_tree", "registered_commit", "checked_against", "writer", "resumed_across_versions"}
# added to a published summary by a later analysis, not by its command (geolens.stability --annotate)
ADDED_LATER = {"stability"}
RECOMPUTED = ("induction_check", "induction.csv", "README.md")  # flow: recomputed by forward passes


def strip(x):
    if isinstance(x, dict):
        return {k: strip(v) for k, v in x.items() if k not in TIMING | PROVENANCE | ADDED_LATER and k != "records"}
    if isinstance(x, list):
        return [strip(v) for v in x]
    return x


def main() -> int:
    for m in MODELS:
        for run in RUNS:
            argv = [sys.executable, "-m", "geolens", *run.format(m=m).split()]
            out = argv[argv.index("--out") + 1]
            if os.path.exists(os.path.join(out, "INCOMPLETE")):
                print(f"skipped (unfinished run, --resume would continue it): {out}", flush=True)
                continue
            print("==", " ".join(argv[2:]), flush=True)
            subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
        for run in SCRIPT_RUNS:
            argv = [sys.executable, *run.format(m=m).split()]
            print("==", " ".join(argv[1:]), flush=True)
            subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    for run in AFTER:
        subprocess.run([sys.executable, *run.split()], check=True, stdout=subprocess.DEVNULL)
    status = subprocess.run(["git", "status", "--short", "docs"], capture_output=True, text=True, check=True).stdout
    bad = 0
    for line in filter(None, status.splitlines()):
        path = line[3:]
        old = subprocess.run(["git", "show", f"HEAD:{path}"], capture_output=True, check=True).stdout
        new = open(path, "rb").read()
        if path.endswith("manifest.json"):
            continue
        if path.endswith(".json"):
            a, b = strip(json.loads(old)), strip(json.loads(new))
            if a.keys() == b.keys() and "induction_check" in a:
                a.pop("induction_check"), b.pop("induction_check")
                print(f"warning: {path}: induction_check recomputed (not compared)")
            same = a == b
        else:
            diff = [
                x
                for x in difflib.unified_diff(old.decode().splitlines(), new.decode().splitlines(), lineterm="", n=0)
                if x[:1] in "+-" and x[:3] not in ("+++", "---")
            ]
            same = not diff or all("in this invocation" in x for x in diff)
            if not same and path.endswith(RECOMPUTED[1]):
                print(f"warning: {path}: induction check recomputed ({len(diff) // 2} rows moved)")
                same = True
        print(("same (timings aside): " if same else "DIFFERS: ") + path)
        bad += not same
    print(f"{bad} file(s) differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
