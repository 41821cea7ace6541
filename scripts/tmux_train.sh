#!/usr/bin/env bash
# Start or resume a run inside a tmux session that survives a dropped SSH connection.
#   scripts/tmux_train.sh SESSION OUTPUT_DIR [train-gpt flags...]
# Attach with `tmux attach -t SESSION`; the log is also written to OUTPUT_DIR/train.log.
# Ctrl+C inside the session saves a checkpoint and exits; run this script again to continue.
set -euo pipefail
SESSION="${1:?usage: tmux_train.sh SESSION OUTPUT_DIR [train-gpt flags...]}"
OUTPUT_DIR="${2:?usage: tmux_train.sh SESSION OUTPUT_DIR [train-gpt flags...]}"; shift 2
HERE="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$OUTPUT_DIR"
if tmux has-session -t "$SESSION" 2>/dev/null; then
    echo "tmux session $SESSION is already running: tmux attach -t $SESSION"; exit 0
fi
ARGS=$(printf ' %q' "$@")
tmux new-session -d -s "$SESSION" \
    "bash $HERE/smart_start.sh $(printf %q "$OUTPUT_DIR")$ARGS 2>&1 | tee -a $(printf %q "$OUTPUT_DIR/train.log"); exec bash"
echo "started in tmux session $SESSION (tmux attach -t $SESSION); log: $OUTPUT_DIR/train.log"
