#!/usr/bin/env bash
# Packs the Python packages scripts/gpu_check.sh needs beyond a GPU image's torch stack into
# .gpu-site.tar.xz, for a GPU machine that has no package registry (Python 3.12, x86-64).
# Run it here, where pip reaches a registry; the file is ignored by git.
#   MAGE_GPU_SITE_REQUIREMENTS: the pinned list (default constraints/gpu-check.txt)
#   MAGE_GPU_SITE: the archive to write (default .gpu-site.tar.xz)
set -euo pipefail
cd "$(dirname "$0")/.."
requirements=${MAGE_GPU_SITE_REQUIREMENTS:-constraints/gpu-check.txt}
archive=${MAGE_GPU_SITE:-.gpu-site.tar.xz}
wheels=$(mktemp -d) site=$(mktemp -d)
trap 'rm -rf "$wheels" "$site"' EXIT
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$p")
done
grep -v -e '^antlr4' -e '^#' "$requirements" >"$wheels/binary.txt" || true
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d "$wheels" -r "$wheels/binary.txt"
# omegaconf's parser runtime is published as a source distribution only (pure Python)
source=$(grep '^antlr4' "$requirements" || true)
[[ -z "$source" ]] || python3 -m pip wheel -q --no-deps -w "$wheels" "$source"
for wheel in "$wheels"/*.whl; do python3 -m zipfile -e "$wheel" "$site"; done
tar -C "$site" -cf - . | xz -9 -T0 >"$archive.tmp" && mv "$archive.tmp" "$archive"
du -h "$archive"
