"""What the page shows about a run, read from the run's own records.

Progress, the hardware plan, warnings and the settings-drift report come from the trainer's plain log
lines (train.log); loss curves from its TensorBoard event files (OUTPUT_DIR/logs/run/); checkpoint
status from the checkpoint module's `verify_checkpoint`, the function behind `indextts-train
verify`; what `listen` heard from RUN/listen/scores.jsonl. Nothing here computes what the trainer
computes. No module here imports Gradio.
"""

from __future__ import annotations

import functools
import re
import time
from pathlib import Path

from indextts_train.checkpoint.files import list_checkpoints, same_file, verify_checkpoint
from indextts_train.checkpoint.scores import SUMMARY_KEYS, summary_by_step
from indextts_train.ui.run_record import RECORD_NAME, read_record, unstamp
from indextts_train.webui.runs import Launch

STEP_LINE = re.compile(r"^step (\d+)/(\d+) ", re.M)
SAVED_LINE = re.compile(r"^saved (.+?) \(step (\d+)", re.M)
PLAN_HEAD = re.compile(r"\((cpu|cuda[^)]*)\): (fp32|bf16|fp16), micro-batch ")
DONE_LINE = re.compile(r"^done: \d+ steps", re.M)
ERROR_LINE = re.compile(r"^error: ", re.M)
START_HEAD = "=== start "  # runrecord.TextLog heads each start's lines with it
NOTICE_STARTS = ("warning:", "error:", "skipping ", "resuming from ", "--resume auto:", "stopped by signal")


def progress(text: str) -> tuple[int, int] | None:
    """(step, total steps) of the last progress line, None before the first one."""
    text = unstamp(text)  # lines carry `13:02:41 +0:04:10 ` before what they say
    found = STEP_LINE.findall(text)
    return (int(found[-1][0]), int(found[-1][1])) if found else None


def last_saved(text: str) -> str | None:
    """The checkpoint the run saved last (the one a stop leaves behind)."""
    text = unstamp(text)  # lines carry `13:02:41 +0:04:10 ` before what they say
    found = SAVED_LINE.findall(text)
    return found[-1][0] if found else None


def plan_text(text: str) -> str:
    """The hardware plan the run chose, as it printed it (first line and its reasons)."""
    text = unstamp(text)  # lines carry `13:02:41 +0:04:10 ` before what they say
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if PLAN_HEAD.search(line):
            reasons = []
            for reason in lines[i + 1:]:
                if not reason.startswith("  - "):
                    break
                reasons.append(reason)
            return "\n".join([line, *reasons])
    return ""


def notices(text: str) -> str:
    """Warnings, errors, resume decisions and the settings-drift report, in the order they came."""
    text = unstamp(text)  # lines carry `13:02:41 +0:04:10 ` before what they say
    kept, in_drift = [], False
    for line in text.splitlines():
        if line.startswith("settings changed since the checkpoint:"):
            kept.append(line)
            in_drift = True
        elif in_drift and line.startswith("  "):
            kept.append(line)
        else:
            in_drift = False
            if line.startswith(NOTICE_STARTS) or line.startswith("Traceback"):
                kept.append(line)
    return "\n".join(kept)


def eta_text(launch: Launch, step: int, total: int, now: float | None = None) -> str:
    """Remaining time from the pace seen since this page started watching the run."""
    now = time.time() if now is None else now
    if not launch.steps_seen or launch.steps_seen[-1][1] != step:
        launch.steps_seen[1:] = [(now, step)]  # the first sighting and the latest are all the pace needs
    (t0, s0), (t1, s1) = launch.steps_seen[0], launch.steps_seen[-1]
    if s1 <= s0 or t1 <= t0:
        return "ETA: measuring"
    seconds = int((total - step) * (t1 - t0) / (s1 - s0))
    return f"ETA {seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def last_start(text: str) -> str:
    """The part of train.log written by the last start (the trainer heads each start with `=== start`)."""
    return text[text.rfind(START_HEAD):] if START_HEAD in text else text


def recorded_status(text: str) -> str:
    """How a run nobody is watching ended, from its log: finished, stopped or refused, step, checkpoint."""
    part = unstamp(last_start(text))
    if DONE_LINE.search(part):
        how = "finished"
    elif "stopped by signal" in part or "stopped:" in part:
        how = "stopped"
    elif ERROR_LINE.search(part):
        how = "ended with an error"
    else:
        how = "not running (it ended without a last line: killed?)"
    parts = [f"{how} (read from train.log; not running now)"]
    step = progress(part)
    if step:
        parts.append(f"step {step[0]}/{step[1]}")
    saved = last_saved(part)
    if saved:
        parts.append(f"checkpoint {saved}")
    return " · ".join(parts)


