"""The web page is confined: every path it is given resolves (symlinks followed) inside a --root, or
the action is refused with one line; Stop signals only a process the page started or a train run of
that very output dir (its command line, read from /proc), never whatever PID a lock file names."""

from __future__ import annotations

import fcntl
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from indextts_train.config.run_inputs import TrainOptions
from indextts_train.config.schema import field_types
from indextts_train.config.settings import TrainConfig
from indextts_train.errors import UserError
from indextts_train.ui.run_record import write_run_record
from indextts_train.webui import form as forms
from indextts_train.webui import records
from indextts_train.webui.roots import MAX_SCAN, Roots
from indextts_train.webui.runs import LOCK_NAME, NOT_READ, RunRegistry, _is_train_command, is_train_run_of, read_log
from indextts_train.webui.server import PageServer
from indextts_train.webui.trainflags import FLAGS, other_flags


@pytest.fixture()
def folders(tmp_path: Path) -> dict[str, Path]:
    root, outside = tmp_path / "root", tmp_path / "outside"
    for folder in (root / "run", outside):
        folder.mkdir(parents=True)
    (outside / "bpe.model").write_bytes(b"not ours to copy")
    (root / "link").symlink_to(outside)  # inside by name, outside once followed
    return {"root": root, "outside": outside}


def test_paths_resolve_inside_a_root_or_are_refused(folders) -> None:
    roots = Roots([folders["root"]])
    assert roots.inside(folders["root"] / "run" / "gpt.pth", "-o") == folders["root"].resolve() / "run" / "gpt.pth"
    for path in (folders["outside"] / "bpe.model", folders["root"] / "link" / "bpe.model",
                 folders["root"] / ".." / "outside"):
        with pytest.raises(UserError, match="outside the folders this page may touch"):
            roots.inside(path, "Tokenizer")
    assert Roots([folders["root"], folders["outside"]]).inside(folders["root"] / "link", "x") == \
        folders["outside"].resolve()
    # A form is no shell: $HOME typed there is said, not made into a folder named "$HOME" under the root.
    with pytest.raises(UserError, match=r"Output dir \$HOME/runs: the page expands no shell variable"):
        Roots([folders["root"]]).inside("$HOME/runs", "Output dir")
    with pytest.raises(UserError, match="Tokenizer '/data/bpe.model': drop the quotes; the page takes a path as"):
        Roots([folders["root"]]).inside("'/data/bpe.model'", "Tokenizer")  # pasted from a shell line
    with pytest.raises(UserError, match="one manifest per line; put each of these on a line of its own"):
        Roots([folders["root"]]).manifest(f"{folders['root']}/a.jsonl, {folders['root']}/b.jsonl", "Manifests")
    (folders["root"] / "$HOME").mkdir()  # unless a folder of that very name is there
    assert roots.inside(folders["root"] / "$HOME", "x") == folders["root"].resolve() / "$HOME"


@pytest.mark.parametrize("extra", ["--tokenizer {out}/bpe.model", "--tokenizer={out}/bpe.model",
                                   "--val-manifest {out}/am.jsonl::am@0.5", "--resume {out}/x.pth",
                                   "--output-dir {root}/link/run", "--from-run {out}/run.yaml",
                                   "--base-checkpoint={root}/link/gpt.pth", "--config '{root}/../outside/c.yaml'"])
def test_every_path_flag_in_other_flags_is_checked(folders, extra) -> None:
    roots = Roots([folders["root"]])
    with pytest.raises(UserError, match="outside the folders"):
        other_flags(extra.format(out=folders["outside"], root=folders["root"]), roots, set())
    assert other_flags(f"--resume auto --output-dir={folders['root']}/run", roots, set()) == [
        "--resume=auto", f"--output-dir={folders['root'].resolve()}/run"]


