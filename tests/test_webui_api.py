"""The page's boundary through its HTTP API, as any visitor can call it: a real `indextts-train webui
--root ROOT` on 127.0.0.1, called with the Gradio client. Option-like values, symlinks that lead out
of the root, outside paths, a --from-run record naming outside files, NUL bytes and lone surrogates:
each gets one line in the page's answer, and nothing outside the root is read or changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from helpers import ROOT

from indextts_train.ui.run_record import write_run_record

pytestmark = pytest.mark.slow  # one web server for the module (Gradio starts in 10-60 s on a busy machine)

SECRET = "outside-secret-7f3a"  # in every outside file: no answer of the page may contain it
NUMBERS = [None] * 17


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def snapshot(folder: Path) -> dict[str, tuple[str, int]]:
    """Every file under `folder` (links not followed): its content hash and mtime."""
    found = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not path.is_symlink():
            found[str(path)] = (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns)
    return found


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """ROOT with a run folder whose files lead outside, and an OUTSIDE folder the page must not touch."""
    base = tmp_path_factory.mktemp("api")
    root, outside = base / "root", base / "outside"
    (root / "run").mkdir(parents=True)
    outside.mkdir()
    for name in ("train.log", "victim.jsonl", "bpe.model", "gpt.pth", "model_step7.pth", "c.yaml"):
        (outside / name).write_text(f"{SECRET} {name}\n")
    (root / "run" / "train.log").symlink_to(outside / "train.log")
    (root / "run" / "model_step7.pth").symlink_to(outside / "model_step7.pth")
    (root / "run" / "run.yaml").symlink_to(outside / "c.yaml")
    (root / "out").symlink_to(outside)  # a folder by name inside, outside once followed
    (root / "t.jsonl").write_text("")
    (root / "c.yaml").write_bytes((ROOT / "configs" / "tiny.yaml").read_bytes())
    log = open(base / "webui.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "-m", "indextts_train", "webui", "--port", str(_free_port()),
                             "--root", str(root)], cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = next((line.split()[2] for line in proc.stdout if line.startswith("indextts-train webui: ")), None)
    if url is None:
        proc.wait()
        pytest.fail("webui did not start")
    before = snapshot(outside)
    yield {"root": root, "outside": outside, "url": url}
    proc.terminate()
    proc.wait(timeout=60)
    log.close()
    assert snapshot(outside) == before  # nothing outside the root was written, by any test here


def form(root: Path, **fields) -> list:
    values = {"train": f"{root}/t.jsonl", "val": "", "tokenizer": "", "config": f"{root}/c.yaml", "base": "",
              "output_dir": f"{root}/run2", "amp": "auto", "extra": "", **fields}
    return [values["train"], values["val"], values["tokenizer"], values["config"], values["base"],
            values["output_dir"], *NUMBERS, values["amp"], values["extra"]]


def call(site, api: str, *args):
    """POST the arguments as JSON (\\u escapes: a lone surrogate goes as a visitor's browser may send it),
    then read the answer from the event stream, as Gradio's HTTP API works."""
    body = json.dumps({"data": list(args)}).encode()  # ensure_ascii: lone surrogates as \\udXXX
    request = urllib.request.Request(f"{site['url']}gradio_api/call/{api}", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        event = json.load(response)["event_id"]
    with urllib.request.urlopen(f"{site['url']}gradio_api/call/{api}/{event}", timeout=300) as response:
        stream = response.read().decode()
    events = [block.split("\ndata: ", 1) for block in stream.strip().split("\n\n")]
    kind, data = [event for event in events if event[0] != "event: heartbeat"][-1]
    assert kind == "event: complete", stream  # an exception in a handler is an 'error' event
    answer = json.loads(data)
    answer = answer[0] if len(answer) == 1 else answer
    text = repr(answer)
    assert SECRET not in text, (api, text)  # nothing read outside the root comes back
    return answer


def refused(answer, *says: str) -> None:
    """One line starting with error: (or the preview's '(not ready)') that names why."""
    line = answer[0] if isinstance(answer, (tuple, list)) else answer
    assert line.startswith(("error: ", "(not ready) ")) and "\n" not in line, line
    assert any(s in line for s in says), line


CHECKS, STARTS = ("check_data", "preview", "start", "resume"), ("preview", "start", "resume")
# (the page's endpoints that take the field, the field's value, what the one-line refusal says)
CASES = [
    (CHECKS, {"train": "{root}/t.jsonl\n--write-clean={outside}/victim.jsonl"}, "starts with '-'"),
    (CHECKS, {"train": "--write-clean={outside}/victim.jsonl"}, "starts with '-'"),
    (CHECKS, {"val": "{root}/out/victim.jsonl"}, "outside the folders"),
    ((*CHECKS, "check_tokenizer"), {"tokenizer": "--help"}, "starts with '-'"),
    ((*CHECKS, "check_tokenizer"), {"tokenizer": "{root}/out/bpe.model"}, "outside the folders"),
    ((*CHECKS, "check_tokenizer"), {"tokenizer": "{root}/bpe\ud800.model"}, "lone surrogate"),
    (CHECKS, {"config": "{root}/../outside/c.yaml"}, "outside the folders"),
    (CHECKS, {"config": "{root}/c.yaml\x00--help"}, "NUL byte"),
    (STARTS, {"base": "{outside}/gpt.pth"}, "outside the folders"),
    (STARTS, {"output_dir": "{root}/out"}, "outside the folders"),
    (("start", "resume"), {"output_dir": "{root}/run"}, "symbolic link(s) leading outside"),  # 3 links there
    (STARTS, {"output_dir": "{root}/run\x00x"}, "NUL byte"),
    (STARTS, {"output_dir": "\udcff"}, "lone surrogate"),
    (STARTS, {"extra": "--help"}, "not a train-gpt flag"),
    (STARTS, {"extra": "--tokenizer {outside}/bpe.model"}, "has its own field"),
    (STARTS, {"extra": "--lora-targets --help"}, "starts with '-'"),
    (STARTS, {"extra": "--from-run {root}/recorded.yaml"}, "--from-run"),  # a record naming a tokenizer outside
    (STARTS, {"extra": "--from-run={root}/out/c.yaml"}, "outside the folders"),
]


@pytest.mark.parametrize(("endpoints", "fields", "says"), CASES)
def test_no_button_runs_anything_steered(site, endpoints, fields, says) -> None:
    root = site["root"]
    if not (root / "recorded.yaml").exists():
        write_run_record(root, {"train_manifests": [f"{root}/t.jsonl"], "output_dir": f"{root}/run2",
                                "tokenizer": str(site["outside"] / "bpe.model")}, {}, {}, 0.0)
        (root / "run.yaml").rename(root / "recorded.yaml")
    values = form(root, **{k: v.format(root=root, outside=site["outside"]) for k, v in fields.items()})
    for endpoint in endpoints:
        arguments = {"start": [*values, None], "resume": ["auto", *values, None]}.get(endpoint, values)
        refused(call(site, endpoint, *arguments), says)
    assert not (root / "run2").exists()


def test_watch_records_and_export_do_not_follow_links_out_of_the_root(site) -> None:
    root = site["root"]
    status, _, tail, _, notices = call(site, "watch", str(root / "run"))
    assert status == "no run in this output dir yet"
    assert tail.startswith("train.log not read: ") and "a symbolic link; the page reads and writes only" in tail
    for name in ("train.log", "model_step7.pth", "run.yaml"):
        assert f"not used (leads outside the folders this page may touch): {name} -> " in notices
    _, table, _, export_choice = call(site, "run_records", str(root / "run"), "auto", None)
    (row,) = table["data"]
    assert row[:2] == ["model_step7.pth", "REFUSED"] and "not read" in row[-1]
    assert export_choice.get("choices") == []  # a refused checkpoint is offered neither for resume nor export
    for path in (str(root / "out"), str(root / "run" / "x\x00")):
        refused(call(site, "watch", path), "outside the folders", "NUL byte")
        refused(call(site, "stop", path), "outside the folders", "NUL byte")


@pytest.mark.parametrize(("export_dir", "tokenizer", "says"), [
    ("{root}/out", "", "outside the folders"), ("--force", "", "starts with '-'"),
    ("{root}/run", "", "symbolic link(s) leading outside"), ("{root}/x\n--help", "", "control character"),
    ("", "{root}/out/bpe.model", "outside the folders"), ("", "--help", "starts with '-'"),
])
def test_export_writes_nowhere_outside(site, export_dir, tokenizer, says) -> None:
    # The checkpoint is a dropdown: Gradio itself refuses a value it did not offer this session.
    root = site["root"]
    refused(call(site, "export", None, export_dir.format(root=root), str(root / "run"), tokenizer.format(root=root),
                 ""), says)


def test_what_lies_inside_the_root_still_runs(site) -> None:
    """The boundary refuses what crosses it, not the page's work: a form inside the root runs."""
    root = site["root"].resolve()
    values = form(site["root"], tokenizer=f"{root}/c.yaml", extra="--lora-rank 7 --skip-bad-lines")
    assert call(site, "preview", *values).endswith(
        f"train --train-manifest={root}/t.jsonl --config={root}/c.yaml --tokenizer={root}/c.yaml "
        f"--output-dir={root}/run2 --lora-rank=7 --skip-bad-lines")
    report = call(site, "check_data", *form(site["root"]))
    assert report.startswith("$ ") and f"check-data --config={root}/c.yaml -- {root}/t.jsonl\n" in report
    assert report.endswith("\n(exit 2)") and f"error: {root}/t.jsonl: " in report  # check-data's own word on it


def test_no_visitor_uploads_a_file(site) -> None:
    """The page takes no file, yet Gradio's upload route wrote any visitor's file, of any size, into its temporary
    folder (outside the root); a form on any web site the user's browser visits can send one (no CORS preflight)."""
    content = f"{SECRET} uploaded {os.getpid()}\n".encode()
    body = (b"--b\r\nContent-Disposition: form-data; name=\"files\"; filename=\"up.txt\"\r\n"
            b"Content-Type: text/plain\r\n\r\n" + content + b"\r\n--b--\r\n")
    request = urllib.request.Request(f"{site['url']}gradio_api/upload", data=body, headers={
        "Content-Type": "multipart/form-data; boundary=b", "Origin": "http://elsewhere.example"})
    with pytest.raises(urllib.error.HTTPError) as refused_upload:
        urllib.request.urlopen(request, timeout=60)
    assert refused_upload.value.code == 413
    uploads = Path(os.environ.get("GRADIO_TEMP_DIR") or Path(tempfile.gettempdir()) / "gradio")
    assert not (uploads / hashlib.sha256(content).hexdigest()).exists()


def test_a_request_for_another_host_name_is_refused(site) -> None:
    """DNS rebinding: a web site whose name resolves to 127.0.0.1 is, to the browser, the page's own origin (no
    CORS check), and its script drove the API with that name in the Host header: now refused, before any handler."""
    port = site["url"].rstrip("/").rsplit(":", 1)[1]
    body = json.dumps({"data": [str(site["root"] / "run")]}).encode()
    for host, status in ((f"rebinding.example:{port}", 403), (f"localhost.rebinding.example:{port}", 403),
                         (f"localhost:{port}", 200), (f"[::1]:{port}", 200), (f"127.0.0.1:{port}", 200)):
        request = urllib.request.Request(f"{site['url']}gradio_api/call/watch", data=body, headers={
            "Content-Type": "application/json", "Host": host})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                got, text = response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            got, text = exc.code, exc.read().decode()
        assert got == status, (host, got, text)
        assert status == 200 or text.startswith("this page answers only to localhost"), text


def test_a_body_larger_than_any_the_page_sends_is_refused_unread(site) -> None:
    """Gradio read a whole request body into memory, whatever its size (300 MB to the queue took 0.8 GB here and
    was queued). A declared length over the bound is now answered 413 before a byte of the body is read; a
    request of the page's own size still runs (the other tests here)."""
    port = int(site["url"].rstrip("/").rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(f"POST /gradio_api/call/watch HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: "
                     f"application/json\r\nContent-Length: {(16 << 20) + 1}\r\n\r\n".encode())
        answer = b""  # no body sent: a server that waited for it would time out here
        while chunk := sock.recv(4096):  # the refusal closes the connection
            answer += chunk
    answer = answer.decode()
    assert answer.startswith("HTTP/1.1 413") and "request body over 16 MiB" in answer, answer
