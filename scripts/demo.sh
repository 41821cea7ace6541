#!/usr/bin/env bash
# Install, then run the built-in demo on CPU: synthetic clips + tiny models -> prepare, train, export.
#   bash scripts/demo.sh [OUT_DIR] [demo flags...]   e.g. bash scripts/demo.sh runs/demo25 --family 2.5
# Rerunning continues the same run (--resume auto). OUT_DIR is read from the folder you ran this in (it
# landed inside the checkout, and the flags after it were dropped); without one, runs/demo in the checkout.
set -euo pipefail
OUT="runs/demo"
if [ $# -ge 1 ] && [ "${1#-}" = "$1" ]; then
    # an empty one (an unset variable) would be this folder itself
    [ -n "$1" ] || { echo "error: OUT_DIR is empty; give the demo's folder, e.g. bash scripts/demo.sh runs/demo" >&2; exit 2; }
    OUT="$1"; shift
    case "$OUT" in /*) ;; *) OUT="$PWD/$OUT" ;; esac
fi
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec "${PYTHON:-python3}" -m indextts_train demo "$OUT" "$@"
