#!/usr/bin/env bash
# The whole test suite: sets up .venv on first use, then runs pytest.
set -euo pipefail
cd "$(dirname "$0")"
source scripts/setup.sh
# The report test opens the HTML report in headless Chromium; install it where we may (root with
# apt), else that one test skips and says why.
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "test: installing chromium and chromium-driver for the report test" >&2
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver) \
            >/tmp/ffnlab-apt.log 2>&1 || echo "test: chromium install failed (see /tmp/ffnlab-apt.log)" >&2
    fi
fi
exec .venv/bin/python -m pytest "$@"
