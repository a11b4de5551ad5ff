#!/usr/bin/env bash
# Create .venv (if missing) and install the project with the versions of constraints/cpu.txt.
# Usage: scripts/setup.sh            CPU machine (torch 2.13.0 CPU wheel)
#        MAGE_GPU=1 scripts/setup.sh GPU machine (vLLM extra; torch 2.14.0 comes with it)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
if [ "${MAGE_GPU:-0}" = "1" ]; then
  # vLLM pins its own torch; the CPU pins do not apply here.
  python -m pip install -q -e ".[test,gpu]"
else
  # Install the pinned torch on its own first: a looser request pulls the CUDA build.
  python -m pip install -q "torch==$(sed -n 's/^torch==//p' constraints/cpu.txt)"
  python -m pip install -q -c constraints/cpu.txt -e ".[test]"
fi
python -m pip check >/dev/null || { python -m pip check; exit 1; }
echo "setup: $(python --version), torch $(python -c 'import torch; print(torch.__version__)') in .venv"
