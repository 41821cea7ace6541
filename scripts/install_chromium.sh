#!/usr/bin/env bash
# Chromium for the browser test (tests/test_webui_browser.py), from the Debian/Ubuntu packages.
# Playwright drives it as it is: Playwright's own browser download is never used. Does nothing
# when a chromium is already on PATH.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "installing Chromium (apt-get install chromium) for the browser test"
LOG="$(mktemp)"
if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium; } >"$LOG" 2>&1; then
    tail -20 "$LOG"
    echo "could not install Chromium; install the 'chromium' package by hand, then rerun" >&2
    exit 1
fi
rm -f "$LOG"
