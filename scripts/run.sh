#!/usr/bin/env bash
# The main command: set up .venv and run the whole lifecycle as the DVC pipeline
# (seed population -> prepare model -> train -> evaluate -> report), by default on the CPU
# `tiny` preset and Kuhn Poker. Extra arguments go to `dvc exp run`, e.g.
#   bash scripts/run.sh -S algo=grpo            # another algorithm (Hydra override)
#   bash scripts/run.sh -S game=tic_tac_toe     # another game
# DVC composes params.yaml from params/ with the overrides, runs the stages whose inputs
# changed and records the run as an experiment (`dvc exp show`).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
bash scripts/setup.sh
. .venv/bin/activate
started=$(date +%s)
python -m dvc exp run "$@"
report=$(python -c "import yaml; print(yaml.safe_load(open('params.yaml'))['paths']['report'])")
echo
echo "lifecycle done in $(( $(date +%s) - started )) s; the report is in ${report}/:"
echo "  ${report}/report.md                 per opponent and per episode, with ceilings"
echo "  ${report}/success_by_episode.png    success by episode per opponent"
echo "  ${report}/learning_curves.png       training curves"
echo "  ${report}/metrics.json              headline numbers (dvc exp show lists them)"