def test_a_program_or_model_a_run_would_start_or_load_lies_inside_the_roots(folders, monkeypatch) -> None:
    """--listen-every starts the listener with --listen-inference-python and loads --listen-asr-model:
    typed on the page, each passed as plain text before, so the server ran any program it was named."""
    root, outside = folders["root"], folders["outside"]
    monkeypatch.chdir(root)
    roots = Roots([root])
    for extra in ["--listen-inference-python /usr/bin/id", f"--listen-inference-python {root}/link/python",
                  f"--listen-inference-python={root}/..", f"--listen-asr-model {outside}",
                  f"--listen-asr-model={root}/link", "--listen-asr-model ../outside", "--listen-asr-model /etc",
                  "--listen-asr-model=../../x/y"]:
        with pytest.raises(UserError, match="not a program in the folders this page may touch|outside the folders"):
            other_flags(extra, roots, set())
    (root / "venv" / "bin").mkdir(parents=True)
    (root / "venv" / "bin" / "python").symlink_to(sys.executable)  # a venv's python: a link to the system's
    (root / "asr").mkdir()
    assert other_flags("--listen-inference-python venv/bin/python --listen-asr-model=asr "
                       "--listen-asr-model openai/whisper-small", roots, set()) == [
        f"--listen-inference-python={root.resolve()}/venv/bin/python", f"--listen-asr-model={root.resolve()}/asr",
        "--listen-asr-model=openai/whisper-small"]
    monkeypatch.setattr(sys, "argv", ["train-gpt"])
    good = {"train_manifests": [f"{root}/t.jsonl"], "output_dir": str(root / "run"), "config": str(root / "c.yaml"),
            "tokenizer": None, "base_checkpoint": None, "resume": "auto"}
    write_run_record(root, good, {"train": {"listen_every": 1, "listen_inference_python": "/usr/bin/id"}}, {}, 0.0)
    with pytest.raises(UserError, match="its --listen-inference-python /usr/bin/id: not a program in the folders"):
        other_flags(f"--from-run {root}/run.yaml", roots, set())


def test_every_text_flag_the_page_passes_as_plain_text_names_no_file() -> None:
    """The page passes a `value` flag as checked text, unresolved: a new text option that names a file, a
    folder or a program must say so in the schema (option(names=...)) or be a path, or it leads outside."""
    types = {**field_types(TrainOptions), **field_types(TrainConfig)}
    text = {flag for flag, spec in FLAGS.items() if spec.kind == "value" and "str" in str(types[spec.name])}
    assert text == {"--on-vocab-change", "--best-metric", "--forgetting-limit", "--listen-device",
                    "--borrow-language", "--train-scope", "--lora-targets"}
    assert {FLAGS["--listen-inference-python"].kind, FLAGS["--listen-asr-model"].kind} == {"program", "model"}


@pytest.mark.parametrize(("extra", "says"), [
    ("--help", "'--help' is not a train-gpt flag"), ("-h", "'-h' is not a train-gpt flag"),
    ("--write-clean=/x", "not a train-gpt flag"), ("lonely", "'lonely' is not a train-gpt flag"),
    ("--learning_rate 1e-4", "'--learning_rate' is not a train-gpt flag; did you mean --learning-rate?"),
    ("--save-every 5", "did you mean --save-interval?"), ("--device cuda", "CUDA_VISIBLE_DEVICES=1 picks another GPU"),
    ("--seed --help", "starts with '-'"), ("--best-metric=--help", "starts with '-'"),
    ("--lora-targets 'qkv\nmlp_in'", "holds a control character"), ("--seed", "--seed needs a value"),
    ("--skip-bad-lines=yes", "takes no value"), ("--output-dir {root}/run", "has its own field on this page"),
    ("--seed '1", "No closing quotation"), ("--seed 1\x00", "a NUL byte"), ("--seed \ud800", "a lone surrogate"),
])
def test_other_flags_pass_known_flags_only_and_values_only_as_values(folders, extra, says) -> None:
    with pytest.raises(UserError, match=re.escape(says)):
        other_flags(extra.format(root=folders["root"]), Roots([folders["root"]]), {"output_dir"})


VALUES = ["--write-clean=/elsewhere/file", "--help", "-o", "a\n--write-clean=/x", "a\x00b", "a\rb", "\ud83d",
          "a\u2028b", "x\x1b[2J"]


@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize("field", ["train_manifests", "val_manifests", "config", "tokenizer", "base_checkpoint",
                                   "output_dir"])
