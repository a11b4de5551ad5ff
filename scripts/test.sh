#!/usr/bin/env bash
# Set up (scripts/setup.sh, plus Debian's chromium for the UI end-to-end test) and run the
# whole test suite. Extra arguments go to pytest (`-n 0` runs it in one process).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
bash scripts/setup.sh
if [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing Debian's chromium for the UI end-to-end test"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
      || echo "setup: could not install chromium; the UI end-to-end test will fail where MAGE_REQUIRE_BROWSER=1"
  else
    echo "setup: no /usr/bin/chromium (sudo apt-get install chromium); the UI end-to-end test will be skipped"
  fi
fi
. .venv/bin/activate
# Two pytest-xdist workers, a test file each at a time: most of the suite's time is one process
# waiting on another (a flow's imports, a Prefect server, DVC, vLLM's engine), so a second worker
# uses the second core; whole files keep a module's fixture (the DVC clone, a Ray cluster, the
# vLLM engine) in one worker, and the Ray tests that kill a worker by name see only their own.
# Files go out in collection order, the longest first (tests/conftest.py, LONGEST_FILES).
python -m pytest -n 2 --dist loadfile --no-loadscope-reorder "$@"
