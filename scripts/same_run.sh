#!/usr/bin/env bash
# Does a change keep the main command's results? Runs the lifecycle that the main command,
# `bash scripts/run.sh` (README, "Two commands"), runs (`dvc exp run`: population, tiny build,
# 20 iterations, evaluations, report) in clean clones of two commits, then compares every
# weight file (the tiny preset and each checkpoint), the rollout and evaluation tables, every
# file of the report (Markdown, JSON, plots) and the population manifest byte for byte, and the
# headline numbers.
#
#   bash scripts/same_run.sh run COMMIT WORKDIR      # clone COMMIT into WORKDIR/COMMIT and run it (~11 min on 2 cores)
#   bash scripts/same_run.sh compare CLONE_A CLONE_B  # compare two clones that ran it
#
# Both clones use this checkout's .venv (python -m puts each clone's own code first).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
weights() {  # the tiny preset's and every checkpoint's weights, as "sha256  relative path"
  (cd "$1" && sha256sum artifacts/models/*/model.safetensors artifacts/runs/*/checkpoints/ckpt-*/model.safetensors \
    | sed 's#artifacts/runs/[^/]*/##')
}
compare() {
  local a="$1" b="$2" differ=0
  diff <(weights "$a") <(weights "$b") || differ=1
  echo "weight files: $(weights "$a" | wc -l) in $a, $(weights "$b" | wc -l) in $b"
  for table in "$a"/artifacts/runs/*/rollouts/iteration-*.parquet; do
    cmp -s "$table" "$b/artifacts/runs/${table#"$a"/artifacts/runs/}" || { echo "differs: ${table#"$a"/}"; differ=1; }
  done
  # the population manifest, the evaluation tables and every file of the report, byte for byte
  # (the same files on both sides)
  diff <(cd "$a" && find artifacts/eval artifacts/report artifacts/population -type f | sort) \
       <(cd "$b" && find artifacts/eval artifacts/report artifacts/population -type f | sort) || differ=1
  local files=0
  while read -r file; do
    files=$((files + 1))
    cmp -s "$a/$file" "$b/$file" || { echo "differs: $file"; differ=1; }
  done < <(cd "$a" && find artifacts/eval artifacts/report artifacts/population -type f | sort)
  echo "evaluation and report files compared byte for byte: $files"
  "$here/.venv/bin/python" - "$a" "$b" <<'PY' || differ=1
import json, sys
a, b = (json.load(open(f"{root}/results/metrics.json")) for root in sys.argv[1:3])
print("report headline numbers:", "identical" if a == b else "DIFFER")
sys.exit(a != b)
PY
  if [ "$differ" = 0 ]; then echo "same: weights, rollout and evaluation tables, and the report"; else echo "NOT the same"; fi
  return "$differ"
}
case "${1:-}" in
  run)
    commit="$2" work="$3"
    rm -rf "${work:?}/$commit"
    git clone -q "$here" "$work/$commit"
    git -C "$work/$commit" checkout -q "$commit"
    ln -s "$here/.venv" "$work/$commit/.venv"
    (cd "$work/$commit" && . scripts/env.sh && . .venv/bin/activate && time python -m dvc exp run >run.log 2>&1) ;;
  compare) compare "$2" "$3" ;;
  *) sed -n '2,10p' "$0"; exit 2 ;;
esac
