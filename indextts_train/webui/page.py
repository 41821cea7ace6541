"""The Gradio page: set up a run, start, watch, stop, resume, list and export checkpoints.

Every button calls what the CLI calls: train-gpt (as a child process, see runs.py), check-data,
check-tokenizer and export (as `indextts-train` commands, their output shown as printed), and the
hardware planner and checkpoint verifier (the functions behind `hardware` and `verify`). This is the
only module of the package that imports Gradio.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import gradio as gr
import pandas as pd

from indextts_train.config.settings import DEFAULT_CONFIG, load_config
from indextts_train.errors import UserError
from indextts_train.train.hardware import detect_device
from indextts_train.train.plan import plan_for
from indextts_train.ui.events import read_events
from indextts_train.webui import form as forms
from indextts_train.webui import records
from indextts_train.webui.roots import Roots
from indextts_train.webui.runs import RunRegistry, cli_command, read_log, shell_line

LOG_LINES = 20
CLI_TIMEOUT = 1800  # seconds a check or an export from the page may take (a big manifest: minutes)
REPORT_CHARS = 20_000  # the end of a command's output shown in the page
FORM_SIZE = 6 + len(forms.MAIN_FIELDS) + 2  # paths, numbers, amp, other flags
TABLE_COLUMNS = ["file", "status", "step", "epoch", "val_loss", "cer", "speaker_sim", "marks", "size_mb", "reasons"]


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

    def defaults(self, config: str, loaded: str) -> list:
        """The config's train: values, once per config path (not again when a reload restores it)."""
        if config == loaded:
            return [gr.update() for _ in forms.MAIN_FIELDS] + [loaded]
        try:
            found = forms.defaults_for(str(self.roots.inside(config, "Config")))
        except UserError:
            return [gr.update() for _ in forms.MAIN_FIELDS] + [loaded]
        return [found[name] for name in forms.MAIN_FIELDS] + [config]

    def run_cli(self, args: list[str]) -> str:
        try:
            done = subprocess.run(cli_command(args), capture_output=True, text=True, timeout=CLI_TIMEOUT)
        except subprocess.TimeoutExpired:
            return f"$ {shell_line(cli_command(args))}\nstopped after {CLI_TIMEOUT} s (run it in a terminal)"
        output = (done.stdout + done.stderr)[-REPORT_CHARS:]
        return f"$ {shell_line(cli_command(args))}\n{output}(exit {done.returncode})"

    def check_data(self, *values) -> str:
        """`check-data` of the form's manifests (their paths; the suffixes are the trainer's)."""
        run = self.form_of(list(values))
        lines = [*forms.lines_of(run.train_manifests), *forms.lines_of(run.val_manifests)]
        if not lines:
            return "Training manifests: give at least one manifest JSONL path"
        try:
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
        try:
            base = [f"--base-vocab={load_config(self.roots.inside(run.config, 'Config')).gpt.number_text_tokens}"]
        except UserError:
            base = []
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
            launch = self.registry.stop(self.roots.inside(output_dir, "Output dir"))
        except UserError as exc:
            return f"error: {exc}"
        return f"sent SIGINT to the process group of PID {launch.pid}: it finishes the step, saves, exits 130"

    def restore(self, stored: list | None) -> list:
        """On load: the form of the last run this browser started, so the page re-attaches to it.

        The last value tells `defaults` that the restored numbers already belong to that config.
        """
        if not isinstance(stored, list) or len(stored) != FORM_SIZE:
            return [gr.update() for _ in range(FORM_SIZE + 1)]
        return [*stored, stored[3]]

    # ---- watch ---------------------------------------------------------------------------------

    def watch(self, output_dir: str) -> tuple[str, str, str, str, str]:
        if not (output_dir or "").strip():
            return "no output dir", "", "", "", ""
        try:
            folder = self.roots.inside(output_dir, "Output dir")
        except UserError as exc:
            return f"error: {exc}", "", "", "", ""
        launch = self.registry.find(folder)
        text = read_log(launch, folder)
        command = shell_line(launch.argv) if launch is not None and launch.argv else records.recorded_command(folder)
        tail = "\n".join(text.splitlines()[-LOG_LINES:])
        events = read_events(folder)  # opened without following a symlink (ui/events.py)
        mine = records.invocation_events(launch, events)
        outside = [f"not used (leads outside the folders this page may touch): {link}"
                   for link in self.roots.links_outside(folder)]
        notices = "\n".join([*outside, records.notices(mine)]).strip()
        return records.status_line(launch, events), command, tail, records.plan_text(mine), notices

    def run_records(self, output_dir: str, resume_choice: str, export_choice: str):
        try:
            folder = self.roots.inside(output_dir, "Output dir")
        except UserError:
            folder = None  # watch() says why
        if folder is None or not folder.is_dir():
            empty = pd.DataFrame({"step": [], "value": [], "series": []})
            return empty, [], gr.update(choices=[("auto", "auto")]), gr.update(choices=[])
        curves = records.loss_curves(folder, self.roots)
        rows = records.checkpoint_rows(folder, self.roots)
        plot = pd.DataFrame([{"series": s, "step": step, "value": v} for s, step, v in curves],
                            columns=["series", "step", "value"])
        table = [[Path(row["file"]).name, *(row[column] for column in TABLE_COLUMNS[1:])] for row in rows]
        usable = [r for r in rows if r["status"] != records.REFUSED]
        choices = [("auto: newest checkpoint that verifies", "auto")]
        choices += [(f"{Path(r['file']).name}: {r['status']}, step {r['step']}", r["file"]) for r in usable]
        exportable = [c for c in choices[1:] if "INCOMPLETE" not in c[0]]
        values = {value for _, value in choices}
        export_default = export_choice if export_choice in values else (exportable[-1][1] if exportable else None)
        return (plot, table, gr.update(choices=choices, value=resume_choice if resume_choice in values else "auto"),
                gr.update(choices=exportable, value=export_default))

    def export(self, checkpoint: str, export_dir: str, output_dir: str, tokenizer: str, config: str = "") -> str:
        """`indextts-train export` of the chosen checkpoint with the run's config and tokenizer (copied
        beside gpt.pth by export itself: IndexTTS2 under its config name, IndexTTS-2.5 as its .tiktoken)."""
        try:
            own = not (export_dir or "").strip()  # the page's own OUTPUT_DIR/export
            folder = self.roots.inside(output_dir, "Output dir") / "export" if own else None
            target = self.roots.inside(folder or export_dir, "Export dir")
            self.roots.refuse_links_outside(target, "Export dir")
            args = ["export", f"--output={target / 'gpt.pth'}", f"--config-out={target / 'config.yaml'}"]
            if own:  # a new export replaces the page's last one; a folder the user named is never overwritten
                args.append("--force")
            if (config or "").strip():
                args.append(f"--config={self.roots.inside(config, 'Config')}")
            if (tokenizer or "").strip():
                token_file = self.roots.inside(tokenizer, "Tokenizer")
                args += [f"--tokenizer={token_file}", f"--tokenizer-name={token_file.name}"]
            if not checkpoint:
                return "choose a checkpoint to export"
            source = self.roots.inside(checkpoint, "Checkpoint")
        except UserError as exc:
            return f"error: {exc}"
        return self.run_cli([*args, "--", str(source)])


