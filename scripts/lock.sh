#!/usr/bin/env bash
# Updates test.lock, the versions scripts/setup.sh (so .ci/run and ./test.sh) installs the test
# extra at: the newest that pyproject.toml's ranges and scripts/lock-constraints.txt admit, for
# CPython 3.11 on x86-64 Linux (CI's machine). Run it on purpose, then run ./test.sh and commit both.
# Users' own installs (pip install ffnlab[...]) keep pyproject.toml's ranges; the lock is for CI.
set -euo pipefail
cd "$(dirname "$0")/.."
uv="$(command -v uv || true)"
if [ -z "$uv" ]; then
    tools="$(mktemp -d)"
    trap 'rm -rf "$tools"' EXIT
    python3 -m venv "$tools" && "$tools/bin/python" -m pip install -q uv
    uv="$tools/bin/uv"
fi
"$uv" pip compile pyproject.toml --extra test --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
    --constraint scripts/lock-constraints.txt --no-emit-package torch --custom-compile-command scripts/lock.sh \
    --quiet --output-file test.lock "$@"
echo "lock: test.lock updated; run ./test.sh before committing it" >&2
