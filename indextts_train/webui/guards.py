"""What the page's web server refuses before Gradio sees a request (ASGI middleware): a Host header of another
machine on a password-less loopback page (DNS rebinding), and a request body larger than any the page sends;
and where its password comes from (AUTH_ENV).

Both answer in one plain-text line and leave the request unread by the page's handlers.
"""

from __future__ import annotations

import ipaddress

# --auth's password, kept off the command line: there any user of the machine reads it (ps, /proc/PID/cmdline)
AUTH_ENV = "INDEXTTS_WEBUI_AUTH"
MAX_BODY = 16 << 20  # bytes of one request body: the page's largest, two full manifests boxes (256 Ki characters
# each, up to 6 bytes a character once JSON-escaped) and the other fields, is about 3 MiB


def is_loopback(host: str) -> bool:
    """Whether only this machine can reach `host` (localhost, 127.0.0.0/8, ::1)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False  # a host name or a wildcard: other machines may reach it


def host_of(header: str) -> str:
    """The host a Host header names, without its port (an IPv6 literal without its brackets)."""
    value = header.strip()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value
    return value.rpartition(":")[0] if value.count(":") == 1 else value


async def _refuse(send, status: int, text: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close"),
                            (b"content-length", str(len(text)).encode())]})
    await send({"type": "http.response.body", "body": text})


class LocalHostsOnly:
    """A page served on a loopback address without a password: a request whose Host header names another machine
    is refused. Through DNS rebinding (a site's name made to resolve to 127.0.0.1) any web site the user visits
    is, to the browser, the page's own origin, and could start runs and read the roots."""

    REFUSAL = (b"this page answers only to localhost (a request for another host name may come from another web "
               b"site, through DNS rebinding); behind a proxy, start webui with --auth USER:PASS\n")

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        host = dict(scope.get("headers") or []).get(b"host") if scope["type"] in ("http", "websocket") else None
        if host is None or is_loopback(host_of(host.decode("latin-1"))):
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
        else:
            await _refuse(send, 403, self.REFUSAL)


class BoundedBodies:
    """A request body over MAX_BODY bytes is refused (413) before Gradio reads it: Gradio parses a whole JSON body
    into memory, whatever its size (300 MB posted to the queue once took 0.8 GB of the server's memory, and was
    queued), so a few posts from anyone who can reach the page could take the machine's memory, and the run's."""

    REFUSAL = b"request body over %d MiB: the page sends a few KiB; nothing was done\n" % (MAX_BODY >> 20)

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None:  # the HTTP server delivers no more than the length declared
            if not declared.strip().isdigit() or int(declared) > MAX_BODY:
                await _refuse(send, 413, self.REFUSAL)
            else:
                await self.app(scope, receive, send)
            return
        body = await _read_bounded(receive)  # chunked: read here, up to the bound, then handed on whole
        if body is None:
            await _refuse(send, 413, self.REFUSAL)
            return
        handed = False

        async def replay():
            nonlocal handed
            if handed:
                return await receive()  # after the body: the client's disconnect, when it comes
            handed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


async def _read_bounded(receive) -> bytes | None:
    """A chunked request's body, or None past MAX_BODY bytes (or when the client left before its end)."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if size > MAX_BODY:
            return None
        if not message.get("more_body", False):
            return b"".join(chunks)
