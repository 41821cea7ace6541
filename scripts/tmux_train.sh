#!/usr/bin/env bash
# Start or resume a run inside a tmux session that survives a dropped SSH connection.
#   scripts/tmux_train.sh SESSION OUTPUT_DIR [train-gpt flags...]
# Attach with `tmux attach -t SESSION`. The trainer writes its own timestamped OUTPUT_DIR/train.log; the
# pane's whole output (retries and crashes included) also goes to OUTPUT_DIR/console.log.
# Ctrl+C inside the session saves a checkpoint and exits; run this script again to continue.
set -euo pipefail
SESSION="${1:?usage: tmux_train.sh SESSION OUTPUT_DIR [train-gpt flags...]}"
OUTPUT_DIR="${2:?usage: tmux_train.sh SESSION OUTPUT_DIR [train-gpt flags...]}"; shift 2
HERE="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$OUTPUT_DIR"
if tmux has-session -t "=$SESSION" 2>/dev/null; then
    # The pane stays open after the run ends (remain-on-exit) so its last lines can be read; a
    # dead pane means the run is over and this call continues it.
    if [ "$(tmux list-panes -t "=$SESSION" -F '#{pane_dead}' | head -n 1)" != "1" ]; then
        echo "tmux session $SESSION is already running: tmux attach -t $SESSION"; exit 0
    fi
    echo "the run in tmux session $SESSION has ended; starting it again (it resumes from $OUTPUT_DIR)"
    tmux kill-session -t "=$SESSION"
fi
ARGS=$(printf ' %q' "$@")
# Ctrl+C reaches every process in the pane: `tee -i` ignores it, so the trainer's "saved ..." and
# "stopped ..." lines still reach the pane and console.log. remain-on-exit is set in the same tmux
# command as the session, before a fast run could end.
tmux new-session -d -s "$SESSION" \
    "bash $(printf %q "$HERE/smart_start.sh") $(printf %q "$OUTPUT_DIR")$ARGS 2>&1 | tee -i -a $(printf %q "$OUTPUT_DIR/console.log")" \
    \; set-option -w -t "=$SESSION:" remain-on-exit on
echo "started in tmux session $SESSION (tmux attach -t $SESSION); logs: $OUTPUT_DIR/train.log, $OUTPUT_DIR/console.log"