def test_no_form_field_reaches_the_command_line_as_an_option_or_a_second_line(folders, field, value) -> None:
    root = folders["root"]
    values = {"train_manifests": f"{root}/t.jsonl", "output_dir": f"{root}/run", "config": f"{root}/c.yaml"}
    values[field] = f"{root}/{value}" if value.startswith("a") else value
    try:
        flags = forms.flags(forms.RunForm(**values), Roots([root]))
    except UserError as exc:  # one line that says why
        # (a manifests box is one path a line: a line break there starts the next path, checked alike)
        assert re.search(r"starts with '-', which a command would read as an option|holds (a|an) |"
                         r"outside the folders this page may touch", str(exc))
        assert not re.search(r"[\n\r\x00\x1b\u2028]", str(exc))
        return
    # Accepted only as a path inside the root, with nothing that could start a second flag or line.
    assert all(flag.startswith("--") and "=" in flag and flag.split("=", 1)[1].startswith(str(root.resolve()))
               for flag in flags)
    assert not any(ch in "".join(flags) for ch in "\n\r\x00\x1b\u2028")


def test_a_recorded_run_naming_files_outside_the_root_is_refused(folders, monkeypatch) -> None:
    """--from-run: the trainer would take the record's inputs; each must lie inside the roots."""
    root, outside = folders["root"], folders["outside"]
    monkeypatch.setattr(sys, "argv", ["train-gpt"])
    good = {"train_manifests": [f"{root}/t.jsonl::am"], "output_dir": str(root / "run"), "config": str(root / "c.yaml"),
            "tokenizer": None, "base_checkpoint": None, "resume": "auto"}
    roots = Roots([root])
    for name, value in [("tokenizer", str(outside / "bpe.model")), ("base_checkpoint", "link/gpt.pth"),
                        ("train_manifests", [f"{root}/t.jsonl", f"{outside}/x.jsonl@0.2"]),
                        ("val_manifests", [f"{root}/link/v.jsonl"]), ("resume", str(outside / "x.pth")),
                        ("config", "../outside/c.yaml")]:
        record = root / f"{name}.yaml"
        write_run_record(root, {**good, name: value}, {}, {}, 0.0)
        (root / "run.yaml").rename(record)
        with pytest.raises(UserError, match=f"--from-run {record}: its --.*outside the folders"):
            other_flags(f"--from-run {record}", roots, set())
    write_run_record(root, good, {}, {}, 0.0)
    assert other_flags(f"--from-run={root}/run.yaml", roots, set()) == [f"--from-run={root.resolve()}/run.yaml"]


def test_found_files_that_lead_outside_are_neither_read_nor_written(folders) -> None:
    root, outside = folders["root"], folders["outside"]
    secret = outside / "secret.log"
    secret.write_text("step 9/9 outside\n")
    run = root / "run"
    (run / "train.log").symlink_to(secret)
    (run / "model_step5.pth").symlink_to(outside / "bpe.model")
    (run / "logs").symlink_to(outside)
    roots = Roots([root])
    assert sorted(roots.scan_links(run).links) == [f"logs -> {outside.resolve()}",
                                               f"model_step5.pth -> {outside.resolve()}/bpe.model",
                                               f"train.log -> {secret.resolve()}"]
    assert read_log(None, run).startswith(NOT_READ) and "symbolic link" in read_log(None, run)
    with pytest.raises(UserError, match="symbolic link"):
        RunRegistry().start([sys.executable, "-c", "pass"], run)
    (row,) = records.checkpoint_rows(run, roots)
    assert row["status"] == records.REFUSED and "outside the folders this page may touch" in row["reasons"]
    assert records.loss_curves(run, roots) == []
    server = PageServer(roots)
    status, _, tail, _, notices = server.watch(str(run))
    assert status == "no run in this output dir yet" and tail.startswith(NOT_READ) and "outside" not in tail
    assert "not used (leads outside the folders this page may touch): train.log ->" in notices
    form = [f"{root}/t.jsonl", "", "", f"{root}/c.yaml", "", str(run), *([None] * 17), "auto", ""]
    message, stored = server.start(None, *form, None)
    assert "holds 3 symbolic link(s) leading outside" in message and stored is None
    assert secret.read_text() == "step 9/9 outside\n"


