#!/usr/bin/env bash
# The GPU check: one command, sized for one 10-minute call on an H100 (scripts/gpu_check.py says what it
# runs). It writes gpu_check.json (into $OUT when that is set) for BENCHMARKS.md.
#
#   scripts/gpu_check.sh              # on a GPU machine with torch, transformers and peft
#   scripts/gpu_check.sh --dry-run    # the same steps at toy sizes on a CPU (tests/test_gpu_check.py)
#
# A GPU machine without a package registry: the Python packages it needs beyond torch,
# transformers, peft, tokenizers, safetensors, numpy, scipy, pyyaml, pytest and absl-py are
# listed, pinned, in constraints/gpu-check.txt. `scripts/gpu_site.sh`, run where pip reaches a
# registry, downloads them for Python 3.12 on x86-64 and packs them into .gpu-site.tar.xz
# (about 41 MiB); carry that file in the checkout, and this script unpacks it where the
# packages are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-$(command -v python3)}"
needed="import polars, hydra, omegaconf, pydantic, pyspiel, openskill"
if ! "$python" -c "$needed" 2>/dev/null; then
    [[ -f .gpu-site.tar.xz ]] || { echo "missing Python packages (constraints/gpu-check.txt): run scripts/gpu_site.sh where pip reaches a registry and carry .gpu-site.tar.xz" >&2; exit 2; }
    site=${TMPDIR:-/tmp}/mage-gpu-site
    mkdir -p "$site" && tar -xJf .gpu-site.tar.xz -C "$site"
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    "$python" -c "$needed"
fi
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
"$python" scripts/gpu_check.py --output "${OUT:-.}/gpu_check.json" "$@"
