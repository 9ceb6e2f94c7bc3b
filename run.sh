#!/usr/bin/env bash
# The main job: sets up .venv on first use, then runs `ffnlab compare` (the default study on the
# bundled Shakespeare corpus) or, with arguments, `ffnlab ARGS`.
set -euo pipefail
cd "$(dirname "$0")"
source scripts/setup.sh
if [ $# -eq 0 ]; then set -- compare; fi
exec .venv/bin/ffnlab "$@"
