"""`indextts-train webui`: the training page in the browser (optional extra: indextts-train[webui]).

Only `page.py` imports Gradio, and only when the page is served, so the trainer and every other
command work without it.

Imports: `train` and every layer below it (it starts runs and reads their checkpoints); above it
only `cli`.
"""

from __future__ import annotations

from pathlib import Path

from indextts_train.errors import UserError
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
        raise UserError("--auth must be USER:PASS (both non-empty), e.g. --auth me:long-secret")
    return user, password


def serve(host: str = "127.0.0.1", port: int = 7860, *, share: bool = False, auth: str | None = None,
          roots: list[Path] | None = None) -> int:
    """Serve the page until Ctrl+C. Runs started from it keep running after it stops.

    `roots`: the folders every path the page reads or writes must lie in (default: the current one).
    """
    allowed = Roots(roots or [Path.cwd()])

    credentials = parse_auth(auth, share)
    if credentials is None and host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: --host {host} without --auth: anyone who can reach this port can start runs", flush=True)
    try:
        import gradio  # noqa: F401 - only to say how to install it when missing
    except ImportError:
        raise UserError(INSTALL_HINT) from None
    from indextts_train.webui.page import PageServer, build_page

    page = build_page(PageServer(allowed))
    _, local_url, share_url = page.queue().launch(server_name=host, server_port=port, share=share,
                                                  auth=credentials, quiet=True, prevent_thread_lock=True)
    # One line once the page answers: users click it, the browser test waits for it.
    print(f"indextts-train webui: {local_url}" + (f" and {share_url}" if share_url else ""), flush=True)
    try:
        page.block_thread()
    finally:
        page.close()
    return 0
