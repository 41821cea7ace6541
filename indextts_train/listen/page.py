"""RUN/listen/index.html: one row per line, one column per checkpoint, built from scores.jsonl alone.

Each cell has the WAV's player, the transcript with the errors marked against the text (the
character alignment of text_score: a wrong character highlighted with what was expected, a missing
one struck through in the text's place, an extra one underlined) and the scores. Beside each line:
its text, the prompt and the reference clip. Every text from a file or a model is escaped. Audio
is linked by paths relative to the page, so the folder can be opened from disk or served as is.
"""

from __future__ import annotations

import html
import os
from pathlib import Path
from urllib.parse import quote

from indextts_train.checkpoint.scores import (
    ANY,
    LISTEN_DIR,
    SUMMARY_KEYS,
    Heard,
    files_by_step,
    is_scored,
    latest_records,
    read_records,
    score_value,
    scores_path,
)
from indextts_train.config.schema import is_int
from indextts_train.errors import UserError
from indextts_train.files.atomic import atomic_write_text
from indextts_train.files.bounded import open_regular
from indextts_train.listen.text_score import MAX_COMPARED_CHARS, alignment, normalise

PAGE_NAME = "index.html"
PAGE_HEAD_BYTES = 4096  # where a page of ours shows that it is
HEAD = "<!doctype html><html><head><meta charset='utf-8'>"
GENERATOR = "<meta name='generator' content='indextts-train listen'>"  # marks a page as ours: only it is replaced
TINY_ASR_PARAMETERS = 5_000_000  # the smallest real ASR models (whisper-tiny: 39 M) are far above this
TINY_GPT_WIDTH = 256  # the released GPTs are 1280 wide; the test configs are a few dozen
MAX_MARKED_CELLS = 20_000_000  # alignment work of one page: about 5 s of Python on a 2-core VM

STYLE = """body{font-family:sans-serif;margin:1em}table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:.4em;vertical-align:top;max-width:22em}
mark.sub{background:#fbb}mark.ins{background:#fdd;text-decoration:underline}del{color:#b00}
.scores{color:#444;font-size:90%}.warn{background:#ffd;border:1px solid #cc8;padding:.6em}
audio{width:15em}"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _audio(src: str) -> str:
    return f'<audio controls preload="none" src="{_e(src)}"></audio>'


def _link(path: str | None, listen_dir: Path) -> str | None:
    """A path relative to the page, URL-quoted; None when there is no file."""
    if not path:
        return None
    return quote(os.path.relpath(Path(path), listen_dir).replace(os.sep, "/"))


class MarkBudget:
    """What is left of the page's alignment work (cells of the Levenshtein tables): a crafted scores.jsonl of
    8 MB (2,000 records of 2,000-character texts and transcripts) took about half an hour to render, a second
    a cell. Past the budget a transcript is shown unmarked; the scores stay as recorded."""

    def __init__(self) -> None:
        self.left = MAX_MARKED_CELLS

    def take(self, text: str, transcript: str) -> bool:
        cost = (min(len(normalise(text)), MAX_COMPARED_CHARS) + 1) * (min(len(normalise(transcript)),
                                                                           MAX_COMPARED_CHARS) + 1)
        if cost > self.left:
            return False
        self.left -= cost
        return True


def marked_transcript(text: str, transcript: str, budget: MarkBudget | None = None) -> str:
    """The transcript as HTML with each error marked against the (normalised) text (unmarked, with a note,
    once `budget` is spent)."""
    if budget is not None and not budget.take(text, transcript):
        return f'<span title="too much text on this page to mark the errors">{_e(transcript)}</span>'
    out = []
    for edit in alignment(text, transcript):
        if edit.op == "equal":
            out.append(_e(edit.hyp))
        elif edit.op == "sub":
            out.append(f'<mark class="sub" title="expected {_e(edit.ref)}">{_e(edit.hyp)}</mark>')
        elif edit.op == "ins":
            out.append(f'<mark class="ins" title="not in the text">{_e(edit.hyp)}</mark>')
        else:
            out.append(f'<del title="missing">{_e(edit.ref)}</del>')
    return "".join(out)


# scores.jsonl is a text file a user may edit: a field of another type than listen writes is shown as absent.
def _text(record: dict, key: str) -> str:
    value = record.get(key)
    return value if isinstance(value, str) else ""


def _section(record: dict, key: str) -> dict:
    value = record.get(key)
    return value if isinstance(value, dict) else {}


def _value(value: object) -> float | None:
    """A number a score can be (not a bool, not an integer too large for a float), as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


def _number(record: dict, key: str, label: str, fmt: str = "{:.3f}") -> str | None:
    # CER and similarity as `checkpoints` and `export --pick` take them (a NaN or a CER of -5 is no score)
    value = score_value(record, key) if key in SUMMARY_KEYS else _value(record.get(key))
    return f"{label} {fmt.format(value)}" if value is not None else None



def _cell(record: dict | None, budget: MarkBudget) -> str:
    if record is None:
        return "<td>-</td>"
    if not is_scored(record):
        return f'<td class="failed">failed: {_e(record.get("error") or "unknown")}</td>'
    scores = [_number(record, "cer", "CER"), _number(record, "wer", "WER"),
              _number(record, "speaker_sim", "similarity"), _number(record, "seconds", "", "{:.2f} s"),
              _number(record, "length_ratio", "x reference", "{:.2f}")]
    said = marked_transcript(_text(record, "text"), _text(record, "transcript"), budget)
    return (f"<td>{_audio(quote(str(record.get('wav', ''))))}<div>{said}</div>"
            f'<div class="scores">{_e(" · ".join(s.strip() for s in scores if s))}</div></td>')