def build_page(server: PageServer) -> gr.Blocks:
    with gr.Blocks(title="indextts-train") as page:
        gr.Markdown("# indextts-train\nStart, watch, stop and resume `train-gpt` runs. The run is a separate "
                    "process: closing this page or stopping the web server does not stop it.")
        with gr.Row():
            with gr.Column(scale=1):
                inputs, buttons, setup_out = _setup_panel()
            with gr.Column(scale=1):
                watch_out, curves = _watch_panel()
        table, export_parts = _checkpoints_panel()
        records_out = [curves, table]
        _wire(page, server, inputs, buttons, setup_out, watch_out, records_out, export_parts)
    return page


def _setup_panel():
    gr.Markdown("## Set up")
    train = gr.Textbox(label="Training manifests (one per line)", lines=2, elem_id="train_manifests")
    val = gr.Textbox(label="Validation manifests (one per line)", lines=1, elem_id="val_manifests")
    tokenizer = gr.Textbox(label="Tokenizer (.model or .tiktoken)", elem_id="tokenizer")
    config = gr.Textbox(label="Config", value=str(DEFAULT_CONFIG), elem_id="config")
    base = gr.Textbox(label="Base checkpoint (gpt.pth)", elem_id="base_checkpoint")
    output_dir = gr.Textbox(label="Output dir", elem_id="output_dir")
    defaults = forms.defaults_for(str(DEFAULT_CONFIG)) if DEFAULT_CONFIG.is_file() else {}
    with gr.Accordion("Hyperparameters (the config's values; 0 = auto where the CLI says so)", open=True):
        numbers = []
        for first in range(0, len(forms.MAIN_FIELDS), 3):
            with gr.Row():
                numbers += [gr.Number(label=forms.flag_name(name), value=defaults.get(name), elem_id=name,
                                      min_width=120) for name in forms.MAIN_FIELDS[first:first + 3]]
        amp = gr.Dropdown(list(forms.AMP_CHOICES), value="auto", label="Mixed precision (--amp/--no-amp)",
                          elem_id="amp")
        extra = gr.Textbox(label="Other train-gpt flags", elem_id="extra_flags")
    inputs = [train, val, tokenizer, config, base, output_dir, *numbers, amp, extra]
    with gr.Row():
        check_data = gr.Button("Check data", elem_id="check_data")
        check_tok = gr.Button("Check tokenizer", elem_id="check_tokenizer")
        plan = gr.Button("Hardware plan", elem_id="hardware")
    report = gr.Textbox(label="Report", lines=6, max_lines=20, interactive=False, elem_id="report")
    command = gr.Textbox(label=f"Command line (runs in {Path.cwd()}; paste it into tmux to run it by hand)", lines=3,
                         interactive=False,
                         elem_id="command")
    with gr.Row():
        start = gr.Button("Start", variant="primary", elem_id="start")
        stop = gr.Button("Stop (Ctrl+C: save, exit 130)", variant="stop", elem_id="stop")
    resume_choice = gr.Dropdown([("auto", "auto")], value="auto", label="Resume from", elem_id="resume_choice")
    resume = gr.Button("Resume", elem_id="resume")
    message = gr.Textbox(label="Message", interactive=False, elem_id="message")
    buttons = {"check_data": check_data, "check_tokenizer": check_tok, "hardware": plan, "start": start,
               "stop": stop, "resume": resume, "resume_choice": resume_choice}
    return inputs, buttons, {"report": report, "command": command, "message": message}


