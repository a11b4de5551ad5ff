#!/usr/bin/env bash
# Set up (scripts/setup.sh, plus Debian's chromium for the UI end-to-end test) and run the
# whole test suite. Extra arguments go to pytest.
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
python -m pytest "$@"
