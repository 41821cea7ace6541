"""listen/run.py's checks before any work, in the main lane (test_listen_run.py, end to end with the real
inference packages, is the listen lane's): --device, then the inference environment, then the ASR model.

The run's checkpoints and the ASR model are stand-ins (what is checked here comes before either is read); the
lines, the model folder and the run folder are real, and so is the probe of the inference interpreter."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch
from helpers import ROOT, fake_inference_python, stand_in_inference_folder

from indextts_train.errors import UserError
from indextts_train.listen import run as listen_run
from indextts_train.listen.choose import Chosen
from indextts_train.listen.run import ListenOptions, plan, resolve_device


def test_a_device_torch_cannot_parse_is_one_line() -> None:
    """Digits prepare's rule lets through but torch.device will not parse ended in torch's RuntimeError."""
    for bad in ("cuda:01", "cuda:99999999999999999999"):
        with pytest.raises(UserError, match=rf"^--device {bad}: not a device the models run on; use cpu, cuda or "
                                            r"cuda:N"):
            resolve_device(bad)


def test_a_gpu_index_past_the_machines_count_is_one_line(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a machine with two GPUs, on any machine
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda:1") == "cuda:1"
    with pytest.raises(UserError, match=r"^--device cuda:7: this machine has 2 GPU\(s\), cuda:0 to cuda:1$"):
        resolve_device("cuda:7")


@pytest.fixture
def inputs(tmp_path, monkeypatch) -> dict:
    """A run folder with one checkpoint to hear (a stand-in: chosen, never read here), a lines file, an IndexTTS2
    model folder with what the official inference needs (stand-in bytes), and `said`: every progress line, and
    "ASR loaded" where the ASR model would load."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    monkeypatch.setattr(listen_run, "choose_checkpoints",
                        lambda run, which: ([Chosen(2, run / "model_step2.pth")], []))
    said: list[str] = []
    monkeypatch.setattr(listen_run, "load_recogniser", lambda model, device: said.append("ASR loaded"))
    soundfile.write(tmp_path / "prompt.wav", np.zeros(1600, dtype=np.float32), 16_000)  # its header is read
    lines = tmp_path / "lines.jsonl"
    lines.write_text(json.dumps({"text": "Hello there.", "prompt_audio": "prompt.wav"}) + "\n", encoding="utf-8")
    model_dir = stand_in_inference_folder(tmp_path / "model", ROOT / "configs" / "tiny.yaml")
    return {"run": run_dir, "lines": lines, "model_dir": model_dir, "said": said, "folder": tmp_path}


def _options(inputs: dict, python: Path, device: str = "cpu") -> ListenOptions:
    return ListenOptions(run_dir=inputs["run"], lines=inputs["lines"], model_dir=inputs["model_dir"],
                         inference_python=python, device=device, say=inputs["said"].append)


@pytest.mark.slow  # starts the probe's process
def test_the_probe_is_announced_and_comes_before_the_asr_model(inputs) -> None:
    """The probe may wait minutes (a cold import, or a program that never exits, up to its limit): listen said
    nothing meanwhile. Now one line says what is checked and for how long, and the ASR model loads after."""
    python = fake_inference_python(inputs["folder"], "indextts.infer_v2", "")
    work = plan(_options(inputs, python))
    assert work.python == python and work.device == "cpu"
    assert inputs["said"] == [f"checking that --inference-python {python} imports indextts.infer_v2 (waiting up to "
                              f"300 s)", "ASR loaded"]


@pytest.mark.slow  # starts the probe's process
def test_a_broken_inference_module_is_refused_before_the_asr_model(inputs) -> None:
    """Installed, but its module fails on import: one line before the ASR model loads (it was found by
    find_spec, and every line failed after the ASR model loaded and synthesis began)."""
    python = fake_inference_python(inputs["folder"], "indextts.infer_v2",
                                   "raise ImportError(\"cannot import name 'IndexTTS2'\")\n")
    with pytest.raises(UserError, match=r"cannot import indextts.infer_v2, the IndexTTS2 inference code "
                                        r"\(ImportError: cannot import name 'IndexTTS2'\)"):
        plan(_options(inputs, python))
    assert "ASR loaded" not in inputs["said"]
    assert not (inputs["run"] / "listen").exists()  # nothing written


def test_a_bad_device_is_refused_before_the_probe_and_the_asr_model(inputs) -> None:
    with pytest.raises(UserError, match=r"^--device foo: not a device the models run on"):
        plan(_options(inputs, inputs["folder"] / "no-python", device="foo"))
    assert inputs["said"] == []


