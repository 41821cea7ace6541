#!/usr/bin/env bash
# Start, or resume when a checkpoint exists: the same command line every time.
#   scripts/smart_start.sh OUTPUT_DIR [train-gpt flags...]
# Retries after a crash (not after Ctrl+C/SIGTERM/SIGHUP, exit 130/143/129, bad input, exit 2, nor divergence, exit 3).
set -uo pipefail
OUTPUT_DIR="${1:?usage: smart_start.sh OUTPUT_DIR [train-gpt flags...]}"; shift
RETRIES="${RETRIES:-3}"
RETRY_DELAY="${RETRY_DELAY:-10}"  # seconds before a retry: time for a crashed GPU process to let go
for attempt in $(seq 0 "$RETRIES"); do
    if ls "$OUTPUT_DIR"/latest.pth "$OUTPUT_DIR"/model_step*.pth >/dev/null 2>&1; then
        echo "[smart_start] checkpoints found in $OUTPUT_DIR: resuming (attempt $attempt)"
    else
        echo "[smart_start] no checkpoint in $OUTPUT_DIR: starting fresh"
    fi
    train-gpt --output-dir "$OUTPUT_DIR" --resume auto "$@"
    code=$?
    case "$code" in
        0) echo "[smart_start] training finished"; exit 0 ;;
        2|3|129|130|143) echo "[smart_start] stopped with exit $code; not retrying"; exit "$code" ;;
        *) echo "[smart_start] exit $code (crash or OOM kill); resuming in $RETRY_DELAY s"; sleep "$RETRY_DELAY" ;;
    esac
done
echo "[smart_start] giving up after $RETRIES retries"; exit 1
