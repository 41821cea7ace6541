"""The model files `prepare` runs: found in the official model directory, overridden by flags, looked up
in the Hugging Face cache, or downloaded with `--download` (each file's size and licence printed first).

Official layout (`--model-dir checkpoints/`): `config.yaml` (its top-level `version` names the family),
`gpt.pth`, `wav2vec2bert_stats.pt`, the tokenizer (`bpe.model` for IndexTTS2,
`multilingual_zh_ja_yue_char_del.tiktoken` for IndexTTS-2.5), `codec.pth` (2.5), and under
`hf_cache/` the w2v-BERT folder `w2v-bert-2.0/` and, for 2.5, `campplus_cn_common.bin`. The official
code points HF_HUB_CACHE at `hf_cache/`, so hub-cache layouts there are found as well. IndexTTS2's
semantic codec is MaskGCT's `semantic_codec/model.safetensors` (CC-BY-NC-4.0: non-commercial).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from indextts_train.config.family import INDEXTTS2, INDEXTTS25, Family, family_of_tokenizer
from indextts_train.config.settings import load_config
from indextts_train.errors import UserError
from indextts_train.files.bounded import check_file, load_yaml, open_regular
from indextts_train.prepare.w2vbert import check_config_sizes
from indextts_train.text.vocab import read_tokenizer


@dataclass(frozen=True)
class HubFile:
    """Where a model file lives on the Hugging Face hub, and its licence."""

    repo: str
    filename: str
    licence: str


W2V_BERT_FILES = ("config.json", "preprocessor_config.json", "model.safetensors")
W2V_BERT_HUB = tuple(HubFile("facebook/w2v-bert-2.0", name, "MIT") for name in W2V_BERT_FILES)
SEMANTIC_CODEC_HUB = HubFile("amphion/MaskGCT", "semantic_codec/model.safetensors",
                             "CC-BY-NC-4.0 (non-commercial use only)")
CAMPPLUS_HUB = HubFile("funasr/campplus", "campplus_cn_common.bin", "Apache-2.0")
# The codec each family's release folder holds (family.codec_file): what messages call it, its flag, its hub file.
CODEC_SOURCES = {INDEXTTS2: ("semantic codec (MaskGCT semantic_codec/model.safetensors)", "--semantic-codec",
                             SEMANTIC_CODEC_HUB),
                 INDEXTTS25: ("codec.pth", "", None)}
HASH_CHUNK = 16 << 20
# The largest file a model folder holds is a few GB (IndexTTS2's gpt.pth, w2v-BERT's model.safetensors).
# Every model file is hashed before any is read as a model: a 100 GB file (of holes, say) would be read
# for minutes before the one line that it is no model.
MAX_MODEL_FILE_BYTES = 16 << 30


@dataclass(frozen=True)
class Overrides:
    """`--w2v-bert DIR --semantic-codec FILE --campplus FILE --tokenizer FILE` (None = find it)."""

    w2v_bert: Path | None = None
    semantic_codec: Path | None = None
    campplus: Path | None = None
    tokenizer: Path | None = None


@dataclass
class ModelFiles:
    """Every file one prepare run reads, and the config's sections the stages need."""

    model_dir: Path
    family: Family
    config: Path
    gpt: Path
    stats: Path
    tokenizer: Path
    w2v_bert: Path  # a folder in the Hugging Face layout
    codec: Path  # IndexTTS2: MaskGCT semantic_codec/model.safetensors; 2.5: codec.pth
    codec_config: dict = field(default_factory=dict)
    campplus: Path | None = None  # 2.5 only

    def files(self) -> dict[str, Path]:
        """name -> file, for prepare.json's hashes (the w2v-BERT folder file by file)."""
        named = {"config": self.config, "gpt": self.gpt, "w2v_stats": self.stats, "tokenizer": self.tokenizer,
                 "codec": self.codec}
        named |= {f"w2v_bert/{name}": self.w2v_bert / name for name in W2V_BERT_FILES
                  if (self.w2v_bert / name).is_file()}
        if self.campplus is not None:
            named["campplus"] = self.campplus
        return named


def sha256_file(path: Path) -> str:
    """The file's sha256, read in chunks (a model file is GBs); a FIFO, device or /proc file is one line."""
    digest = hashlib.sha256()
    with open_regular(path, "model file") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > MAX_MODEL_FILE_BYTES:
            raise UserError(f"{path}: a model file of {size} bytes, larger than any this reads (at most "
                            f"{MAX_MODEL_FILE_BYTES >> 30} GiB); is this the right file?")
        while chunk := handle.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def model_hashes(models: ModelFiles) -> dict[str, str]:
    """sha256 of every model file: a rerun with other weights refuses to mix with this output."""
    return {name: sha256_file(path) for name, path in sorted(models.files().items())}


