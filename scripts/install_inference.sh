#!/usr/bin/env bash
# Usage: bash scripts/install_inference.sh FAMILY VENV     (FAMILY: indextts2.5 or indextts2)
# Makes (or reuses) the Python environment VENV with IndexTTS's official inference package, for
# `indextts-train listen --inference-python VENV/bin/python`, and prints that path.
#   indextts2.5: indextts25-inference, beside this Python's torch.
#   indextts2:   indextts2-inference. It needs torchaudio, and PyPI's torchaudio wheels load torch's CUDA
#                libraries: with a CPU-only torch here, the venv gets its own torch 2.14.1 (PyPI's build,
#                which runs on the CPU too) and torchaudio 2.11.
# The venv sees this Python's packages (--system-site-packages), so torch, transformers and numpy are
# not installed twice when they fit. A venv that already imports the package is left as it is.
set -euo pipefail
FAMILY="${1:-}"
VENV="${2:-}"
PYTHON="${PYTHON:-python3}"
case "$FAMILY" in
    indextts2.5) MODULE=indextts25.api; PACKAGES=(indextts25-inference) ;;
    indextts2) MODULE=indextts.infer_v2; PACKAGES=(indextts2-inference) ;;
    *) echo "usage: bash scripts/install_inference.sh indextts2.5|indextts2 VENV" >&2; exit 2 ;;
esac
if [ -z "$VENV" ]; then
    echo "usage: bash scripts/install_inference.sh $FAMILY VENV (the folder of the environment to make or reuse)" >&2
    exit 2
fi
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv --system-site-packages "$VENV"
fi
if "$VENV/bin/python" -c "import $MODULE" >/dev/null 2>&1; then
    echo "$VENV/bin/python"
    exit 0
fi
if [ "$FAMILY" = indextts2 ] && ! "$VENV/bin/python" -c "import torchaudio" >/dev/null 2>&1; then
    if "$VENV/bin/python" -c "import sys, torch; sys.exit(torch.version.cuda is not None)" >/dev/null 2>&1; then
        PACKAGES=("torch==2.14.1" "torchaudio==2.11.*" "${PACKAGES[@]}")
    fi
fi
"$VENV/bin/python" -m pip install --quiet "${PACKAGES[@]}"
"$VENV/bin/python" -c "import $MODULE" >/dev/null
echo "$VENV/bin/python"
