#!/usr/bin/env bash
# The main command: set up .venv and run the whole lifecycle as the DVC pipeline
# (seed population -> prepare model -> train -> evaluate -> report), by default on the CPU
# `tiny` preset and Kuhn Poker. Extra arguments go to `dvc exp run`, e.g.
#   bash scripts/run.sh -S algo=grpo            # another algorithm (Hydra override)
#   bash scripts/run.sh -S game=tic_tac_toe     # another game
# DVC composes params.yaml from params/ with the overrides, runs the stages whose inputs
# changed and records the run as an experiment (`dvc exp show`).
# One experiment at a time in a clone: `dvc exp run` writes its -S values into params.yaml
# before it meets DVC's lock, so a second one started beside a running one would change the
# first's parameters. A second call is refused with one line: run experiments one after
# another, or in separate clones. MAGE_SKIP_SETUP=1 uses the python on PATH as it is (the tests).
# Killed, the same command again resumes the experiment from its newest checkpoint (below).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
mkdir -p .dvc/tmp
exec 9>>.dvc/tmp/mage-experiment.lock
if ! flock -n 9; then
  echo "error: an experiment is already running in this clone (scripts/run.sh, pid $(cat .dvc/tmp/mage-experiment.pid 2>/dev/null || echo unknown)); wait for it, or run this one in another clone" >&2
  exit 2
fi
echo $$ > .dvc/tmp/mage-experiment.pid
if [ "${MAGE_SKIP_SETUP:-0}" != "1" ]; then
  bash scripts/setup.sh
  . .venv/bin/activate
fi
# a DVC command started by hand holds DVC's own lock: refuse too, before params.yaml is touched
python - "$*" <<'PY' || exit 2
import sys

import zc.lockfile

try:
    zc.lockfile.LockFile(".dvc/tmp/lock").close()
except zc.lockfile.LockError:
    sys.exit("error: a DVC command is running in this clone (it holds .dvc/tmp/lock); wait for it, or run this "
             "experiment in another clone")
PY
started=$(date +%s)
# `dvc exp run` starts by checking the workspace's outputs out of dvc.lock, by force: the train
# stage's run directory of an experiment that never finished is put back to what the lock
# records, or deleted where it records none, `persist` or not, and its checkpoints go with it.
# So this command, run again after an interrupted one with the same arguments, first finishes
# that experiment with `dvc repro` (params.yaml still holds its values, and `persist` keeps the
# checkpoints it resumes from); `dvc exp run` then finds every stage done and records it.
# Queued and temporary experiments do not run in this workspace: they are left out.
interrupted=.dvc/tmp/mage-experiment.args
in_workspace=1
case " $* " in
  *" --queue "*|*" --run-all "*|*" --temp "*) in_workspace=0 ;;
esac
if [ "$in_workspace" = 1 ]; then
  if [ -f "$interrupted" ] && [ "$(cat "$interrupted")" = "$*" ]; then
    echo "run: the same experiment was interrupted here; finishing it (its finished stages and iterations are kept)"
    python -m dvc repro
  fi
  printf '%s' "$*" > "$interrupted"
fi
python -m dvc exp run "$@"
if [ "$in_workspace" = 1 ]; then
  rm -f "$interrupted"
fi
report=$(python -c "import yaml; print(yaml.safe_load(open('params.yaml'))['paths']['report'])")
echo
echo "lifecycle done in $(( $(date +%s) - started )) s; the report is in ${report}/:"
echo "  ${report}/report.md                 per opponent and per episode, with ceilings"
echo "  ${report}/success_by_episode.png    success by episode per opponent"
echo "  ${report}/learning_curves.png       training curves"
echo "  ${report}/metrics.json              headline numbers (dvc exp show lists them)"
