#!/usr/bin/env bash
# Install with the dev tools and what the browser test needs (the webui extra, Playwright, and the
# Debian Chromium it drives), then run the whole test suite (CPU only). The demo and the trainer
# install none of these.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="${EXTRAS:-dev,prepare,corpora,webui,browser-test}" bash scripts/install.sh
bash scripts/install_chromium.sh
exec "${PYTHON:-python3}" -m pytest -q "$@"