def status_line(launch: Launch | None, text: str) -> str:
    """One line: running/ended, step, ETA, exit code, the checkpoint left behind."""
    if launch is None:
        return recorded_status(text) if text.strip() else "no run in this output dir yet"
    step = progress(text)
    parts = []
    if launch.running():
        parts.append(f"running (PID {launch.pid})")
        if step:
            parts += [f"step {step[0]}/{step[1]}", eta_text(launch, *step)]
        else:
            parts.append("starting")
    else:
        code = launch.exit_code
        parts.append(f"exited with code {code}" if code is not None else f"ended (PID {launch.pid})")
        if step:
            parts.append(f"step {step[0]}/{step[1]}")
    saved = last_saved(text)
    if saved:
        parts.append(f"checkpoint {saved}")
    return " · ".join(parts)


def loss_curves(output_dir: Path) -> list[tuple[str, int, float]]:
    """(series, step, value) for every loss scalar in the run's TensorBoard files.

    A run writes logs/run (one folder across resumes, TensorBoard's purge step hiding what a killed
    process logged past its checkpoint); runs begun before that wrote a run_* folder per invocation,
    and where a killed run logged steps that the resumed one logged again, the later folder wins.
    """
    points: dict[tuple[str, int], float] = {}
    for folder in sorted((Path(output_dir) / "logs").glob("run*")):
        files = sorted(folder.glob("events.out.tfevents.*"))
        version = tuple((f.name, f.stat().st_size) for f in files)
        points.update(_folder_losses(str(folder), version))
    return sorted(((tag, step, value) for (tag, step), value in points.items()), key=lambda row: (row[0], row[1]))


@functools.lru_cache(maxsize=64)
def _folder_losses(folder: str, version: tuple) -> dict[tuple[str, int], float]:
    """One folder's loss points; `version` (file names and sizes) makes a grown file a cache miss."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(folder, size_guidance={"scalars": 0})
    accumulator.Reload()
    return {(tag, event.step): event.value for tag in accumulator.Tags().get("scalars", [])
            if tag.endswith("loss") for event in accumulator.Scalars(tag)}


@functools.lru_cache(maxsize=256)
def _verdict(path: str, mtime_ns: int, size: int) -> dict:
    """verify_checkpoint of one file version (a checkpoint never changes in place: it is replaced)."""
    return verify_checkpoint(Path(path)).to_dict()


def verdict(path: Path) -> dict:
    stat = path.stat()
    return _verdict(str(path), stat.st_mtime_ns, stat.st_size)


def checkpoint_rows(output_dir: Path, curves: list[tuple[str, int, float]]) -> list[dict]:
    """Every checkpoint of the run: file, status, step, epoch, val loss at its step, latest/best, size."""
    output_dir = Path(output_dir)
    val = {step: value for tag, step, value in curves if tag == "val/loss"}
    heard = summary_by_step(output_dir)  # RUN/listen/scores.jsonl: means per checkpoint
    best = output_dir / "best.pth"
    rows = []
    for path in [*list_checkpoints(output_dir), *([best] if best.is_file() else [])]:
        try:
            found = verdict(path)
        except OSError:
            continue  # rotated away while we looked
        summary = found.get("summary", {})
        step = summary.get("step")
        marks = [name for name in ("latest.pth", "best.pth")
                 if (output_dir / name).is_file() and same_file(path, output_dir / name)]
        rows.append({"file": str(path), "status": found["status"], "step": step, "epoch": summary.get("epoch"),
                     "val_loss": None if val.get(step) is None else round(val[step], 4), "marks": ", ".join(marks),
                     **{key: _rounded((heard.get(step) or {}).get(key)) for key in SUMMARY_KEYS},
                     "size_mb": round(summary.get("sizes", {}).get("file_bytes", 0) / 2**20, 2),
                     "reasons": "; ".join(found.get("reasons", []))})
    return rows


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def recorded_command(output_dir: Path) -> str:
    """The command line run.yaml recorded for the last start ('' when there is no record)."""
    record = read_record(Path(output_dir) / RECORD_NAME)
    return str(record.get("command_line", "")) if record else ""
