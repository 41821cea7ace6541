"""The run's data: its manifests indexed (training, and validation when given), the datasets the
model reads, and the validation groups with what each validation is judged by.

Setup reads them once the model's family is known, after the weights (a resumed checkpoint may be
what settles it): `RunData.read` indexes the lines of the model's family (a line of the other is
refused, or skipped with --skip-bad-lines, as the check of the first lines before anything was made
treats it: train/preflight.py), `RunData.datasets` builds the datasets the run reads. A borrowed language
(--borrow-language NEW=CODE) no training line is in is refused there: the run, its checkpoints and the
export would say NEW was trained on CODE's row when nothing was.
"""

from __future__ import annotations

from dataclasses import dataclass

from indextts_train.checkpoint.run_folder import same_file
from indextts_train.config.metric_names import parse_forgetting_limit
from indextts_train.config.settings import Config
from indextts_train.data.manifest import ManifestDataset, ManifestIndex
from indextts_train.data.sampling import ManifestSpec
from indextts_train.errors import UserError
from indextts_train.text.languages import parse_borrowed
from indextts_train.train.best import check_metric
from indextts_train.train.listen_check import GenerationCheck
from indextts_train.train.run import Validation
from indextts_train.train.validation import check_limit_groups
from indextts_train.ui.console import RunLogger
from indextts_train.ui.run_settings import RunSettings


def _index(manifests: list[ManifestSpec], options: RunSettings, config: Config) -> ManifestIndex:
    return ManifestIndex.build([m.path for m in manifests], skip_bad=options.skip_bad_lines,
                               max_text_tokens=config.gpt.max_text_tokens, max_mel_tokens=config.gpt.max_mel_tokens,
                               family=config.gpt.family, borrowed=parse_borrowed(config.train.borrow_languages))


def _check_borrowed(index: ManifestIndex, options: RunSettings, config: Config) -> None:
    """Refuse a borrowed language that no training line is in (its `language` field, as the index reads it):
    the borrowing would change nothing, yet the training log and the export's notes would say the language
    was trained on the row. Refused from a config file or a recorded run too, as those notes follow from it."""
    if not config.gpt.family.language_rows:  # not read (typed, refused before: config/unread_settings.py)
        return
    languages = {name.strip().lower() for name in index.language_names}
    for value in config.train.borrow_languages:
        new, _, code = (part.strip().lower() for part in value.partition("="))
        if new in languages:
            continue
        given = (f"--borrow-language {value}" if "borrow_languages" in options.named
                 else f"train.borrow_languages {value!r} (the config's or the recorded run's)")
        found = ", ".join(sorted(languages)) or "none stated"
        raise UserError(f"{given}: no --train-manifest line is in {new} (their languages: {found}), so {new} "
                        f"would not be trained on the row of {code}; give {new}'s lines \"language\": \"{new}\", "
                        "or leave the borrowing out")


@dataclass(frozen=True)
class RunData:
    """The training manifests and their index; the validation manifests and theirs (None: no validation)."""

    train_specs: list[ManifestSpec]
    index: ManifestIndex
    val_specs: list[ManifestSpec]
    val_index: ManifestIndex | None

    @classmethod
    def read(cls, options: RunSettings, config: Config, log: RunLogger) -> RunData:
        """Index the manifests of the run; skipped bad lines are said, judged validations need validation data."""
        train_specs, val_specs = list(options.train_manifests), list(options.val_manifests)
        index = _index(train_specs, options, config)
        _check_borrowed(index, options, config)
        if index.skipped:
            log.warn(f"skipped {index.skipped} bad manifest line(s), e.g. {index.skipped_examples[0]}")
        if not val_specs and (config.train.early_stop_patience or config.train.forgetting_limit):
            raise UserError("--early-stop-patience and --forgetting-limit judge validations: pass --val-manifest")
        shared = next((val for val in val_specs if any(same_file(val.path, t.path) for t in train_specs)), None)
        if shared is not None:  # a newcomer's wrong turn: the loss would then fall as the model memorises
            log.warn(f"--val-manifest {shared.path} is also a --train-manifest: validation would measure lines the "
                     "model trains on, not how it does on new ones; hold lines out for it (prepare writes val.jsonl)")
        val_index = _index(val_specs, options, config) if val_specs else None
        also = val_index.lines_also_in(index) if val_index is not None and shared is None else ()
        if len(also):  # prepare's utterances.jsonl (every line) given with its val.jsonl, say
            log.warn(f"{len(also)} of the {len(val_index)} --val-manifest lines train too (the same codes file as a "
                     f"--train-manifest line; e.g. {val_index.source(int(also[0]))}): validation would measure "
                     "lines the model trains on; hold them out (prepare's train.jsonl leaves out its val.jsonl, its "
                     "utterances.jsonl holds every line)")
        return cls(train_specs, index, val_specs, val_index)

    def datasets(self, config: Config) -> tuple[ManifestDataset, Validation | None]:
        """The training samples as the model reads them; the validation samples and their groups (the
        data's part); then the metric and limits validations are judged by, and the lines generated at each."""
        val = self.val_index
        train_set = ManifestDataset.for_model(self.index, config.gpt)
        dataset = None if val is None else ManifestDataset.for_model(val, config.gpt)
        groups = {} if val is None else val.group_lines(self.val_specs)
        if dataset is None:
            return train_set, None
        train = config.train
        reported = list(groups) if len(groups) > 1 else []  # one group is only the total
        check_metric(train.best_metric, reported)
        limits = parse_forgetting_limit(train.forgetting_limit) if train.forgetting_limit else {}
        check_limit_groups(limits, reported)
        generation = GenerationCheck.build(dataset, groups, count=train.listen_lines, seed=train.seed,
                                           max_codes=config.gpt.max_mel_tokens)
        return train_set, Validation(dataset, groups, limits, train.early_stop_patience, generation)
