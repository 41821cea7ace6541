#!/usr/bin/env bash
# Start, or resume when a checkpoint exists: the same command line every time.
#   scripts/smart_start.sh OUTPUT_DIR [train-gpt flags...]
# Retries after a crash (not after Ctrl+C/SIGTERM/SIGHUP, exit 130/143/129, bad input, exit 2, nor divergence, exit 3).
set -uo pipefail
USAGE="usage: scripts/smart_start.sh OUTPUT_DIR [train-gpt flags...], e.g. scripts/smart_start.sh runs/am --train-manifest data/am/train.jsonl ..."
# Bad input is one line and exit 2, as train-gpt's own: bash's ${1:?} said "line 6: 1: usage..." with exit 1.
refuse() { echo "error: $1" >&2; exit 2; }
[ $# -ge 1 ] && [ -n "$1" ] || refuse "OUTPUT_DIR is missing; $USAGE"
case "$1" in -*) refuse "the first argument is the run folder, not a flag ($1); $USAGE" ;; esac
OUTPUT_DIR="$1"; shift
# This script passes --output-dir and --resume auto itself: a second --output-dir would train elsewhere than the
# folder it checks, and a --resume PATH would roll every retry after a crash back to PATH.
for arg in "$@"; do
    case "$arg" in
        --output-dir|--output-dir=*) refuse "$arg: the run folder is this script's first argument ($OUTPUT_DIR); leave --output-dir out" ;;
        --resume|--resume=*) refuse "$arg: this script resumes with --resume auto itself; leave --resume out (to start from a checkpoint, run train-gpt --resume PATH once)" ;;
    esac
done
command -v train-gpt >/dev/null 2>&1 || refuse "train-gpt is not on PATH: activate the environment it is installed in (. .venv/bin/activate) or install it (pip install -e .)"
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
