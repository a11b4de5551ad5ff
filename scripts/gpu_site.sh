#!/usr/bin/env bash
# Packs the Python packages scripts/gpu_check.sh needs beyond a GPU image's torch stack into
# .gpu-site.tar.xz, for a GPU machine that has no package registry (Python 3.12, x86-64).
# Run it here, where pip reaches a registry; the file is ignored by git.
set -euo pipefail
cd "$(dirname "$0")/.."
wheels=$(mktemp -d) site=$(mktemp -d)
trap 'rm -rf "$wheels" "$site"' EXIT
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$p")
done
grep -v '^antlr4' constraints/gpu-check.txt | grep -v '^#' >"$wheels/binary.txt"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d "$wheels" -r "$wheels/binary.txt"
# omegaconf's parser runtime is published as a source distribution only (pure Python)
python3 -m pip wheel -q --no-deps -w "$wheels" "$(grep '^antlr4' constraints/gpu-check.txt)"
for wheel in "$wheels"/*.whl; do python3 -m zipfile -e "$wheel" "$site"; done
tar -C "$site" -cf - . | xz -9 -T0 >.gpu-site.tar.xz.tmp && mv .gpu-site.tar.xz.tmp .gpu-site.tar.xz
du -h .gpu-site.tar.xz
