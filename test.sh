#!/usr/bin/env bash
# The whole test suite: sets up .venv on first use, then runs pytest.
set -euo pipefail
cd "$(dirname "$0")"
source scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
