#!/usr/bin/env bash
# What a new Prefect database costs the server that opens it: `prefect server database upgrade
# -y` (the migrations a server runs on start) on a bare PREFECT_HOME, against the same on a home
# that holds a copy of an already migrated database (what tests/conftest.py's
# migrated_prefect_db gives the tests that start their own server), in turn, ROUNDS each.
#
#   bash benchmarks/prefect_migrations.sh [ROUNDS]     # default 3; uses this checkout's .venv
#
# Prints one line per run (variant, wall, user and system CPU seconds), then the medians.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
python="$here/.venv/bin/python"
rounds="${1:-3}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
upgrade() {  # upgrade HOME: the migrations, timed into $work/time.txt
  env -u PREFECT_API_URL -u PREFECT_API_DATABASE_CONNECTION_URL PREFECT_HOME="$1" \
    PREFECT_SERVER_ANALYTICS_ENABLED=false \
    /usr/bin/time -o "$work/time.txt" -f "%e %U %S" "$python" -m prefect server database upgrade -y > /dev/null
}
upgrade "$work/template"  # the migrated database the second variant copies
for round in $(seq 1 "$rounds"); do
  for variant in bare migrated; do
    home="$work/$variant-$round"
    mkdir -p "$home"
    if [ "$variant" = migrated ]; then cp "$work/template/prefect.db" "$home/prefect.db"; fi
    upgrade "$home"
    read -r wall user sys < "$work/time.txt"
    printf '%s\t%s\t%s\t%s\n' "$variant" "$wall" "$user" "$sys" | tee -a "$work/runs.tsv"
  done
done
"$python" - "$work/runs.tsv" <<'PY'
import statistics, sys
rows = [line.split("\t") for line in open(sys.argv[1]).read().splitlines()]
for variant in ("bare", "migrated"):
    mine = [r for r in rows if r[0] == variant]
    wall = statistics.median(float(r[1]) for r in mine)
    cpu = statistics.median(float(r[2]) + float(r[3]) for r in mine)
    print(f"{variant}: median of {len(mine)}: wall {wall:.1f} s, CPU {cpu:.1f} s")
PY
