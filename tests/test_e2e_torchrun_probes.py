"""torchrun probes: a rank whose peer is gone (it refused its own input, crashed or was killed) stops with
one line, and a start refused that way leaves nothing behind in the output dir."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from indextts_train import distributed
from indextts_train.distributed import PEER_LOST, DistInfo
from indextts_train.errors import UserError
from indextts_train.train import runlock
from indextts_train.train.runlock import LOCK_NAME, claim_run, holder_pid
from indextts_train.ui.text_log import TextLog

ROOT = Path(__file__).resolve().parents[1]
TWO = DistInfo(rank=0, world_size=2, local_rank=0)


def _peer_gone(*args, **kwargs):
    raise RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:45273. GLHF!")


@pytest.mark.parametrize("call", [
    lambda: distributed.any_rank(True, TWO, torch.device("cpu")),
    lambda: distributed.sum_across_ranks([1.0], TWO, torch.device("cpu")),
    lambda: distributed.all_reduce_sum(torch.zeros(1), TWO),
    lambda: distributed.gather_to_main({"a": 1}, TWO),
    lambda: distributed.barrier(TWO),
    lambda: distributed.broadcast_from_main("x", TWO),
])
def test_a_collective_whose_peer_is_gone_is_one_line(monkeypatch, call) -> None:
    for name in ("all_reduce", "all_gather_object", "barrier", "broadcast_object_list"):
        monkeypatch.setattr(dist, name, _peer_gone)
    with pytest.raises(UserError) as caught:
        call()
    said = str(caught.value)  # what torch said comes along: a collective may also fail for a cause of its own
    assert said == f"{PEER_LOST} (torch.distributed: [gloo/transport/tcp/pair.cc:553] Connection closed by peer " \
                   "[127.0.0.1]:45273. GLHF!)" and "\n" not in said


def test_a_peer_lost_in_ddps_own_all_reduce_is_one_line_and_other_errors_pass() -> None:
    with pytest.raises(UserError) as caught, distributed.ddp_collectives(TWO):
        _peer_gone()  # gloo's plain RuntimeError, as DDP's backward raises it when the peer is gone
    assert str(caught.value).startswith(PEER_LOST) and "pair.cc:553" in str(caught.value)
    with pytest.raises(UserError, match="another process"), distributed.ddp_collectives(TWO):
        raise dist.DistBackendError("NCCL communicator was aborted")
    # a forward or backward failing for its own cause is not a lost peer: out of memory is retried smaller
    for own in (torch.OutOfMemoryError("CUDA out of memory"), RuntimeError("shape mismatch in gloo_layer")):
        with pytest.raises(type(own)) as raised, distributed.ddp_collectives(TWO):
            raise own
        assert raised.value is own
    with pytest.raises(RuntimeError, match="pair.cc"), distributed.ddp_collectives(DistInfo()):
        _peer_gone()  # one process: no peer to lose, nothing to say of one


def _two_ranks(wrapper: Path, data: dict, out: Path, max_steps: int, **env: str) -> tuple[int, str]:
    """Exit code and output of a 2-process torchrun of `wrapper` (a script that runs the CLI) on the tiny data."""
    port = str(random.Random(str(out)).randint(20000, 40000))
    args = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", port,
            str(wrapper), "--train-manifest", str(data["train"]), "--config", str(data["config"]),
            "--base-checkpoint", str(data["base"]), "--output-dir", str(out), "--batch-size", "2",
            "--effective-batch-size", "4", "--num-workers", "0", "--max-steps", str(max_steps)]
    result = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=300,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **env})
    return result.returncode, result.stdout + result.stderr


RANK1_DIES_IN_FORWARD = textwrap.dedent("""\
    import os, runpy
    if os.environ.get("RANK") == "1":  # this rank dies (as by SIGKILL or the OOM killer) in its 3rd forward
        from indextts_train.train import loss_module
        real, calls = loss_module.LossModule.forward, []

        def forward(self, *args, **kwargs):
            calls.append(1)
            if len(calls) == 3:
                os._exit(9)
            return real(self, *args, **kwargs)

        loss_module.LossModule.forward = forward
    runpy.run_module("indextts_train", run_name="__main__", alter_sys=True)
    """)


@pytest.mark.slow
def test_a_rank_dying_mid_step_leaves_the_other_in_ddps_all_reduce_with_one_line(tiny_data, tmp_path) -> None:
    """Rank 0 is in its backward when rank 1 dies before its own: DDP's gradient all-reduce loses its peer."""
    wrapper = tmp_path / "rank1_dies.py"
    wrapper.write_text(RANK1_DIES_IN_FORWARD)
    code, printed = _two_ranks(wrapper, tiny_data, tmp_path / "run", max_steps=6)
    assert code != 0
    assert f"error: {PEER_LOST} (torch.distributed: " in printed, printed[-3000:]
    # no rank's traceback (torchrun prefixes a rank's with [rankN]; the launcher's own report names no file of ours)
    assert "[rank0]" not in printed and "/indextts_train/" not in printed, printed[-3000:]