def _raw_config(path: Path) -> dict:
    load_config(path)  # the one place that says what is wrong with a config
    return load_yaml(path, "config")


def cached_hub_file(hub: HubFile, cache_dirs: list[Path | None]) -> Path | None:
    """The file in a Hugging Face cache (the model dir's hf_cache/, then the user's default cache)."""
    from huggingface_hub import try_to_load_from_cache

    for cache_dir in cache_dirs:
        if cache_dir is not None and not cache_dir.is_dir():
            continue
        found = try_to_load_from_cache(hub.repo, hub.filename, cache_dir=cache_dir)
        if isinstance(found, str):
            return Path(found)
    return None


def _download(hubs: list[HubFile], cache_dir: Path) -> None:
    """Print each file's size and licence, then fetch it into the model dir's hf_cache/."""
    from huggingface_hub import HfApi, hf_hub_download

    api = HfApi()
    try:
        for hub in hubs:
            info = api.get_paths_info(hub.repo, [hub.filename])
            size = info[0].size if info and getattr(info[0], "size", None) else None
            shown = f"{size / 1e6:.1f} MB" if size else "size unknown"
            print(f"downloading {hub.repo}/{hub.filename} ({shown}), licence {hub.licence}", flush=True)
            hf_hub_download(hub.repo, hub.filename, cache_dir=cache_dir)
    except Exception as exc:  # network, auth, disk: one line, the user decides
        raise UserError(f"--download: {type(exc).__name__}: {exc}; download the files by hand (see docs/prepare.md)"
                        ) from None


