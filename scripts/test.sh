#!/usr/bin/env bash
# Install with the dev extras, then run the whole test suite (CPU only).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec "${PYTHON:-python3}" -m pytest -q "$@"