def test_a_folder_too_big_or_unlistable_to_check_for_links_is_not_written_into(folders, monkeypatch) -> None:
    """The scan for links leading outside is bounded; past the bound it vouches for nothing (a link
    the scan never reached passed before), and neither does a folder below that cannot be listed."""
    root, outside = folders["root"], folders["outside"]
    run = root / "run"
    for i in range(MAX_SCAN + 1):  # more entries than the scan looks at, the link in a folder scanned last
        (run / f"f{i}").touch()
    (run / "listen").mkdir()
    (run / "listen" / "scores.jsonl").symlink_to(outside / "bpe.model")
    roots = Roots([root])
    scan = roots.scan_links(run)
    assert scan.links == () and scan.unchecked == f"holds more than {MAX_SCAN} entries"
    assert roots.leads_outside(run)
    with pytest.raises(UserError, match=f"Output dir {run}: holds more than {MAX_SCAN} entries, too much to check"):
        roots.refuse_links_outside(run, "Output dir")
    form = [f"{root}/t.jsonl", "", "", f"{root}/c.yaml", "", str(run), *([None] * 17), "auto", ""]
    message, stored = PageServer(roots).start(None, *form, None)
    assert message.startswith(f"error: Output dir {run}: holds more than") and stored is None
    assert "not checked for links leading outside" in PageServer(roots).watch(str(run))[4]
    assert (outside / "bpe.model").read_bytes() == b"not ours to copy"

    small = root / "small"
    (small / "locked").mkdir(parents=True)  # the tests run as root, where a mode does not stop a listing
    real_scandir = os.scandir

    def scandir(path):
        if Path(path).name == "locked":
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    assert roots.scan_links(small).unchecked == "locked cannot be listed (Permission denied)"
    with pytest.raises(UserError, match="locked cannot be listed"):
        roots.refuse_links_outside(small, "Export dir")
    assert roots.scan_links(root / "not-yet").unchecked is None  # a folder the run will make holds no link


def test_only_regular_files_of_their_own_are_opened(folders) -> None:
    run = folders["root"] / "run"
    os.mkfifo(run / "train.log")  # would block a plain open
    assert "not a regular file" in read_log(None, run)
    (run / "train.log").unlink()
    os.link(folders["outside"] / "bpe.model", run / "train.log")
    with pytest.raises(UserError, match="other hard links"):
        RunRegistry().start([sys.executable, "-c", "pass"], run)
    assert (folders["outside"] / "bpe.model").read_bytes() == b"not ours to copy"


@pytest.mark.parametrize("bad", ["x\x00y", "\udcff", "\ud800/run", "run\n", "-run"])
def test_page_handlers_answer_bad_text_with_a_line_not_an_exception(folders, bad) -> None:
    server = PageServer(Roots([folders["root"]]))
    form = [f"{folders['root']}/t.jsonl", "", bad, f"{folders['root']}/c.yaml", bad, bad, *([None] * 17), "auto", bad]
    assert server.watch(bad)[0].startswith("error: Output dir")
    assert server.stop(bad).startswith("error: Output dir")
    assert server.start(None, *form, None)[0].startswith("error: ")
    assert server.check_tokenizer(*form).startswith("error: Tokenizer")
    assert server.preview(*form).startswith("(not ready) ")
    assert server.export(bad, "", str(folders["root"] / "run"), "").startswith("error: Checkpoint")
    manifests = [bad, *form[1:]]
    assert server.check_data(*manifests).startswith("error: Manifests")