class _Finder:
    """Looks each file up in order: flag, official layout, hub caches; collects what is missing."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = model_dir
        self.caches: list[Path | None] = [model_dir / "hf_cache", None]
        self.missing: list[tuple[str, str, HubFile | None]] = []  # (file, where looked, hub source)

    def file(self, what: str, override: Path | None, flag: str, local: Path, hub: HubFile | None = None) -> Path:
        if override is not None:  # missing, a folder, a FIFO or a /proc file: one line naming the flag
            check_file(override, what, flag=flag)
            return override
        if local.is_file():
            return local
        cached = cached_hub_file(hub, self.caches) if hub is not None else None
        if cached is not None:
            return cached
        looked = f"{local}" + (f" and the Hugging Face caches ({hub.repo})" if hub else "")
        self.missing.append((what, looked, hub))
        return local

    def w2v_bert(self, override: Path | None) -> Path:
        if override is not None:
            if not (override / "config.json").is_file():
                raise UserError(f"--w2v-bert {override}: no config.json there; pass the facebook/w2v-bert-2.0 folder")
            return override
        local = self.model_dir / "hf_cache" / "w2v-bert-2.0"
        if all((local / name).is_file() for name in W2V_BERT_FILES):
            return local
        found = [cached_hub_file(hub, self.caches) for hub in W2V_BERT_HUB]
        if all(found) and len({path.parent for path in found}) == 1:
            return found[0].parent
        self.missing.append(("w2v-BERT (config.json, preprocessor_config.json, model.safetensors)",
                             f"{local}/ and the Hugging Face caches (facebook/w2v-bert-2.0)", None))
        return local


def _check_family_flags(overrides: Overrides, family: Family, codec_flag: str, config: Path) -> None:
    """A model file flag of the other family is a mix-up (a script written for it), said before any work,
    not ignored: --semantic-codec is IndexTTS2's, --campplus IndexTTS-2.5's."""
    given = [(flag, value) for flag, value, used in (("--semantic-codec", overrides.semantic_codec, bool(codec_flag)),
                                                     ("--campplus", overrides.campplus, family.speaker_vector))
             if value is not None and not used]
    if given:
        flag, value = given[0]
        raise UserError(f"{flag} {value}: {config} is {family.name}'s, whose features take no such file; leave "
                        f"{flag} out, or pass the model folder of the family it belongs to")


def _check_tokenizer_family(tokenizer: Path, overridden: bool, family: Family, config: Path) -> None:
    """A tokenizer of the other family is refused before any work. Nothing later catches every such pair:
    an IndexTTS2 .model for a 2.5 folder encoded every text without a language tag, and prepare wrote
    lines (`lang_id -1`) that check-data and train-gpt refuse, after all the audio work."""
    found = family_of_tokenizer(tokenizer)
    if found is family:
        return
    named = f"--tokenizer {tokenizer}" if overridden else f"{tokenizer} (dataset.bpe_model of {config})"
    raise UserError(f"{named}: an {found.name} {found.tokenizer_noun}, but {config} is {family.name}'s; pass "
                    f"{family.name}'s {family.tokenizer_label} ({family.tokenizer_name} or its extension) as "
                    "--tokenizer, or the model folder of the tokenizer's family as --model-dir")


def _check_tokenizer_file(tokenizer: Path, overridden: bool, config: Path) -> None:
    """The tokenizer is one, read now (a few MB at most) before anything is written: a gpt.pth given as
    --tokenizer was refused once the features loaded, after prepare.settings.json was written into --out."""
    try:
        read_tokenizer(tokenizer)
    except UserError as exc:
        named = f"--tokenizer {tokenizer}" if overridden else f"{tokenizer} (dataset.bpe_model of {config})"
        raise UserError(f"{named}: {str(exc).removeprefix(f'{tokenizer}: ')}") from None


def locate_models(model_dir: Path, overrides: Overrides, *, download: bool = False) -> ModelFiles:
    """Every model file of the family the config names, or one line listing what is missing and where to put it."""
    if not model_dir.is_dir():
        raise UserError(f"--model-dir {model_dir}: not a folder; pass the IndexTTS model folder (checkpoints/)")
    config_path = model_dir / "config.yaml"
    if not config_path.is_file():
        raise UserError(f"--model-dir {model_dir}: no config.yaml; pass the official model folder (checkpoints/)")
    raw = _raw_config(config_path)
    family = load_config(config_path).gpt.family
    finder = _Finder(model_dir)
    dataset = raw.get("dataset") if isinstance(raw.get("dataset"), dict) else {}
    # IndexTTS-2.5 inference opens its .tiktoken whatever dataset.bpe_model says: so does prepare.
    tokenizer_name = family.tokenizer_name if family.tokenizer_name_fixed else \
        dataset.get("bpe_model") or family.tokenizer_name
    stats_name = raw.get("w2v_stat") or "wav2vec2bert_stats.pt"
    gpt_name = raw.get("gpt_checkpoint") or "gpt.pth"
    files = {
        "gpt": finder.file(f"GPT {gpt_name}", None, "", model_dir / gpt_name),
        "stats": finder.file(f"w2v-BERT statistics {stats_name}", None, "", model_dir / stats_name),
        "tokenizer": finder.file(f"tokenizer {tokenizer_name}", overrides.tokenizer, "--tokenizer",
                                 model_dir / tokenizer_name),
    }
    what, flag, hub = CODEC_SOURCES[family]
    _check_family_flags(overrides, family, flag, config_path)
    _check_tokenizer_family(files["tokenizer"], overrides.tokenizer is not None, family, config_path)
    files["codec"] = finder.file(what, overrides.semantic_codec if flag else None, flag, model_dir / family.codec_file,
                                 hub)
    if family.speaker_vector:  # from the prompt's waveform, through CAMPPlus
        files["campplus"] = finder.file("CAMPPlus campplus_cn_common.bin", overrides.campplus, "--campplus",
                                        model_dir / "hf_cache" / CAMPPLUS_HUB.filename, CAMPPLUS_HUB)
    w2v_bert = finder.w2v_bert(overrides.w2v_bert)
    if finder.missing:
        _resolve_missing(finder, download)
        return locate_models(model_dir, overrides, download=False)
    check_config_sizes(w2v_bert)  # before any model is built or any audio read
    _check_tokenizer_file(files["tokenizer"], overrides.tokenizer is not None, config_path)
    codec_config = raw.get("semantic_codec") if isinstance(raw.get("semantic_codec"), dict) else {}
    return ModelFiles(model_dir=model_dir, family=family, config=config_path, w2v_bert=w2v_bert,
                      codec_config=dict(codec_config), **files)


def _resolve_missing(finder: _Finder, download: bool) -> None:
    """--download what the hub has; otherwise one message: each file, where it was looked for, where to put it."""
    hubs = [hub for _, _, hub in finder.missing if hub is not None]
    if any(what.startswith("w2v-BERT") for what, _, _ in finder.missing):
        hubs += list(W2V_BERT_HUB)
    local_only = [what for what, _, hub in finder.missing if hub is None and not what.startswith("w2v-BERT")]
    if download and hubs and not local_only:
        _download(hubs, finder.model_dir / "hf_cache")
        return
    listed = "; ".join(f"{what} (looked in {looked})" for what, looked, _ in finder.missing)
    hint = ("put them there, pass --w2v-bert/--semantic-codec/--campplus/--tokenizer" +
            ("" if download else ", or rerun with --download for the hub files (MaskGCT codec: CC-BY-NC-4.0)"))
    raise UserError(f"model files missing: {listed}; {hint}")
