#!/usr/bin/env bash
# Creates .venv and installs ffnlab into it on first use; later calls return at once.
# Sourced by run.sh and test.sh. torch: a torch the chosen Python already has (CUDA or not) is
# used as it is (the venv sees system packages); otherwise the CPU build of the torch release that
# scripts/lock-constraints.txt names is installed before ffnlab, so pip never resolves a bare 'torch' to a multi-GB CUDA build. Every other
# package is installed at the version test.lock names (scripts/lock.sh updates it), so CI checks the
# same versions on every machine; FFNLAB_LOCK=none installs the newest that pyproject.toml's ranges
# admit instead (scripts/check_newest.sh), FFNLAB_VENV another folder than .venv.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${FFNLAB_VENV:-$root/.venv}"
python="${PYTHON:-python3}"
extras="${FFNLAB_EXTRAS:-test}"
lock="${FFNLAB_LOCK:-$root/test.lock}"
stamp="$venv/.ffnlab-installed"
want="$(cat "$root/pyproject.toml" "$root/scripts/setup.sh" "$root/scripts/lock-constraints.txt" \
    "$([ "$lock" = none ] && echo /dev/null || echo "$lock")" | sha256sum | cut -c1-16) $extras $lock"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    return 0 2>/dev/null || exit 0
fi
if [ ! -x "$venv/bin/python" ]; then
    if "$python" -c "import torch" 2>/dev/null; then
        echo "setup: using the torch of $python ($("$python" -c 'import torch; print(torch.__version__)'))" >&2
        "$python" -m venv --system-site-packages "$venv"
    else
        "$python" -m venv "$venv"
    fi
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
    echo "setup: installing torch (CPU build) into $venv" >&2
    "${pip[@]}" install "${FFNLAB_TORCH:-$(grep -o '^torch==[^ ]*' "$root/scripts/lock-constraints.txt")}" \
        || "${pip[@]}" install --index-url https://download.pytorch.org/whl/cpu torch
fi
pinned=()
if [ "$lock" != none ]; then pinned=(--constraint "$lock"); fi
echo "setup: installing ffnlab[$extras] into $venv (versions: ${lock##*/})" >&2
"${pip[@]}" install "${pinned[@]}" -e "$root[$extras]"
echo "$want" > "$stamp"
