#!/usr/bin/env bash
# Install indextts-train into the current Python. Reuses an installed PyTorch; where none is
# installed, installs the pinned CPU build torch==2.13.0 (a bare `torch` requirement would pull the
# newest CUDA build, several GB). Set TORCH_SPEC to install another build, e.g. a CUDA one.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if "$PYTHON" -c "import torch" 2>/dev/null; then
    echo "using installed torch $("$PYTHON" -c 'import torch; print(torch.__version__)')"
else
    echo "no PyTorch found: installing ${TORCH_SPEC:-torch==2.13.0} (CPU build)"
    "$PYTHON" -m pip install --quiet "${TORCH_SPEC:-torch==2.13.0}"
fi
"$PYTHON" -m pip install --quiet -e ".[${EXTRAS:-dev,prepare}]"  # prepare: the demo runs the real pipeline