def test_rank0_whose_peer_left_before_the_claim_leaves_nothing(monkeypatch, tmp_path) -> None:
    def gone(*args, **kwargs):
        raise UserError(PEER_LOST)

    monkeypatch.setattr(runlock, "any_rank", gone)
    out = tmp_path / "new" / "run"
    with pytest.raises(UserError, match="another process"):
        claim_run(out, TWO, torch.device("cpu"), TextLog())
    assert not (tmp_path / "new").exists()  # the folders it made, and the lock in them, are taken back

    out.mkdir(parents=True)
    (out / "keep.txt").write_text("mine")
    with pytest.raises(UserError, match="another process"):
        claim_run(out, TWO, torch.device("cpu"), TextLog())
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"] and holder_pid(out) is None
    assert not (out / LOCK_NAME).exists()


def test_a_refusal_rank_0_prints_is_not_printed_again_by_the_other_ranks(monkeypatch) -> None:
    from datetime import timedelta

    host = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(host.port))
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    rank1 = DistInfo(rank=1, world_size=2, local_rank=1)
    assert not distributed.said_by_main("error: x", rank1, wait_s=0.2)  # rank 0 said nothing: rank 1 says it
    assert not distributed.said_by_main("error: x", TWO)  # rank 0 always prints its line, and posts it
    assert distributed.said_by_main("error: x", rank1, wait_s=0.2)
    assert not distributed.said_by_main("error: only on this node", rank1, wait_s=0.2)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # a restarted job: rank 0 has not said it this time
    assert not distributed.said_by_main("error: x", rank1, wait_s=0.2)
    assert not distributed.said_by_main("error: x", DistInfo())  # one process: it prints its own
    monkeypatch.setenv("MASTER_PORT", "1")  # no store to reach: the rank says its own line
    assert not distributed.said_by_main("error: x", rank1, wait_s=0.2)


@pytest.mark.slow
def test_every_rank_refusing_the_same_input_prints_it_once(tmp_path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x"}\n')
    port = str(random.Random(str(tmp_path)).randint(20000, 40000))
    args = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", port,
            "-m", "indextts_train", "train", "--train-manifest", str(bad),
            "--config", str(ROOT / "configs" / "tiny.yaml"), "--output-dir", str(tmp_path / "run"), "--max-steps", "2"]
    result = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=300,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("error: ")]
    assert result.returncode != 0 and len(lines) == 1 and f"{bad}:1: neither the paired form" in lines[0], lines
    assert not (tmp_path / "run").exists()


RANK1_MANIFEST = textwrap.dedent("""\
    import os, runpy, sys
    if os.environ.get("RANK") == "1":  # this rank alone is given a manifest that is not there
        sys.argv = [a if a != os.environ["PROBE_TRAIN"] else a + ".missing" for a in sys.argv]
    runpy.run_module("indextts_train", run_name="__main__", alter_sys=True)
    """)


@pytest.mark.slow
def test_one_rank_refusing_its_input_gives_no_traceback_and_no_folder(tiny_data, tmp_path) -> None:
    wrapper = tmp_path / "rank1_missing.py"
    wrapper.write_text(RANK1_MANIFEST)
    out = tmp_path / "run"
    code, printed = _two_ranks(wrapper, tiny_data, out, max_steps=2, PROBE_TRAIN=str(tiny_data["train"]))
    assert code != 0
    assert "manifest not found" in printed
    assert "[rank0]" not in printed and "[rank1]" not in printed, printed  # no rank's traceback
    assert not out.exists(), sorted(p.name for p in out.iterdir())


@pytest.mark.parametrize(("env", "said"), [
    ({"WORLD_SIZE": "2"}, "RANK, MASTER_ADDR, MASTER_PORT is not"),
    ({"WORLD_SIZE": "2", "RANK": "0", "MASTER_PORT": "1"}, "MASTER_ADDR is not"),
    ({"WORLD_SIZE": "two"}, "not a number of processes"),
    ({"WORLD_SIZE": "0"}, "not a number of processes"),
    ({"WORLD_SIZE": "\u00b2"}, "not a number of processes"),  # a digit int() does not read: a ValueError
    # set by hand, not by torchrun: a ValueError traceback, or (RANK past the last) a wait for peers without end
    ({"WORLD_SIZE": "2", "RANK": "abc", "MASTER_ADDR": "x", "MASTER_PORT": "1"}, "RANK='abc' .* not a rank of 0..1"),
    ({"WORLD_SIZE": "2", "RANK": "5", "MASTER_ADDR": "x", "MASTER_PORT": "1"}, "RANK='5' .* not a rank of 0..1"),
    ({"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "x", "MASTER_PORT": "abc"}, "MASTER_PORT='abc' .* not a port"),
    ({"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "x", "MASTER_PORT": "99999999"}, "not a port of 0..65535"),
    ({"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "-1", "MASTER_ADDR": "x", "MASTER_PORT": "1"},
     "LOCAL_RANK='-1' .* not a rank"),
])
def test_a_world_size_left_in_the_environment_is_one_line(monkeypatch, env, said) -> None:
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(UserError, match=said):
        distributed.launched_processes()
    with pytest.raises(UserError, match=said):
        distributed.setup_distributed()
