"""`indextts-train webui`: the training page in the browser (optional extra: indextts-train[webui]).

Only `page.py` imports Gradio, and only when the page is served, so the trainer and every other
command work without it.

Imports: `train` and every layer below it (it starts runs and reads their checkpoints); above it
only `cli`.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path

from indextts_train.errors import UserError
from indextts_train.webui.guards import AUTH_ENV, BoundedBodies, LocalHostsOnly, is_loopback
from indextts_train.webui.roots import Roots

INSTALL_HINT = "the web page needs Gradio: pip install 'indextts-train[webui]' (or: pip install 'gradio>=5,<7')"


def parse_auth(auth: str | None, share: bool) -> tuple[str, str] | None:
    """--auth USER:PASS; required with --share (a public link to a machine that runs commands)."""
    if auth is None:
        if share:
            raise UserError("--share makes the page public: add --auth USER:PASS so only you can start runs")
        return None
    user, sep, password = auth.partition(":")
    if not sep or not user or not password:
        raise UserError(f"--auth must be USER:PASS (both non-empty), best given in the environment (off the "
                        f"command line), e.g. {AUTH_ENV}=me:long-secret indextts-train webui")
    if os.environ.get(AUTH_ENV) != auth:
        print(f"warning: --auth on the command line: any user of this machine can read the password (ps); "
              f"set it as {AUTH_ENV}=USER:PASS in the environment instead", flush=True)
    return user, password


def check_exposure(host: str, credentials: tuple[str, str] | None, no_auth_on_network: bool) -> None:
    """The page starts runs and reads the roots: reachable from other machines, it needs a password
    (--auth) unless the user says in so many words that anyone on the network may use it."""
    if credentials is None and not is_loopback(host) and not no_auth_on_network:
        raise UserError(f"--host {host} makes the page reachable from other machines, where anyone could start "
                        "runs and read the --root folders: add --auth USER:PASS (or, on a network you trust, "
                        "--no-auth-on-network)")


def server_name(host: str) -> tuple[str, str]:
    """(the address to bind, the name Gradio is given) for --host. An IPv6 literal, typed bare (`::1`) or in
    brackets (`[::1]`), is bound bare (a socket refuses the brackets) and given to Gradio in brackets: it
    builds the page's URL as http://NAME:PORT/, and `http://::1:7860/` is no URL (its traceback)."""
    bare = host.strip()
    if bare.startswith("[") and bare.endswith("]"):
        bare = bare[1:-1]
    try:
        literal = ipaddress.ip_address(bare)
    except ValueError:
        return host, host  # an IPv4 address or a host name: as typed
    return (bare, f"[{bare}]") if literal.version == 6 else (bare, bare)


def _port_free(host: str, address: str, shown: str, port: int) -> None:
    """One line before Gradio's own error (a traceback) when the port is taken."""
    try:
        infos = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise UserError(f"--host {host}: not an address of this machine ({exc.strerror})") from None
    family, kind, proto, _, sockaddr = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(sockaddr)
        except OSError as exc:
            raise UserError(f"--port {port}: cannot listen on {shown}:{port} ({exc.strerror}); "
                            "is another webui running? pass another --port") from None


def serve(host: str = "127.0.0.1", port: int = 7860, *, share: bool = False, auth: str | None = None,
          roots: list[Path] | None = None, no_auth_on_network: bool = False) -> int:
    """Serve the page until Ctrl+C. Runs started from it keep running after it stops.

    `roots`: the folders every path the page reads or writes must lie in (default: the current one).
    """
    address, name = server_name(host)
    allowed = Roots(roots or [Path.cwd()])
    credentials = parse_auth(auth, share)
    check_exposure(host, credentials, no_auth_on_network)
    if credentials is None and not is_loopback(host):
        print(f"warning: --host {host} --no-auth-on-network: anyone who can reach this port can start runs "
              f"and read {', '.join(map(str, allowed.folders))}", flush=True)
    _port_free(host, address, name, port)  # before Gradio's import (seconds): a taken port is said at once
    try:
        import gradio  # noqa: F401 - only to say how to install it when missing
    except ImportError:
        raise UserError(INSTALL_HINT) from None
    from indextts_train.webui.page import Page, build_page
    from indextts_train.webui.runs import let_runs_take_ctrl_c

    let_runs_take_ctrl_c()
    page = build_page(Page(allowed))
    from starlette.middleware import Middleware  # Gradio's own dependency

    # A password, or --share's and --host's public names, stand in for the Host check; bodies are bounded always.
    hosts = [Middleware(LocalHostsOnly)] if credentials is None and is_loopback(host) and not share else []
    guards = [Middleware(BoundedBodies), *hosts]
    try:
        # max_file_size=0: the page takes no file, yet Gradio's upload route wrote any visitor's files, of any
        # size, into its temporary folder (outside the roots), from any web site the user's browser was on.
        _, local_url, share_url = page.queue().launch(server_name=name, server_port=port, share=share,
                                                      auth=credentials, quiet=True, prevent_thread_lock=True,
                                                      max_file_size=0, app_kwargs={"middleware": guards})
    except OSError as exc:  # taken between the probe and the launch
        raise UserError(f"--port {port}: cannot listen on {name}:{port} ({exc}); pass another --port") from None
    # One line once the page answers: users click it, the browser test waits for it.
    print(f"indextts-train webui: {local_url}" + (f" and {share_url}" if share_url else ""), flush=True)
    try:
        page.block_thread()
    finally:
        page.close()
    return 0
