"""The Gradio page: set up a run, start, watch, stop, resume, list and export checkpoints.

Every button calls what the CLI calls: train-gpt (as a child process, see runs.py), check-data,
check-tokenizer and export (as `indextts-train` commands, their output shown as printed), and the
hardware planner and checkpoint verifier (the functions behind `hardware` and `verify`). The handlers
that answer in text are in server.py, which loads without Gradio; this module adds those that answer
in Gradio updates and the layout, and is the only module of the package that imports Gradio.
"""

from __future__ import annotations

from pathlib import Path

import gradio as gr
import pandas as pd

from indextts_train.config.settings import DEFAULT_CONFIG
from indextts_train.errors import UserError
from indextts_train.webui import form as forms
from indextts_train.webui import records
from indextts_train.webui.roots import shown
from indextts_train.webui.server import PageServer

FORM_SIZE = 6 + len(forms.MAIN_FIELDS) + 2  # paths, numbers, amp, other flags
TABLE_COLUMNS = ["file", "status", "step", "epoch", "val_loss", "cer", "speaker_sim", "marks", "size_mb", "reasons"]


class Page(PageServer):
    """The page's server (server.py) with the handlers whose answers are Gradio updates and tables."""

    def defaults(self, config: str, loaded: str) -> list:
        """The config's train: values, once per config path (not again when a reload restores it)."""
        if config == loaded:
            return [gr.update() for _ in forms.MAIN_FIELDS] + [loaded]
        try:
            found = forms.defaults_for(str(self.roots.inside(config, "Config")))
        except UserError:
            return [gr.update() for _ in forms.MAIN_FIELDS] + [loaded]
        return [found[name] for name in forms.MAIN_FIELDS] + [config]

    def restore(self, stored: list | None) -> list:
        """On load: the form of the last run this browser started, so the page re-attaches to it.

        The last value tells `defaults` that the restored numbers already belong to that config.
        """
        if not _a_stored_form(stored):
            return [gr.update() for _ in range(FORM_SIZE + 1)]
        return [*stored, stored[3]]

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
        table = [_table_row(row) for row in rows]
        usable = [r for r in rows if r["status"] != records.REFUSED]
        choices = [("auto: newest checkpoint that verifies", "auto")]
        # Named as `checkpoints` names them, from the run folder: an abandoned branch's model_step40.pth is not the
        # run's own model_step40.pth (both were offered as `model_step40.pth`, and Export chose the abandoned one).
        choices += [(f"{shown(_in_run(r['file'], folder))}: {r['status']}, step {r['step']}", r["file"])
                    for r in usable]
        exportable = [c for c in choices[1:] if "INCOMPLETE" not in c[0]]
        values = {value for _, value in choices}
        own = [value for _, value in exportable if Path(value).parent == folder] or [v for _, v in exportable]
        export_default = export_choice if export_choice in values else (own[-1] if own else None)
        return (plot, table, gr.update(choices=choices, value=resume_choice if resume_choice in values else "auto"),
                gr.update(choices=exportable, value=export_default))


def _in_run(file: str, folder: Path) -> str:
    """A checkpoint's path from its run folder (abandoned/BRANCH/model_stepN.pth), as `checkpoints` lists it."""
    path = Path(file)
    return str(path.relative_to(folder)) if path.is_relative_to(folder) else path.name


def _table_row(row: dict) -> list:
    """A checkpoint row's cells. Its text found on disk (a name, a link's target, a branch's name) is shown as Watch
    shows it, line breaks and bidirectional controls escaped: one reordered its cell."""
    cells = {**row, "file": Path(row["file"]).name}
    return [shown(str(cells[column])) if column in ("file", "marks", "reasons") else cells[column]
            for column in TABLE_COLUMNS]


def _a_stored_form(stored: object) -> bool:
    """Whether the browser's stored value is a form this page stored: the browser (or any API caller) sends it,
    so text where the page has text, a number or nothing where it has numbers, and a Mixed precision choice."""
    if not isinstance(stored, list) or len(stored) != FORM_SIZE:
        return False
    numbers = stored[6:6 + len(forms.MAIN_FIELDS)]
    return (all(isinstance(text, str) for text in [*stored[:6], stored[-1]]) and stored[-2] in forms.AMP_CHOICES
            and all(n is None or isinstance(n, (int, float)) and not isinstance(n, bool) for n in numbers))


def build_page(server: Page) -> gr.Blocks:
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
        export_dir = gr.Textbox(label="Export dir (default: OUTPUT_DIR/export/<checkpoint>)", elem_id="export_dir")
    export = gr.Button("Export gpt.pth + config.yaml + tokenizer", elem_id="export")
    export_report = gr.Textbox(label="Export", lines=4, interactive=False, elem_id="export_report")
    return table, {"choice": export_choice, "dir": export_dir, "button": export, "report": export_report}


def _wire(page, server: Page, inputs, buttons, setup_out, watch_out, records_out, export_parts) -> None:
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
