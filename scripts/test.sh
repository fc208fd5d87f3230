#!/usr/bin/env bash
# The test command: the whole suite under TransformerLens 4.x (TransformerBridge), then the
# suite again under TransformerLens 2.18 (HookedTransformer) when .venvs/tl2 exists.
# Extra arguments go to pytest (e.g. -m "not slow" for the fast tier only).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -m pytest "$@"
if [ -x .venvs/tl2/bin/python ]; then
  echo "== TransformerLens 2.18 HookedTransformer environment =="
  .venvs/tl2/bin/python -m pytest -m "(not slow or tl2_slow) and not bridge_only" "$@"
fi
