#!/usr/bin/env bash
# The w2v-BERT stages again under transformers 4.52.1, the version official IndexTTS pins (the main run
# uses the newest release `pip` picks). That transformers, and the huggingface_hub and tokenizers it
# accepts, go into a private folder put first on PYTHONPATH: the installed ones stay as they are.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
PIN="${TMPDIR:-/tmp}/indextts-train-transformers-4.52.1"
if ! PYTHONPATH="$PIN" "$PYTHON" -c "import transformers, sys; sys.exit(transformers.__version__ != '4.52.1')" 2>/dev/null; then
    "$PYTHON" -m pip install --quiet --no-deps --target "$PIN" "transformers==4.52.1" "huggingface_hub<1.0" "tokenizers<0.22"
fi
echo "w2v-BERT stages under transformers $(PYTHONPATH="$PIN" "$PYTHON" -c 'import transformers; print(transformers.__version__)')"
# Everything that runs w2v-BERT through transformers, the reference comparisons included. The Parquet
# corpus case is left to the main run: datasets needs the newer huggingface_hub.
PYTHONPATH="$PIN" exec "$PYTHON" -m pytest -q -p no:cacheprovider tests/test_prepare_w2vbert.py \
    tests/test_prepare_e2e.py -k "not parquet" "$@"
