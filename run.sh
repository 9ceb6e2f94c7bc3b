#!/usr/bin/env bash
# The main job: sets up .venv on first use, then runs ffnlab (default: the bundled study).
set -euo pipefail
cd "$(dirname "$0")"
source scripts/setup.sh
if [ $# -eq 0 ]; then set -- list; fi
exec .venv/bin/ffnlab "$@"
