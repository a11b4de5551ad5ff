#!/usr/bin/env bash
# Two CPU-bound tests side by side, as the suite's two pytest workers run them on two cores,
# each process with OMP_NUM_THREADS=$1 OpenMP threads (default 1, what tests/conftest.py sets);
# exits non-zero if either fails. Time it whole from outside, e.g. with /usr/bin/time, once with
# 1 and once with 2: BENCHMARKS.md, "The test suite".
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS="${1:-1}"
pytest=(python -m pytest -q -p no:cacheprovider)
"${pytest[@]}" "tests/test_trainer.py::test_interrupt_and_resume_gives_the_same_weights[False]" >/dev/null &
first=$!
"${pytest[@]}" tests/test_run.py::test_a_stopped_run_resumes_to_what_an_uninterrupted_one_leaves >/dev/null
wait "$first"
