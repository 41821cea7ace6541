#!/usr/bin/env bash
# Install with the dev tools and what the browser test needs (the webui extra, Playwright, and the
# Debian Chromium it drives), then run the whole test suite (CPU only), and the w2v-BERT stages again
# under the transformers release official IndexTTS pins (4.52.1). The demo and the trainer
# install none of these.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="${EXTRAS:-dev,prepare,corpora,webui,browser-test}" bash scripts/install.sh
bash scripts/install_chromium.sh
# One worker per core (TEST_WORKERS to choose): each test computes on one thread. A file's tests stay
# on one worker, in their order, with its module fixtures built once; the files start longest first
# (tests/conftest.py, from tests/durations.json), so no long file runs alone at the end.
"${PYTHON:-python3}" -m pytest -q -n "${TEST_WORKERS:-auto}" --dist loadfile --no-loadscope-reorder "$@"
bash scripts/test_transformers_pin.sh  # the w2v-BERT stages under the transformers official IndexTTS pins
bash scripts/test_listen.sh  # synthesis with the official inference packages, in their own environments
