"""Where `export` may write: each target is checked before the checkpoint is read, and nothing of the
user's is replaced that the export did not mean to replace.

`--force` replaces an existing file of the kind its flag writes, and only that: a torch file under `-o` and
`--adapters-out`, a YAML mapping under `--config-out`, a tokenizer under the tokenizer copy's name. The
run's tokenizer, its manifests or the official config typed by mistake after `-o` are refused even with
--force, as `check-data --write-clean` replaces only a manifest. A symbolic link is replaced itself, never
the file it points to.
"""

from __future__ import annotations

import stat
from pathlib import Path

from indextts_train.checkpoint.files import BEST, LATEST
from indextts_train.checkpoint.run_folder import same_file, step_of
from indextts_train.checkpoint.scores import LISTEN_DIR, SCORES_NAME
from indextts_train.checkpoint.verify import is_training_checkpoint
from indextts_train.errors import UserError
from indextts_train.files.bounded import kind_of_path, open_regular, yaml_text
from indextts_train.files.targets import check_parent, same_path
from indextts_train.text.vocab import read_tokenizer

# How much of an existing target is read to tell its kind: a config.yaml is a few KiB; a torch file says
# its kind in its first bytes.
KIND_HEAD_BYTES = 1 << 20
TORCH_MAGIC = (b"PK\x03\x04", b"\x80")  # torch.save's zip archive, or its legacy pickle
WRITES = {"-o": "a torch file (an exported gpt.pth)", "--adapters-out": "a torch file (an adapters file)",
          "--config-out": "a YAML config", "--tokenizer": "a tokenizer"}


def check_targets(checkpoint: Path, base_config: Path | None, tokenizer: Path | None,
                  targets: dict[str, Path | None], force: bool, replaceable: set[Path]) -> None:
    """Refuse, before the checkpoint is read, a target that is an input, a folder, under a file, another
    target, a training checkpoint (even with --force), any existing file without --force (but for
    `replaceable`: what an interrupted run of this same command published), and with --force a file that
    is not of the kind the flag writes.

    samefile, not path equality: a run's model_step{N}.pth is a hard link of latest.pth. The tokenizer
    copy may be the tokenizer itself (it is then left as it is).
    """
    inputs = [path for path in (checkpoint, base_config, tokenizer) if path is not None and path.exists()]
    named = [(flag, target) for flag, target in targets.items() if target is not None]
    for flag, target in named:
        _check_place(flag, target)
        if not (target.exists() or target.is_symlink()) or (flag == "--tokenizer" and same_file(target, tokenizer)):
            _check_name(flag, target)
            continue
        if any(same_file(target, source) for source in inputs):
            raise UserError(f"{target}: refusing to overwrite an input file; choose another output path")
        if is_training_checkpoint(target):
            other = target.with_name(f"{target.stem}_export{target.suffix}")
            raise UserError(f"{flag} {target} is a training checkpoint: export never replaces one, even with "
                            f"--force; choose another name (e.g. {other})")
        _check_name(flag, target)
        if target.absolute() in replaceable:
            continue
        if not force:
            raise UserError(f"{flag} {target} already exists; pass --force to replace it, or choose another path")
        _check_kind(flag, target)
    for i, (flag, target) in enumerate(named):
        twin = next((other for other, path in named[:i] if same_path(path, target)), None)
        if twin is not None:
            raise UserError(f"{target}: {flag} and {twin} are the same file; give each its own path")


def _check_name(flag: str, target: Path) -> None:
    """No export under a training checkpoint's name: a run in that folder, now or later, would take it for
    one of its own (and refuse to save its step over it). Nor over listen's scores, the history of what was
    heard, which --force would have replaced."""
    if target.name in (LATEST, BEST) or step_of(target) is not None:
        raise UserError(f"{flag} {target}: a training checkpoint's name, which a run in that folder would take "
                        f"for one of its own; name the export e.g. {target.with_name('gpt.pth')}")
    if target.name == SCORES_NAME and target.parent.name == LISTEN_DIR:
        raise UserError(f"{flag} {target}: listen's scores of the run, which export never replaces, even with "
                        "--force; choose another path")


def _check_place(flag: str, target: Path) -> None:
    """A target must be a file path whose nearest existing folder is a folder."""
    if target.is_dir():
        raise UserError(f"{flag} {target} is a folder; give the file path to write (e.g. {target / 'gpt.pth'})")
    check_parent(flag, target)


def _check_kind(flag: str, target: Path) -> None:
    """With --force: the existing target is a link (replaced itself) or a file of the kind `flag` writes."""
    info = target.lstat()
    if stat.S_ISLNK(info.st_mode):
        return
    if not stat.S_ISREG(info.st_mode):
        raise UserError(f"{flag} {target} is {kind_of_path(target)}, not a file; choose another path")
    if not _of_kind(flag, target):
        raise UserError(f"{flag} {target} exists and is not {WRITES[flag]}, so --force does not replace it: it may "
                        "be the run's tokenizer, a manifest or another input typed there; choose another path")


def _of_kind(flag: str, target: Path) -> bool:
    if flag == "--tokenizer":
        try:
            read_tokenizer(target)
        except UserError:
            return False
        return True
    try:
        with open_regular(target) as handle:
            head = handle.read(KIND_HEAD_BYTES + 1)
    except (OSError, UserError):
        return False
    if flag != "--config-out":
        return head.startswith(TORCH_MAGIC)
    if len(head) > KIND_HEAD_BYTES:
        return False  # no config.yaml is that long
    try:
        return isinstance(yaml_text(head.decode("utf-8"), str(target)), dict)  # safe and bounded, as configs are read
    except (UnicodeDecodeError, UserError):
        return False
