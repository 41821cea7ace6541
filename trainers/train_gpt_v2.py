#!/usr/bin/env python3
"""Drop-in for the community `trainers/train_gpt_v2.py`: same flags, runs `train-gpt`.

`python trainers/train_gpt_v2.py ARGS` == `train-gpt ARGS`, so existing shell scripts keep working
and gain exact resume.
"""

import sys
from pathlib import Path

# Runnable from a checkout without installing: put the project root on the path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from indextts_train.cli import train_gpt_main  # noqa: E402

if __name__ == "__main__":
    train_gpt_main()
