#!/usr/bin/env bash
# The listen tests that run the official inference code: IndexTTS-2.5 (indextts25-inference) and IndexTTS2
# (indextts2-inference), each installed by scripts/install_inference.sh into an environment of its own
# under $INFERENCE_VENVS (default: ${TMPDIR:-/tmp}/indextts-train-inference; reused when there), on tiny
# random model folders, offline.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENVS="${INFERENCE_VENVS:-${TMPDIR:-/tmp}/indextts-train-inference}"
mkdir -p "$VENVS"
V25="$(PYTHON="$PYTHON" bash scripts/install_inference.sh indextts2.5 "$VENVS/indextts2.5" | tail -n 1)"
V2="$(PYTHON="$PYTHON" bash scripts/install_inference.sh indextts2 "$VENVS/indextts2" | tail -n 1)"
echo "inference environments: $V25, $V2"
# One worker per family (each test's xdist_group), not one per file: a file holds both families, and one
# worker per file left the other idle for half the lane (162 s against 137 s on a 2-core machine).
INDEXTTS_TEST_PYTHON_V25="$V25" INDEXTTS_TEST_PYTHON_V2="$V2" \
    exec "$PYTHON" -m pytest -q -s -p no:cacheprovider -n "${TEST_WORKERS:-auto}" --dist loadgroup \
    tests/test_listen_inference.py \
    tests/test_listen_run.py "$@"
