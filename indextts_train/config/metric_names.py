"""Names a run's metrics go by: the loss keys, validation group names, and the --forgetting-limit syntax.

In the config layer because TrainConfig checks --best-metric and --forgetting-limit when it is built.
"""

from __future__ import annotations

import math
import re

from indextts_train.errors import UserError

LOSS_KEYS = ("loss", "text_loss", "mel_loss")  # lower is better; what a limit or the best metric may name
LISTEN_METRICS = ("listen/cer", "listen/speaker_sim")  # --best-metric from what `listen` heard (RUN/listen/)
# The generation check of each validation (train/listen_check.py), TensorBoard `val/gen/<key>` and
# `val/<group>/gen/<key>`: share of lines that stopped, median and worst generated/target length, repetition.
GEN_KEYS = ("stopped", "length_ratio", "length_ratio_worst", "repetition")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def group_name(text: str) -> str:
    """A name that is safe as a TensorBoard tag part and a JSON key: `val/<name>/loss`."""
    return _UNSAFE.sub("_", text).strip("_") or "unnamed"


def parse_forgetting_limit(text: str) -> dict[str | None, float]:
    """`5` (every group, and the total when there are no groups) or `zh=5,en=3` (percent, per group)."""
    limits: dict[str | None, float] = {}
    for part in text.split(","):
        name, sep, number = part.strip().rpartition("=")
        try:
            value = float(number)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0 or (sep and not name):
            raise UserError(f"train.forgetting_limit (--forgetting-limit) {text}: expected a percentage (e.g. 5) "
                            "or LANG=PCT pairs (e.g. zh=5,en=5)")
        key = group_name(name) if sep else None
        if key in limits:  # the second would silently replace the first
            raise UserError(f"train.forgetting_limit (--forgetting-limit) {text}: "
                            f"{'every language' if key is None else key} is given two limits; give each once")
        limits[key] = value
    return limits