def test_the_page_refuses_a_tokenizer_or_export_folder_outside_the_root(folders, monkeypatch) -> None:
    server = PageServer(Roots([folders["root"]]))
    ran: list = []
    monkeypatch.setattr(server, "run_cli", lambda args: ran.append(args) or "(exit 0)")
    checkpoint, run = str(folders["root"] / "run" / "latest.pth"), str(folders["root"] / "run")
    tokenizer = server.export(checkpoint, "", run, str(folders["outside"] / "bpe.model"))
    assert tokenizer.startswith("error: Tokenizer") and "outside the folders" in tokenizer
    linked = server.export(checkpoint, "", run, str(folders["root"] / "link" / "bpe.model"))
    assert "outside the folders" in linked
    target = server.export(checkpoint, str(folders["outside"] / "export"), run, "")
    assert target.startswith("error: Export dir") and "outside the folders" in target
    assert ran == [] and sorted(p.name for p in folders["outside"].iterdir()) == ["bpe.model"]
    # Inside the root: export gets the run's config and tokenizer (it copies the tokenizer itself).
    (folders["root"] / "bpe.model").write_bytes(b"x")
    server.export(checkpoint, "", run, str(folders["root"] / "bpe.model"), str(folders["root"] / "c.yaml"))
    assert f"--config={folders['root'].resolve()}/c.yaml" in ran[0]
    assert f"--tokenizer={folders['root'].resolve()}/bpe.model" in ran[0]
    assert "--tokenizer-name=bpe.model" in ran[0]  # IndexTTS2's config.yaml names the copy
    assert ran[0][-2:] == ["--", f"{folders['root'].resolve()}/run/latest.pth"]  # never read as an option
    assert "--force" not in ran[0]  # export replaces no file, whichever folder it writes
    (folders["root"] / "grown.tiktoken").write_bytes(b"x")  # IndexTTS-2.5 inference opens a fixed name
    said = server.export(checkpoint, "", run, str(folders["root"] / "grown.tiktoken"))
    assert said == "(exit 0)", said
    assert ran[-1][-3:] == [f"--tokenizer={folders['root'].resolve()}/grown.tiktoken", "--",
                            f"{folders['root'].resolve()}/run/latest.pth"]
    ran.clear()
    server.export(checkpoint, str(folders["root"] / "mine"), run, "")
    assert "--force" not in ran[0] and f"--output={folders['root'].resolve()}/mine/gpt.pth" in ran[0]


def test_the_page_watches_and_starts_nothing_outside_the_root(folders, monkeypatch) -> None:
    server = PageServer(Roots([folders["root"]]))
    monkeypatch.setattr(server.registry, "start", lambda *a: pytest.fail("a run was started"))
    assert "outside the folders" in server.watch(str(folders["outside"]))[0]
    assert "outside the folders" in server.stop(str(folders["outside"]))
    form = [str(folders["root"] / "t.jsonl"), "", "", str(folders["root"] / "c.yaml"), "",
            str(folders["root"] / "run"), *([None] * 17), "auto", f"--from-run {folders['outside']}/run.yaml"]
    assert "outside the folders" in server.start(None, *form, None)[0]


def hold_forged_lock(folder: Path, pid: int):
    lock = open(folder / LOCK_NAME, "w")  # noqa: SIM115 - held until the test closes it
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    lock.write(f"pid={pid} started=2026-01-01T00:00:00Z\n")
    lock.flush()
    return lock


@pytest.mark.slow  # starts a bystander process
def test_stop_does_not_signal_a_process_a_forged_lock_names(folders) -> None:
    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
    lock = hold_forged_lock(folders["root"] / "run", bystander.pid)
    try:
        with pytest.raises(UserError, match=f"PID {bystander.pid}, which is not a train-gpt run"):
            RunRegistry().stop(folders["root"] / "run")
        message = PageServer(Roots([folders["root"]])).stop(str(folders["root"] / "run"))
        assert message.startswith("error: ") and "was not signalled" in message
        time.sleep(0.3)
        assert bystander.poll() is None  # SIGINT would have ended sleep
    finally:
        lock.close()
        bystander.kill()
        bystander.wait()


