"""Shared fixtures: the tiny config, a small synthetic dataset and a base checkpoint, all on disk."""

from __future__ import annotations

import json
import os
import subprocess
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

# Every process of the suite, pytest's own and the CLI runs it starts, computes on one torch thread.
# The kill/resume tests compare runs of different processes bit for bit, and on this project's VM
# multi-threaded CPU kernels are not reproducible from one process to the next: with 2 threads, 6 of
# 1,420 fresh processes computed a few seeded ops (`x.exp().sum(1)` among them) with other last bits,
# and a CI run saw an unbroken tiny training run differ from its twin at step 1; with 1 thread, none
# (benchmarks/README.md).
# The tests are of this program's exactness, not of the platform's threading.
os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "tests" / "data" / "reference"
TINY_CONFIG = ROOT / "configs" / "tiny.yaml"

# The synthesis tests need the official inference packages, each in an environment of its own: their
# lane, scripts/test_listen.sh (which scripts/test.sh runs after the suite), makes the environments and
# names their interpreters; the main run has neither, so it does not collect those files.
LANE_FILES = ["test_listen_inference.py", "test_listen_run.py"]
collect_ignore = [] if os.environ.get("INDEXTTS_TEST_PYTHON_V25") else LANE_FILES


@pytest.fixture(scope="module")
def one_torch_thread():
    """Hundreds of small ops (the prepare models at tiny size): on a busy shared CPU, thread hand-offs
    cost more than they save, so these modules run torch on one thread and restore it after."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# The fast lane (`pytest -m "not slow"`, for everyday work) is chosen by what a test does: a test that
# starts a process (the real CLI, a training run, a browser) or takes seconds carries the `slow` marker
# (a module's `pytestmark` where every test of it does). The guard below keeps that true: a test
# without the marker that starts a process fails, naming the command, and one that ran longer than
# SLOW_SECONDS is listed at the end of the session (timing depends on the machine's load, so it is
# reported, not failed). The README's test command runs all.
SLOW_SECONDS = 3.0
_LONG_FAST_TESTS: list[tuple[float, str]] = []  # (seconds, test id) of the unmarked tests over SLOW_SECONDS


@contextmanager
def _processes_watched(item: pytest.Item, phase: str):
    """Fails a test not marked slow whose `phase` (setup: its fixtures; call: its body) starts a process."""
    if item.get_closest_marker("slow"):
        yield
        return
    started: list[str] = []
    # The class itself, held: a test that replaces the name subprocess.Popen (monkeypatch) had the restore below
    # land on its stand-in, and the real class kept the watch for every later test of the worker.
    popen = subprocess.Popen
    real_init = popen.__init__

    def watched_init(self, args, *rest, **kwargs):
        started.append(os.fsdecode(args) if isinstance(args, (str, bytes)) else " ".join(map(os.fsdecode, args)))
        real_init(self, args, *rest, **kwargs)

    popen.__init__ = watched_init
    try:
        yield
    finally:
        popen.__init__ = real_init
    if started:
        pytest.fail(f"{item.nodeid} starts a process in its {phase} ({started[0][:200]}) but is not marked "
                    "slow: add @pytest.mark.slow (the fast lane leaves out tests that start processes)",
                    pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    with _processes_watched(item, "fixtures"):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    with _processes_watched(item, "body"):
        return (yield)


# scripts/test.sh sends whole files to the workers (--dist loadfile), in collection order
# (--no-loadscope-reorder). Ordered longest first, no long file is the one left running alone at the end
# while the other workers idle (the longest-processing-time-first rule); xdist's own order, by number of
# tests, started a file of one 150 s test last. durations.json holds each file's seconds as last measured
# (`pytest -n 2 --dist loadfile --record-durations`); a file it does not name counts as the median one.
DURATIONS = Path(__file__).with_name("durations.json")
_FILE_SECONDS: dict[str, float] = {}  # this session's seconds per test file (--record-durations)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--record-durations", action="store_true",
                     help=f"write each test file's seconds in this session to {DURATIONS.name} (for the order)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    known = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}
    usual = sorted(known.values())[len(known) // 2] if known else 0.0
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        first.setdefault(_file_of(item.nodeid), index)
    # Stable: a file's tests keep their order (its module fixtures are built once, in that order).
    items.sort(key=lambda item: (-known.get(_file_of(item.nodeid), usual), first[_file_of(item.nodeid)]))


def _file_of(nodeid: str) -> str:
    return Path(nodeid.partition("::")[0]).name


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and report.duration > SLOW_SECONDS and "slow" not in report.keywords:
        _LONG_FAST_TESTS.append((report.duration, report.nodeid))
    file = _file_of(report.nodeid)
    _FILE_SECONDS[file] = _FILE_SECONDS.get(file, 0.0) + report.duration  # setup, call and teardown


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    if config.getoption("--record-durations") and not hasattr(config, "workerinput"):  # the controller: all files
        DURATIONS.write_text(json.dumps({file: round(seconds, 1) for file, seconds in sorted(_FILE_SECONDS.items())},
                                        indent=0) + "\n")


def pytest_terminal_summary(terminalreporter) -> None:
    if _LONG_FAST_TESTS:
        terminalreporter.section(f"tests not marked slow that ran over {SLOW_SECONDS:.0f} s: mark them slow")
        for duration, nodeid in sorted(_LONG_FAST_TESTS, reverse=True):
            terminalreporter.write_line(f"{duration:6.1f}s {nodeid}")


def write_dataset(folder: Path, n: int, *, seed: int, text_vocab: int = 100, dim: int = 64,
                  name: str = "train.jsonl", max_text: int = 12, max_codes: int = 20) -> Path:
    """A paired manifest of n samples whose codes depend on the text, so a model can learn it."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(n):
        uid = f"{name.split('.')[0]}{i}"
        text = rng.integers(2, text_vocab, size=int(rng.integers(3, max_text + 1))).astype(np.int32)
        codes = ((np.repeat(text, 2)[:max_codes] * 7) % 64).astype(np.int32)
        np.save(folder / f"{uid}_text.npy", text)
        np.save(folder / f"{uid}_codes.npy", codes)
        np.save(folder / f"{uid}_cond.npy", rng.standard_normal((32, dim)).astype(np.float32))
        np.save(folder / f"{uid}_emo.npy", (0.5 * rng.standard_normal(dim)).astype(np.float32))
        lines.append(json.dumps({
            "id": uid, "speaker": "spk0", "prompt_condition_path": f"{uid}_cond.npy",
            "prompt_emo_vec_path": f"{uid}_emo.npy", "target_text_ids_path": f"{uid}_text.npy",
            "target_codes_path": f"{uid}_codes.npy", "target_text_len": len(text),
            "target_code_len": len(codes),
        }))
    manifest = folder / name
    manifest.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return manifest


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> dict:
    """24 training and 8 validation samples plus a base gpt.pth at the tiny size (vocab 100)."""
    from indextts_train.demo import make_base_checkpoint

    folder = tmp_path_factory.mktemp("tiny_data")
    base = folder / "base_gpt.pth"
    make_base_checkpoint(TINY_CONFIG, base, seed=3)
    return {
        "train": write_dataset(folder, 24, seed=1, name="train.jsonl"),
        "val": write_dataset(folder, 8, seed=2, name="val.jsonl"),
        "base": base,
        "config": TINY_CONFIG,
        "folder": folder,
    }