def test_a_checkpoint_of_the_other_family_is_refused_before_any_work(inputs, monkeypatch) -> None:
    """An IndexTTS-2.5 run heard through an IndexTTS2 model folder: the export refused it only once the work had
    begun (RUN/listen/.model-PID and TensorBoard's folder left behind), advising a --config listen has not."""
    monkeypatch.setattr(listen_run, "choose_checkpoints", lambda run, which: (
        [Chosen(2, run / "model_step2.pth", "b", "IndexTTS-2.5")], []))
    with pytest.raises(UserError, match=r"model_step2.pth is an IndexTTS-2.5 checkpoint, but the model folder .* is "
                                        r"IndexTTS2 \(its config.yaml\); pass --model-dir with the IndexTTS-2.5 model "
                                        "folder the run was trained from$"):
        plan(_options(inputs, inputs["folder"] / "no-python"))
    assert not (inputs["run"] / "listen").exists() and inputs["said"] == []


def test_a_tokenizer_the_run_record_names_that_is_gone_is_refused_before_any_work(inputs) -> None:
    """The export fell back to the model folder's base vocabulary, failed after the work began, and advised
    `--tokenizer`, a flag listen does not have."""
    from indextts_train.ui.run_record import write_run_record

    write_run_record(inputs["run"], {"tokenizer": str(inputs["folder"] / "gone.tiktoken")}, {}, {}, 0.0)
    with pytest.raises(UserError, match=r"run.yaml: the run trained with the tokenizer .*gone.tiktoken, which is not "
                                        "there any more .*; put it back at that path$"):
        plan(_options(inputs, inputs["folder"] / "no-python"))
    assert not (inputs["run"] / "listen").exists()


def test_a_tokenizer_with_other_tokens_than_the_checkpoint_is_refused_before_any_work(inputs, monkeypatch) -> None:
    """Another file at the path run.yaml names (the base vocabulary copied over the grown one): the export failed
    once the work had begun, advising --tokenizer."""
    import base64

    from indextts_train.ui.run_record import write_run_record

    tokenizer = inputs["folder"] / "grown.tiktoken"  # 256 ranks: 1929 tokens with the specials
    tokenizer.write_text("".join(f"{base64.b64encode(bytes([i])).decode()} {i}\n" for i in range(256)))
    write_run_record(inputs["run"], {"tokenizer": str(tokenizer)}, {}, {}, 0.0)
    monkeypatch.setattr(listen_run, "choose_checkpoints", lambda run, which: (
        [Chosen(2, run / "model_step2.pth", None, None, 1979)], []))
    with pytest.raises(UserError, match=r"grown.tiktoken, which has 1929 tokens now, but .*model_step2.pth has 1979; "
                                        "put the tokenizer the run trained with back at that path$"):
        plan(_options(inputs, inputs["folder"] / "no-python"))
    assert not (inputs["run"] / "listen").exists()


def test_a_line_id_heard_with_another_text_is_refused(inputs) -> None:
    """A second --lines file numbers its lines line001, ... too: a line whose id was heard with another text was
    taken as heard ("every chosen checkpoint was already heard; nothing to do") and never spoken."""
    from indextts_train.checkpoint.scores import RECORD_FORMAT, append_record, scores_path

    record = {"format": RECORD_FORMAT, "step": 2, "line_id": "line001", "ok": True, "branch": None,
              "text": "Another line.", "language": None, "prompt_audio": "prompt.wav"}
    append_record(scores_path(inputs["run"]), record)
    with pytest.raises(UserError, match=r"line id 'line001' was heard before with another text, language or prompt "
                                        r"\('Another line.', .*scores.jsonl\); give this line an 'id' of its own"):
        plan(_options(inputs, inputs["folder"] / "no-python"))
    scores_path(inputs["run"]).unlink()  # the same line, its prompt named from another folder: heard
    append_record(scores_path(inputs["run"]), {**record, "text": "Hello there.",
                                                "prompt_audio": str(inputs["folder"] / "elsewhere" / "prompt.wav")})
    assert plan(_options(inputs, inputs["folder"] / "no-python")).todo == []


