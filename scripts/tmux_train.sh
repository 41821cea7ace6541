#!/usr/bin/env bash
# Start or resume a run inside a tmux session that survives a dropped SSH connection.
#   scripts/tmux_train.sh SESSION OUTPUT_DIR [train-gpt flags...]
# Attach with `tmux attach -t SESSION`. The trainer writes its own timestamped OUTPUT_DIR/train.log; the
# pane's whole output (retries and crashes included) also goes to OUTPUT_DIR/console.log.
# Ctrl+C inside the session saves a checkpoint and exits; run this script again to continue.
set -euo pipefail
USAGE="usage: scripts/tmux_train.sh SESSION OUTPUT_DIR [train-gpt flags...], e.g. scripts/tmux_train.sh am runs/am --train-manifest data/am/train.jsonl ..."
# Bad input is one line and exit 2, as train-gpt's own: bash's ${1:?} said "line 8: 1: usage..." with exit 1.
refuse() { echo "error: $1" >&2; exit 2; }
[ $# -ge 1 ] && [ -n "$1" ] || refuse "SESSION is missing (a name for the tmux session); $USAGE"
[ $# -ge 2 ] && [ -n "$2" ] || refuse "OUTPUT_DIR is missing (the run folder); $USAGE"
SESSION="$1"; OUTPUT_DIR="$2"
case "$SESSION" in -*) refuse "the first argument is the tmux session's name, not a flag ($SESSION); $USAGE" ;; esac
case "$OUTPUT_DIR" in -*) refuse "the second argument is the run folder, not a flag ($OUTPUT_DIR); $USAGE" ;; esac
# tmux renames a session holding '.' or ':' (my.run becomes my_run), and `tmux attach -t my.run` then finds none.
case "$SESSION" in *[.:]*) refuse "SESSION $SESSION: tmux does not keep '.' or ':' in a session name; use letters, digits, - or _ (e.g. ${SESSION//[.:]/_})" ;; esac
command -v tmux >/dev/null 2>&1 || refuse "tmux is not installed (apt-get install tmux); without it run scripts/smart_start.sh $OUTPUT_DIR ... under nohup"
shift 2
HERE="$(cd "$(dirname "$0")" && pwd)"
for arg in "$@"; do  # smart_start.sh refuses these too, but inside the session, where nobody may be looking
    case "$arg" in
        --output-dir|--output-dir=*) refuse "$arg: the run folder is this script's second argument ($OUTPUT_DIR); leave --output-dir out" ;;
        --resume|--resume=*) refuse "$arg: the run resumes with --resume auto by itself; leave --resume out (to start from a checkpoint, run train-gpt --resume PATH once)" ;;
    esac
done
mkdir -p -- "$OUTPUT_DIR"
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
# A mistake in the flags ends the run within seconds, in a pane nobody watches: after the start, wait until the
# trainer has checked its inputs (it then writes a "start" event) or the pane has ended, and say which.
EVENTS="$OUTPUT_DIR/events.jsonl"; LOG="$OUTPUT_DIR/console.log"
starts() { local n; n=$(grep -c '"kind": "start"' "$EVENTS" 2>/dev/null || true); echo "${n:-0}"; }
seen=$(starts); logged=$( { [ -f "$LOG" ] && wc -c < "$LOG"; } || echo 0)
# Ctrl+C reaches every process in the pane: `tee -i` ignores it, so the trainer's "saved ..." and
# "stopped ..." lines still reach the pane and console.log. remain-on-exit is set in the same tmux
# command as the session, before a fast run could end.
tmux new-session -d -s "$SESSION" \
    "bash $(printf %q "$HERE/smart_start.sh") $(printf %q "$OUTPUT_DIR")$ARGS 2>&1 | tee -i -a $(printf %q "$LOG")" \
    \; set-option -w -t "=$SESSION:" remain-on-exit on
deadline=$((SECONDS + ${START_WAIT:-120}))
while [ "$SECONDS" -lt "$deadline" ] && [ "$(starts)" -le "$seen" ]; do
    if [ "$(tmux list-panes -t "=$SESSION" -F '#{pane_dead}' 2>/dev/null | head -n 1)" != "0" ] \
            && [ "$(starts)" -le "$seen" ]; then
        output=$(tail -c "+$((logged + 1))" "$LOG" 2>/dev/null || true)  # this start's lines only
        cause=$(printf '%s\n' "$output" | grep -a '^error: ' | tail -n 1 || true)
        code=$(printf '%s\n' "$output" | sed -n 's/^\[smart_start\] stopped with exit \([0-9]*\).*/\1/p' | tail -n 1)
        echo "${cause:-error: the run ended before its first step} (tmux session $SESSION; its output: $LOG)" >&2
        exit "${code:-2}"
    fi
    sleep 0.5
done
echo "started in tmux session $SESSION (tmux attach -t $SESSION); logs: $OUTPUT_DIR/train.log, $LOG"