@pytest.fixture(scope="session")
def tiny25_data(tmp_path_factory) -> dict:
    """IndexTTS-2.5 at the tiny size: the demo's toy tiktoken vocabularies (base 320 ranks, grown by 50
    Amharic ranks), 24 training and 8 validation samples in English and Amharic, and a base gpt.pth."""
    from indextts_train.config.settings import load_config
    from indextts_train.data.demo_data import make_demo_dataset
    from indextts_train.demo import make_base_checkpoint

    folder = tmp_path_factory.mktemp("tiny25_data")
    config = ROOT / "configs" / "tiny_v25.yaml"
    paths = make_demo_dataset(folder, gpt_cfg=load_config(config).gpt, n_train=24, n_val=8, seed=1)
    base = folder / "base_gpt.pth"
    make_base_checkpoint(config, base, seed=3)
    return {"train": paths["train_manifest"], "val": paths["val_manifest"], "base": base, "config": config,
            "tokenizer": paths["tokenizer"], "base_tokenizer": paths["base_tokenizer"], "folder": folder,
            "base_ranks": paths["base_ranks"], "added": paths["added"]}


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> Path:
    """What `prepare --model-dir` reads, as `prepare/tiny.py` writes it: the official IndexTTS2 layout at
    the tiny size (seeded random weights, the tiny BPE tokenizer), 200 codes a clip (4 s) as the tests'
    clips need. Shared by the session: read it, or copy it to change it."""
    import yaml

    from indextts_train.prepare.tiny import write_tiny_model_dir

    folder = tmp_path_factory.mktemp("tiny_models")
    config = yaml.safe_load(TINY_CONFIG.read_text())
    config["gpt"]["max_mel_tokens"] = 200
    (folder / "tiny.yaml").write_text(yaml.safe_dump(config))
    return write_tiny_model_dir(folder / "models", gpt_config=folder / "tiny.yaml", seed=1,
                                tokenizer=REFERENCE / "prepare" / "text" / "bpe_tiny.model")


@pytest.fixture(scope="module")
def tiny_reference_cfg():
    """The GPT config of the official tiny IndexTTS2 reference (tests/data/reference/tiny)."""
    from indextts_train.config.settings import load_config

    return load_config(REFERENCE / "tiny" / "config.yaml").gpt


@pytest.fixture(scope="module")
def tiny_reference_sd() -> dict:
    """The official tiny reference's gpt.pth, every tensor (trained and carried)."""
    import torch

    return torch.load(REFERENCE / "tiny" / "gpt.pth", weights_only=True)