def test_a_rollback_s_new_file_is_heard_again(inputs, monkeypatch) -> None:
    """The scores of an abandoned file of step 2 made the new branch's step-2 file count as heard."""
    from indextts_train.checkpoint.scores import RECORD_FORMAT, append_record, scores_path

    append_record(scores_path(inputs["run"]), {"format": RECORD_FORMAT, "step": 2, "line_id": "line001", "ok": True,
                                               "branch": "old", "text": "Hello there.", "language": None,
                                               "prompt_audio": "prompt.wav"})
    monkeypatch.setattr(listen_run, "resolve_inference_python", lambda *args, **kwargs: Path("python"))
    for branch, todo, folder in (("old", 0, "step2"), ("new", 1, "step2.new")):
        monkeypatch.setattr(listen_run, "choose_checkpoints", lambda run, which, b=branch: (
            [Chosen(2, run / "model_step2.pth", b, "IndexTTS2")], []))
        work = plan(_options(inputs, inputs["folder"] / "no-python"))
        # the new file's WAVs go beside the abandoned file's, which its records still name: none is replaced
        assert len(work.todo) == todo and work.folders == {2: folder}


def test_wavs_go_to_their_steps_folder_unless_another_branch_was_heard_there() -> None:
    from indextts_train.listen.run import wav_folder

    records = [{"step": 2, "branch": "a"}, {"step": 4}]  # step 4: a record written before records named a branch
    assert wav_folder(2, "a", records) == "step2" and wav_folder(2, "b", records) == "step2.b"
    assert wav_folder(4, "b", records) == "step4" and wav_folder(6, "b", records) == "step6"
    assert wav_folder(2, None, records) == "step2"  # a file without lineage: the step's folder, as before


def test_a_failed_export_leaves_no_temporary_folder(inputs, monkeypatch) -> None:
    """An export refused inside listen left RUN/listen/.model-PID for a later listen to clear."""
    def refuse(checkpoint, model_dir, folder, tokenizer):
        folder.mkdir(parents=True)
        (folder / listen_run.MARKER).write_text("ours")
        raise UserError("refused")

    monkeypatch.setattr(listen_run, "make_model_folder", refuse)
    work = listen_run.Plan([], [], inputs["model_dir"], None, "cpu")
    with pytest.raises(UserError, match="refused"):
        listen_run._speak(_options(inputs, Path("python")), work, Chosen(2, inputs["run"] / "model_step2.pth"), [])
    assert list((inputs["run"] / "listen").iterdir()) == []


def test_a_prompt_that_is_no_audio_is_refused_before_any_work(inputs) -> None:
    """A text file named .wav as the prompt: each line failed in scoring, after every checkpoint's export and
    synthesis (exit 1), instead of one line before any work."""
    (inputs["folder"] / "prompt.wav").write_text("not audio\n")
    with pytest.raises(UserError, match=r"^--lines .*lines.jsonl: line 'line001': prompt_audio .*prompt.wav is no "
                                        r"audio file this reads \(.*\); give a WAV, FLAC or OGG clip$"):
        plan(_options(inputs, inputs["folder"] / "no-python"))
    soundfile.write(inputs["folder"] / "prompt.wav", np.zeros(0, dtype=np.float32), 16_000)
    with pytest.raises(UserError, match=r"prompt.wav holds 0.0 s of audio; give a clip of a few seconds"):
        plan(_options(inputs, inputs["folder"] / "no-python"))
    assert not (inputs["run"] / "listen").exists() and inputs["said"] == []


def test_a_record_names_its_checkpoint_s_branch(inputs, monkeypatch) -> None:
    """What a record stands for after a rollback (scores.py): the branch of the file that was heard."""
    from types import SimpleNamespace

    from indextts_train.checkpoint.scores import read_records, scores_path
    from indextts_train.listen.lines import read_lines_file
    from indextts_train.listen.synthesize import SynthesisResult

    lines = read_lines_file(inputs["lines"])
    chosen = Chosen(2, inputs["run"] / "model_step2.pth", "20260101-000000-abcdef", "IndexTTS2")
    monkeypatch.setattr(listen_run, "_speak", lambda options, work, c, todo: (
        [SynthesisResult(line.line_id, inputs["run"] / "x.wav", 0.0, False, "stand-in") for line in todo], 32))
    from indextts_train.config.family import INDEXTTS2

    work = listen_run.Plan(lines, [], inputs["model_dir"], INDEXTTS2, "cpu", recogniser=SimpleNamespace(label={}))
    board = SimpleNamespace(line=lambda record, wav: None, checkpoint=lambda step, records: None)
    listen_run._hear(_options(inputs, Path("python")), work, chosen, lines, board)
    (record,) = read_records(scores_path(inputs["run"]))
    assert record["branch"] == "20260101-000000-abcdef" and record["step"] == 2 and record["ok"] is False
