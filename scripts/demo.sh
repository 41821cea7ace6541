#!/usr/bin/env bash
# Install, then run the built-in demo on CPU: synthetic clips + tiny models -> prepare, train, export.
# Rerunning continues the same run (--resume auto).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec "${PYTHON:-python3}" -m indextts_train demo "${1:-runs/demo}"
