#!/usr/bin/env bash
# What `bash scripts/setup.sh` costs on a fresh clone (no .venv), for two or more commits side
# by side: each round clones every commit afresh and times its setup, the commits in turn, so
# that the machine's drift and pip's cache fall on all of them alike.
#
#   bash benchmarks/setup_time.sh WORKDIR ROUNDS COMMIT [COMMIT ...]
#
# Prints one line per setup: round, commit, wall seconds, user and system CPU seconds (of
# setup.sh and every process it waited for), then the median of each commit. pip reads the
# package index and its own cache as it finds them: run it where the test suite's setup runs.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
work="$1" rounds="$2"
shift 2
mkdir -p "$work"
results="$work/setup_time.tsv"
: > "$results"
for round in $(seq 1 "$rounds"); do
  for commit in "$@"; do
    clone="$work/$commit"
    rm -rf "$clone"
    git clone -q "$here" "$clone"
    git -C "$clone" checkout -q "$commit"
    if ! /usr/bin/time -o "$work/time.txt" -f "%e %U %S" bash "$clone/scripts/setup.sh" > "$work/setup-$commit-$round.log" 2>&1; then
      echo "setup of $commit failed: $work/setup-$commit-$round.log" >&2
      exit 1
    fi
    read -r wall user sys < "$work/time.txt"
    printf '%s\t%s\t%s\t%s\t%s\n' "$round" "$commit" "$wall" "$user" "$sys" | tee -a "$results"
  done
done
rm -rf "${work:?}"/*/.venv
python3 - "$results" <<'PY'
import statistics, sys
rows = [line.split("\t") for line in open(sys.argv[1]).read().splitlines()]
for commit in dict.fromkeys(r[1] for r in rows):
    mine = [r for r in rows if r[1] == commit]
    wall = statistics.median(float(r[2]) for r in mine)
    cpu = statistics.median(float(r[3]) + float(r[4]) for r in mine)
    print(f"{commit}: median of {len(mine)}: wall {wall:.0f} s, CPU {cpu:.0f} s")
PY