def _line_head(record: dict, listen_dir: Path) -> str:
    parts = [f"<b>{_e(record.get('line_id'))}</b>", f"<div>{_e(_text(record, 'text'))}</div>"]
    if record.get("language"):
        parts.append(f'<div class="scores">language {_e(record["language"])}</div>')
    for key, name in (("prompt_audio", "prompt"), ("reference_audio", "reference")):
        link = _link(_text(record, key), listen_dir)
        if link:
            parts.append(f'<div class="scores">{name}</div>{_audio(link)}')
    return f"<td>{''.join(parts)}</td>"


def _is_tiny(records: list[dict]) -> bool:
    widths = [r.get("gpt_model_dim") for r in records if is_int(r.get("gpt_model_dim"))]
    asr = [_section(r, "asr").get("parameters") for r in records]
    return any(w < TINY_GPT_WIDTH for w in widths) or any(is_int(n) and n < TINY_ASR_PARAMETERS for n in asr)


def _means(summary: dict | None) -> str:
    """A step's means as `checkpoints` shows them (scores.Heard.summary: one rule for both)."""
    summary = summary or {"lines": 0}
    parts = [f"{name} {summary[key]:.3f}" for key, name in (("cer", "CER"), ("speaker_sim", "similarity"))
             if summary.get(key) is not None]
    return " · ".join(parts + [f"{summary['lines']} line(s)"])


def _models(records: list[dict]) -> str:
    asr = sorted({str(_section(r, "asr").get("model")) for r in records if _section(r, "asr")})
    voice = sorted({f"{v.get('file')} sha256 {str(v.get('sha256'))[:12]}" for r in records
                    if isinstance(v := r.get("speaker_model"), dict)})
    return (f"ASR: {', '.join(asr) or '-'}; speaker similarity: CAMPPlus {', '.join(voice) or '(not found)'}; "
            "CER/WER on text normalised by NFKC, casefold, punctuation removed, whitespace collapsed")


def _shown(run_dir: Path) -> tuple[dict[tuple[int, str], dict], dict[int, dict | None]]:
    """(step, line id) -> the record the page shows: of the checkpoint file on disk, as `checkpoints` shows its
    scores (after a rollback, the new file's, not the abandoned one's of that step), else the step's last; and
    step -> the means of those records (Heard.summary)."""
    records = read_records(scores_path(run_dir))
    heard = Heard(records)
    branches = {step: branch for step, (_, branch) in files_by_step(run_dir).items()}
    shown = {(step, line): record for step in heard.by_step
             for line, record in heard.lines(step, branches.get(step, ANY)).items()}
    order = {key: i for i, key in enumerate(latest_records(records))}  # rows in the order lines were first heard
    means = {step: heard.summary(step, branches.get(step, ANY)) for step in heard.by_step}
    return dict(sorted(shown.items(), key=lambda item: order[item[0]])), means


def render_page(run_dir: Path) -> str:
    """The page's HTML from the run's scores.jsonl."""
    listen_dir = Path(run_dir) / LISTEN_DIR
    cells, means = _shown(run_dir)
    records = list(cells.values())
    steps = sorted({r["step"] for r in records})
    line_ids = list(dict.fromkeys(str(r.get("line_id")) for r in records))
    warn = ('<p class="warn">These are tiny random test models: they speak noise, and the numbers below mean '
            "nothing at this size.</p>") if _is_tiny(records) else ""
    head = "".join(f"<th>step {s}<div class='scores'>{_e(_means(means.get(s)))}</div></th>" for s in steps)
    rows, budget = [], MarkBudget()
    for line_id in line_ids:
        first = next(cells[(s, line_id)] for s in steps if (s, line_id) in cells)
        rows.append("<tr>" + _line_head(first, listen_dir)
                    + "".join(_cell(cells.get((s, line_id)), budget) for s in steps) + "</tr>")
    body = (f"<table><tr><th>line</th>{head}</tr>{''.join(rows)}</table>" if rows
            else "<p>No checkpoint has been heard yet.</p>")
    name = _e(Path(run_dir).name)
    return (f"{HEAD}{GENERATOR}<title>{name}: listen</title><style>{STYLE}</style></head><body>"
            f"<h1>{name}: what each checkpoint says</h1>{warn}<p class='scores'>{_e(_models(records))}</p>{body}"
            "</body></html>\n")


def check_page(run_dir: Path) -> None:
    """Before `listen` does any work: RUN/listen/index.html is none yet, or a page listen wrote (its
    generator tag in its head); anything else there is someone's, never replaced."""
    path = Path(run_dir) / LISTEN_DIR / PAGE_NAME
    if not (path.exists() or path.is_symlink()):
        return
    try:
        with open_regular(path, "page") as handle:
            head = handle.read(PAGE_HEAD_BYTES).decode("utf-8", "replace")
    except (UserError, OSError):
        head = ""
    # ours: the generator tag, or (pages of releases before it) our head with our style sheet's first rule
    ours = GENERATOR in head or (head.startswith(f"{HEAD}<title>") and STYLE.split("}", 1)[0] in head)
    if path.is_symlink() or not ours:  # a link is never ours, whatever it points at
        raise UserError(f"{path}: not a page listen wrote, and listen writes its page there; move it aside and rerun")


def write_page(run_dir: Path) -> Path:
    """Write RUN/listen/index.html (atomically) and return its path (check_page said it may)."""
    path = Path(run_dir) / LISTEN_DIR / PAGE_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    # a lone surrogate (`"\ud800"` in a hand-edited scores.jsonl) is no UTF-8: it ended listen in a traceback
    atomic_write_text(path, render_page(run_dir).encode("utf-8", "replace").decode("utf-8"))
    return path