def _watch_panel():
    gr.Markdown("## Watch")
    status = gr.Textbox(label="Status", interactive=False, elem_id="status")
    running = gr.Textbox(label="Running command", interactive=False, lines=2, elem_id="running_command")
    log = gr.Textbox(label="Log (train.log, last lines)", lines=16, max_lines=60, interactive=False,
                     autoscroll=True, elem_id="log")
    plan = gr.Textbox(label="Hardware plan chosen by the run", lines=3, interactive=False, elem_id="plan")
    notices = gr.Textbox(label="Warnings, resume decisions, changed settings", lines=3, interactive=False,
                         elem_id="notices")
    curves = gr.LinePlot(x="step", y="value", color="series", label="Losses (TensorBoard records)",
                         elem_id="curves")
    return [status, running, log, plan, notices], curves


def _checkpoints_panel():
    gr.Markdown("## Checkpoints and export")
    heard = "cer, speaker_sim: what `indextts-train listen` heard; OUTPUT_DIR/listen/index.html has the players"
    table = gr.Dataframe(headers=TABLE_COLUMNS, label=f"Checkpoints (verify status; {heard})", interactive=False,
                         elem_id="checkpoints", wrap=True)
    with gr.Row():
        export_choice = gr.Dropdown([], label="Checkpoint to export", elem_id="export_choice")
        export_dir = gr.Textbox(label="Export dir (default: OUTPUT_DIR/export)", elem_id="export_dir")
    export = gr.Button("Export gpt.pth + config.yaml + tokenizer", elem_id="export")
    export_report = gr.Textbox(label="Export", lines=4, interactive=False, elem_id="export_report")
    return table, {"choice": export_choice, "dir": export_dir, "button": export, "report": export_report}


def _wire(page, server: PageServer, inputs, buttons, setup_out, watch_out, records_out, export_parts) -> None:
    """Every event has an api_name: the page's HTTP API is these handlers, each checking what it gets."""
    config, output_dir, tokenizer = inputs[3], inputs[5], inputs[2]
    numbers = inputs[6:6 + len(forms.MAIN_FIELDS)]
    gr.on([field.change for field in inputs], server.preview, inputs, setup_out["command"], api_name="preview")
    loaded = gr.State(str(DEFAULT_CONFIG))  # the config whose train: values the numbers show
    # The form of the last run this browser started: kept in the browser, so a reload re-attaches to
    # it and no other visitor ever sees it.
    stored = gr.BrowserState(None, storage_key="indextts_train_last_run")
    config.change(server.defaults, [config, loaded], [*numbers, loaded], api_name="defaults")
    buttons["check_data"].click(server.check_data, inputs, setup_out["report"], api_name="check_data")
    buttons["check_tokenizer"].click(server.check_tokenizer, inputs, setup_out["report"], api_name="check_tokenizer")
    buttons["hardware"].click(server.hardware, inputs, setup_out["report"], api_name="hardware")
    buttons["start"].click(lambda *v: server.start(None, *v), [*inputs, stored], [setup_out["message"], stored],
                           api_name="start")
    buttons["resume"].click(lambda choice, *v: server.start(choice, *v), [buttons["resume_choice"], *inputs, stored],
                            [setup_out["message"], stored], api_name="resume")
    buttons["stop"].click(server.stop, output_dir, setup_out["message"], api_name="stop")
    gr.Timer(1.0).tick(server.watch, output_dir, watch_out, show_progress="hidden", api_name="watch")
    record_outputs = [*records_out, buttons["resume_choice"], export_parts["choice"]]
    record_inputs = [output_dir, buttons["resume_choice"], export_parts["choice"]]
    gr.Timer(3.0).tick(server.run_records, record_inputs, record_outputs, show_progress="hidden",
                       api_name="run_records")
    export_parts["button"].click(server.export, [export_parts["choice"], export_parts["dir"], output_dir, tokenizer,
                                                 config], export_parts["report"], api_name="export")
    page.load(server.restore, stored, [*inputs, loaded])