@pytest.mark.slow  # starts a Python process
def test_a_train_run_of_that_output_dir_is_recognised_by_its_command_line(tmp_path) -> None:
    script = tmp_path / "train-gpt"
    script.write_text("import time\ntime.sleep(60)\n")
    (tmp_path / "run").mkdir()
    process = subprocess.Popen([sys.executable, str(script), "--output-dir", "run"], cwd=tmp_path)
    try:
        deadline = time.monotonic() + 10
        while not Path(f"/proc/{process.pid}/cmdline").read_bytes().count(b"--output-dir"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert is_train_run_of(process.pid, tmp_path / "run")  # relative to the process's own folder
        assert not is_train_run_of(process.pid, tmp_path)
        assert not is_train_run_of(os.getpid(), tmp_path / "run")  # pytest is no train run
        process.send_signal(signal.SIGINT)
    finally:
        process.kill()
        process.wait()


@pytest.mark.parametrize(("argv", "is_train"), [
    (["/venv/bin/python", "/venv/bin/train-gpt", "--output-dir", "r"], True),
    (["python", "-m", "indextts_train", "train", "--output-dir", "r"], True),
    (["python", "-u", "-m", "indextts_train", "--train-manifest", "t.jsonl"], True),  # torchrun's ranks
    (["python", "trainers/train_gpt_v2.py", "--output-dir", "r"], True),
    (["python", "-m", "indextts_train", "export", "r/latest.pth"], False),
    (["sleep", "60"], False),
])
def test_which_command_lines_are_train_runs(argv, is_train) -> None:
    assert _is_train_command(argv) == is_train


def test_the_page_exports_each_checkpoint_into_its_own_folder_and_replaces_none(folders, monkeypatch) -> None:
    server = PageServer(Roots([folders["root"]]))
    ran: list = []
    monkeypatch.setattr(server, "run_cli", lambda args: ran.append(args) or "(exit 0)")
    run = (folders["root"] / "run").resolve()
    (run / "model_step8.pth").write_bytes(b"step 8")
    os.link(run / "model_step8.pth", run / "latest.pth")  # as training publishes them
    (run / "abandoned" / "b1").mkdir(parents=True)
    (run / "abandoned" / "b1" / "model_step4.pth").write_bytes(b"step 4, abandoned")
    (run / "best.pth").write_bytes(b"not a checkpoint of ours: no step to name it by")
    for checkpoint, folder in (("latest.pth", "model_step8"), ("model_step8.pth", "model_step8"), ("best.pth", "best"),
                               ("abandoned/b1/model_step4.pth", "abandoned-b1-model_step4")):
        server.export(str(run / checkpoint), "", str(run), "")
        assert f"--output={run}/export/{folder}/gpt.pth" in ran[-1] and "--force" not in ran[-1], checkpoint
    # An earlier export is kept: exporting that checkpoint again is refused before export runs.
    (run / "export" / "model_step8").mkdir(parents=True)
    (run / "export" / "model_step8" / "gpt.pth").write_bytes(b"the user's earlier export")
    said = server.export(str(run / "latest.pth"), "", str(run), "")
    assert "holds an earlier export of this checkpoint: kept, never replaced" in said and len(ran) == 4
    assert (run / "export" / "model_step8" / "gpt.pth").read_bytes() == b"the user's earlier export"
    # ...but one killed while it published (its marker beside gpt.pth) is finished by export itself.
    (run / "export" / "model_step8" / ".gpt.pth.publishing").write_text("{}")
    server.export(str(run / "latest.pth"), "", str(run), "")
    assert len(ran) == 5


def test_the_whole_file_system_is_no_root(tmp_path, monkeypatch) -> None:
    """`--root /` (or a shell started in /, as a container's often is, with no --root) let the page read and
    write anything on the machine; it is one line before the page starts."""
    from indextts_train.webui import serve

    for folder in (Path("/"), tmp_path / ".." / ".." / ".." / ".." / ".." / ".."):
        with pytest.raises(UserError, match=r"is the whole file system .*so the page could read and write anything"):
            Roots([folder])
    monkeypatch.chdir("/")  # no --root: the folder it starts in, refused by the same check
    with pytest.raises(UserError, match=r"^--root / is the whole file system \(the default root is the folder webui "
                                        r"starts in\).*cd into the folder of your data and runs, or pass --root DIR"):
        serve(port=1)
    assert Roots([tmp_path]).folders == (tmp_path.resolve(),)
