"""What the page's buttons and timers do, answered in text: set a run up, check it, start, stop and
watch it, export its checkpoints. Nothing here imports Gradio (seconds to import), so these handlers
load, and are tested, without it; `page.py` adds the handlers that answer in Gradio updates and the
layout.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from indextts_train.checkpoint.export import publishing_marker
from indextts_train.config.family import SENTENCEPIECE, family_of_tokenizer
from indextts_train.config.settings import load_config
from indextts_train.errors import UserError
from indextts_train.train.device import detect_device
from indextts_train.train.plan import plan_for
from indextts_train.ui.events import read_events
from indextts_train.webui import form as forms
from indextts_train.webui import records
from indextts_train.webui.roots import Roots, shown
from indextts_train.webui.runs import RunRegistry, cli_command, read_log, running_command, shell_line

LOG_LINES = 20
CLI_TIMEOUT = 1800  # seconds a check or an export from the page may take (a big manifest: minutes)
REPORT_CHARS = 20_000  # the end of a command's output shown in the page


def _last(text: str, limit: int = REPORT_CHARS) -> str:
    """The end of a text the run's records hold, at most `limit` characters: events.jsonl is read up to
    8 MiB, and one line of it may be that long; the page shows the end, once a second, not all of it."""
    return text if len(text) <= limit else f"[... {len(text) - limit} characters not shown ...]{text[-limit:]}"


def _lines_shown(text: str) -> str:
    """Text of the run's events (lines the trainer printed, read from a file anyone who can write the folder can
    edit), each line shown as roots.shown shows a name: no escape sequence or bidirectional control reorders it."""
    return "\n".join(shown(line) for line in text.split("\n"))


class PageServer:
    """What the page does, shared by every browser tab: the runs, and the folders every path must lie
    in (roots.py). Nothing a visitor typed is kept here: the form of the last run started goes back
    to that browser only (its own storage), never to another visitor."""

    def __init__(self, roots: Roots | None = None) -> None:
        self.registry = RunRegistry()
        self.roots = roots if roots is not None else Roots([Path.cwd()])

    # ---- set-up --------------------------------------------------------------------------------

    def form_of(self, values: list) -> forms.RunForm:
        train, val, tokenizer, config, base, output_dir, *rest = values
        numbers, (amp, extra) = rest[:len(forms.MAIN_FIELDS)], rest[len(forms.MAIN_FIELDS):]
        return forms.RunForm(train_manifests=train or "", output_dir=output_dir or "", config=config or "",
                             val_manifests=val or "", tokenizer=tokenizer or "", base_checkpoint=base or "",
                             hparams=dict(zip(forms.MAIN_FIELDS, numbers, strict=True)), amp=amp or "auto",
                             extra=extra or "")

    def preview(self, *values) -> str:
        try:
            return shell_line(forms.command(self.form_of(list(values)), self.roots))
        except UserError as exc:
            return f"(not ready) {exc}"

    def run_cli(self, args: list[str]) -> str:
        try:
            done = subprocess.run(cli_command(args), capture_output=True, text=True, errors="replace",
                                  timeout=CLI_TIMEOUT)
        except subprocess.TimeoutExpired:
            return f"$ {shell_line(cli_command(args))}\nstopped after {CLI_TIMEOUT} s (run it in a terminal)"
        except OSError as exc:  # E2BIG (a command line past the system's limit), ENOMEM, ...
            return f"error: {args[0]} could not be started ({exc.strerror}); nothing ran"
        output = (done.stdout + done.stderr)[-REPORT_CHARS:]
        return f"$ {shell_line(cli_command(args))}\n{output}(exit {done.returncode})"

    def check_data(self, *values) -> str:
        """`check-data` of the form's manifests (their paths; the suffixes are the trainer's)."""
        run = self.form_of(list(values))
        try:
            lines = [*forms.lines_of(run.train_manifests, "Training manifests"),
                     *forms.lines_of(run.val_manifests, "Validation manifests")]
            if not lines:
                return "Training manifests: give at least one manifest JSONL path"
            manifests = [str(self.roots.manifest_file(line, "Manifests")) for line in lines]
            args = [f"--config={self.roots.inside(run.config, 'Config')}"] if run.config.strip() else []
            args += [f"--tokenizer={self.roots.inside(run.tokenizer, 'Tokenizer')}"] if run.tokenizer.strip() else []
        except UserError as exc:
            return f"error: {exc}"
        return self.run_cli(["check-data", *args, "--", *manifests])

    def check_tokenizer(self, *values) -> str:
        run = self.form_of(list(values))
        if not run.tokenizer.strip():
            return "Tokenizer: give the SentencePiece .model to check"
        try:
            tokenizer = self.roots.inside(run.tokenizer, "Tokenizer")
        except UserError as exc:
            return f"error: {exc}"
        base = []
        if family_of_tokenizer(tokenizer).tokenizer_kind == SENTENCEPIECE:  # check-tokenizer refuses it for .tiktoken
            try:
                base = [f"--base-vocab={load_config(self.roots.inside(run.config, 'Config')).gpt.number_text_tokens}"]
            except UserError:
                pass
        return self.run_cli(["check-tokenizer", *base, "--", str(tokenizer)])

    def hardware(self, *values) -> str:
        """The plan the form's run would pick here: the run's own planner call on the run's settings."""
        try:
            plan = plan_for(forms.form_config(self.form_of(list(values)), self.roots), detect_device())
        except UserError as exc:
            return f"error: {exc}"
        return plan.describe()

    # ---- start, stop, resume -------------------------------------------------------------------

    def start(self, resume: str | None, *values) -> tuple[str, list | None]:
        """Start (or resume) the form's run; the form goes back to this browser's storage (the last value)."""
        *values, stored = values
        try:
            run = self.form_of(list(values))
            argv = forms.command(run, self.roots, resume)
            folder = self.roots.inside(run.output_dir, "Output dir")
            self.roots.refuse_links_outside(folder, "Output dir")  # the run would write through them
            launch = self.registry.start(argv, folder)
        except UserError as exc:
            return f"error: {exc}", stored
        return f"started PID {launch.pid} in {folder}; its output goes to train.log there", list(values)

    def stop(self, output_dir: str) -> str:
        try:
            whom = self.registry.stop(self.roots.inside(output_dir, "Output dir"))
        except UserError as exc:
            return f"error: {exc}"
        return f"sent SIGINT to {whom}: it finishes the step, saves, exits 130"

    # ---- watch ---------------------------------------------------------------------------------

    def watch(self, output_dir: str) -> tuple[str, str, str, str, str]:
        if not (output_dir or "").strip():
            return "no output dir", "", "", "", ""
        try:
            folder = self.roots.inside(output_dir, "Output dir")
        except UserError as exc:
            return f"error: {exc}", "", "", "", ""
        launch = self.registry.find(folder)
        events, recorded = self._records_of(folder, command=True)
        if records.superseded(launch, events):
            launch = None  # a run started after the page's own ended (in a terminal): its records tell, not our exit
        text = read_log(launch, folder, roots=self.roots)
        ours = launch is not None and bool(launch.argv)
        command = running_command(launch) if ours else recorded
        # A line without end: its end, not 256 KiB a second. Escaped as the notices are: the log holds what the run
        # printed of its data (a manifest's text), and a bidirectional control there reordered the box's lines.
        tail = _lines_shown(_last("\n".join(text.splitlines()[-LOG_LINES:])))
        mine = records.invocation_events(launch, events)
        scan = self.roots.scan_links(folder)
        outside = [f"not used (leads outside the folders this page may touch): {link}" for link in scan.links]
        outside += [f"not read (neither a file nor a folder: a reader would block or fail on it): {name}"
                    for name in scan.special]
        if scan.unchecked is not None:
            outside.append(f"not checked for links leading outside: {folder} {scan.unchecked}")
        outside += [line for line in [records.curves_left_out(folder, self.roots),
                                      records.checkpoints_left_out(folder)] if line]
        notices = "\n".join([*outside, _last(_lines_shown(records.notices(mine)))]).strip()
        return records.status_line(launch, events), command, tail, _last(_lines_shown(records.plan_text(mine))), notices

    def _records_of(self, folder: Path, *, command: bool) -> tuple[list[dict], str]:
        """The run's events and (`command`) run.yaml's command line, read in `folder` as opened once and found
        inside the roots: a folder of its path made a link to another after the check is not read through, the
        reads go on in the folder that was opened (/proc/self/fd). Each file is opened without following a link
        in its last part (ui/events.py, ui/run_record.py)."""
        try:
            fd = os.open(folder, os.O_DIRECTORY | os.O_CLOEXEC | getattr(os, "O_PATH", os.O_RDONLY))
        except OSError:
            return [], ""
        try:
            if not self.roots.holds_open(fd):
                return [], ""
            base = Path(f"/proc/self/fd/{fd}") if os.path.isdir(f"/proc/self/fd/{fd}") else folder
            events = read_events(base)
            return events, records.recorded_command(base, events) if command else ""
        finally:
            os.close(fd)

    def export(self, checkpoint: str, export_dir: str, output_dir: str, tokenizer: str, config: str = "") -> str:
        """`indextts-train export` of the chosen checkpoint with the run's config and tokenizer (copied
        beside gpt.pth by export itself: IndexTTS2 under its config name, IndexTTS-2.5 as its .tiktoken)."""
        try:
            named = (export_dir or "").strip()  # else the page's own: OUTPUT_DIR/export/<checkpoint>
            target = self.roots.inside(export_dir, "Export dir") if named else None
            run = None if named else self.roots.inside(output_dir, "Output dir")
            inputs = []
            if (config or "").strip():
                inputs.append(f"--config={self.roots.inside(config, 'Config')}")
            if (tokenizer or "").strip():
                token_file = self.roots.inside(tokenizer, "Tokenizer")
                inputs.append(f"--tokenizer={token_file}")
                if not family_of_tokenizer(token_file).tokenizer_name_fixed:  # IndexTTS2: config.yaml names it
                    inputs.append(f"--tokenizer-name={token_file.name}")
            if target is not None:
                self.roots.refuse_links_outside(target, "Export dir")
            if not checkpoint:
                return "choose a checkpoint to export"
            source = self.roots.inside(checkpoint, "Checkpoint")
            if target is None:  # one folder per checkpoint: a new export never replaces an earlier one
                target = self.roots.inside(run / "export" / records.export_name(run, source), "Export dir")
                self.roots.refuse_links_outside(target, "Export dir")
                model = target / "gpt.pth"
                if (model.exists() or model.is_symlink()) and not publishing_marker(model).exists():
                    return (f"{target} holds an earlier export of this checkpoint: kept, never replaced; delete that "
                            "folder to export it again, or name another Export dir")
            args = ["export", f"--output={target / 'gpt.pth'}", f"--config-out={target / 'config.yaml'}", *inputs]
        except UserError as exc:
            return f"error: {exc}"
        # No --force: export replaces no file (it refuses in one line, naming it); it only finishes an
        # export of its own that was killed while it published.
        return self.run_cli([*args, "--", str(source)])
