"""`indextts-train listen` through the real CLI: bad input is one line, exit 2, before any synthesis, and
nothing is written in the run folder. (Synthesis itself, with the official inference code in its own
environment, is tested in the scripts/test_listen.sh lane.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from helpers import stand_in_inference_folder, train_tiny_run

from indextts_train.errors import UserError
from indextts_train.prepare.tiny_asr import write_tiny_asr

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # trains a tiny run, then starts the CLI a few times


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


def _listen(run: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "indextts_train", "listen", str(run), *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})


@pytest.fixture(scope="module")
def run(tiny_data, tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("listen_run")
    out = folder / "run"
    train_tiny_run(tiny_data, out, max_steps=2)
    (out / "model_step7.pth").write_bytes(b"PK\x03\x04 not a checkpoint")  # someone's damaged file
    model_dir = stand_in_inference_folder(folder / "model", tiny_data["config"])  # as the official inference reads
    prompt = folder / "prompt.wav"
    import numpy as np
    import soundfile

    soundfile.write(prompt, np.sin(np.arange(16_000) / 7.0).astype(np.float32) * 0.3, 16_000)
    good = folder / "lines.jsonl"
    good.write_text(json.dumps({"text": "Hello there.", "prompt_audio": "prompt.wav"}) + "\n", encoding="utf-8")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder / "bare")], check=True, timeout=300)
    # an environment where the IndexTTS2 inference module is found (a stand-in: what is checked before
    # the ASR model is loaded is that it imports; synthesis itself is the listen lane's)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder / "found")], check=True, timeout=300)
    site = Path(subprocess.run([str(folder / "found" / "bin" / "python"), "-c", "import sysconfig; "
                                "print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True,
                               check=True).stdout.strip())
    (site / "indextts").mkdir(parents=True)
    (site / "indextts" / "__init__.py").write_text("")
    (site / "indextts" / "infer_v2.py").write_text("")
    return {"out": out, "model_dir": model_dir, "lines": good, "folder": folder,
            "asr": write_tiny_asr(folder / "asr"), "bare_python": folder / "bare" / "bin" / "python",
            "found_python": folder / "found" / "bin" / "python"}


def _refused(run: dict, args: list[str], expected: str) -> None:
    before = _snapshot(run["out"])
    result = _listen(run["out"], "--model-dir", str(run["model_dir"]), *args)
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and expected in result.stderr, result.stderr
    assert _snapshot(run["out"]) == before  # nothing written, not even RUN/listen/


def test_lines_file_with_a_missing_prompt(run):
    bad = run["folder"] / "bad_lines.jsonl"
    bad.write_text(json.dumps({"text": "fine", "prompt_audio": "prompt.wav"}) + "\n" +
                   json.dumps({"text": "no voice given"}) + "\n", encoding="utf-8")
    _refused(run, ["--lines", str(bad), "--asr-model", str(run["asr"])],
             f"--lines {bad} line 2: key 'prompt_audio' must be a non-empty string")
    bad.write_text(json.dumps({"text": "fine", "prompt_audio": "gone.wav"}) + "\n", encoding="utf-8")
    _refused(run, ["--lines", str(bad), "--asr-model", str(run["asr"])], "prompt_audio")


def test_asr_model_that_is_not_there(run, tmp_path):
    result_args = ["--lines", str(run["lines"]), "--asr-model", "nobody/no-such-asr-model",
                   "--inference-python", str(run["found_python"])]
    os.environ["HF_HUB_CACHE"] = str(tmp_path / "empty-cache")
    try:
        _refused(run, result_args, "--asr-model nobody/no-such-asr-model: not a local folder and not in the "
                                   "Hugging Face cache")
    finally:
        del os.environ["HF_HUB_CACHE"]


def test_checkpoint_that_is_not_complete(run):
    _refused(run, ["--lines", str(run["lines"]), "--asr-model", str(run["asr"]), "--checkpoints", "latest,step7"],
             "--checkpoints step7: ")
    _refused(run, ["--lines", str(run["lines"]), "--checkpoints", "step99"], "model_step99.pth does not exist")


def test_a_model_folder_the_official_inference_cannot_load(run, tmp_path):
    """A folder with a config.yaml and a gpt.pth alone (a download cut short): one line naming what is missing,
    before any work, instead of a failure per line once a checkpoint loads."""
    partial = tmp_path / "partial"
    partial.mkdir()
    for name in ("config.yaml", "feat1.pt", "feat2.pt", "w2v_stats.pt"):
        (partial / name).write_bytes((run["model_dir"] / name).read_bytes())
    _refused(run, ["--lines", str(run["lines"]), "--asr-model", str(run["asr"]), "--model-dir", str(partial)],
             f"model folder {partial}: not a whole IndexTTS2 release for the official inference: no s2mel.pth (its "
             "s2mel_checkpoint); no qwen/ (its qwen_emo_path); pass --model-dir")
    raw = yaml.safe_load((partial / "config.yaml").read_text())
    del raw["vocoder"]
    (partial / "config.yaml").write_text(yaml.safe_dump(raw))
    _refused(run, ["--lines", str(run["lines"]), "--asr-model", str(run["asr"]), "--model-dir", str(partial)],
             "config.yaml has no vocoder; no s2mel.pth")


def test_inference_environment_without_the_package(run):
    _refused(run, ["--lines", str(run["lines"]), "--asr-model", str(run["asr"]),
                   "--inference-python", str(run["bare_python"])],
             f"--inference-python {run['bare_python']} cannot import indextts.infer_v2")  # the rest: synthesize's tests
    # before the ASR model is loaded, which may be gigabytes to fetch: a newcomer without the package
    # is told so first (offline here, the missing ASR model would be the line otherwise)
    _refused(run, ["--lines", str(run["lines"]), "--asr-model", "nobody/no-such-asr-model",
                   "--inference-python", str(run["bare_python"])],
             f"--inference-python {run['bare_python']} cannot import indextts.infer_v2")


def test_a_scores_file_that_is_not_ours_to_append_to(run, tmp_path):
    """RUN/listen/scores.jsonl a FIFO (its reader would block) or a link to someone's file (an append would
    change it): listen refuses in one line before any work; the checkpoints table, which reads the
    file, still answers at once and leaves it alone."""
    scores = run["out"] / "listen" / "scores.jsonl"
    scores.parent.mkdir()
    someone = tmp_path / "notes.jsonl"
    someone.write_text("mine\n", encoding="utf-8")
    args = ["--lines", str(run["lines"]), "--asr-model", str(run["asr"])]
    try:
        os.mkfifo(scores)
        _refused(run, args, f"{scores}: is not a regular file, and listen appends only to a scores file of its own")
        table = subprocess.run([sys.executable, "-m", "indextts_train", "checkpoints", str(run["out"])],
                               capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert table.returncode == 0 and "model_step2.pth" in table.stdout, table.stdout + table.stderr
        scores.unlink()
        scores.symlink_to(someone)
        _refused(run, args, f"{scores}: is a link")
        assert someone.read_text(encoding="utf-8") == "mine\n"
        scores.unlink()
        (scores.parent / "index.html").write_text("<html>my page</html>", encoding="utf-8")  # someone's page
        _refused(run, args, f"{scores.parent / 'index.html'}: not a page listen wrote")
    finally:
        shutil.rmtree(scores.parent)


def test_a_device_listen_cannot_use_is_one_line_before_any_model_loads(monkeypatch) -> None:
    """--device foo, or cuda on a machine without one, ended in a traceback inside the ASR pipeline."""
    from indextts_train.listen.run import resolve_device

    for bad in ("foo", "cuda:x", "meta"):
        with pytest.raises(UserError, match=rf"^--device {bad}: not a device the models run on"):
            resolve_device(bad)
    assert resolve_device("cpu") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on this project's CPU machines
    with pytest.raises(UserError, match="^--device cuda:7: no CUDA GPU here; use --device cpu"):
        resolve_device("cuda:7")
