"""The page server's guards as ASGI middleware, called with the messages an HTTP server passes: a body over
MAX_BODY is refused before the page's app reads it, declared or chunked; a smaller body reaches the app whole."""

from __future__ import annotations

import asyncio

from indextts_train.webui.guards import MAX_BODY, BoundedBodies, host_of, is_loopback


def _serve(headers: list[tuple[bytes, bytes]], chunks: list[bytes]) -> tuple[list[dict], list[bytes]]:
    """(what the client was sent, the body the app read) for one request sent in `chunks`."""
    got: list[bytes] = []
    sent: list[dict] = []
    messages = [{"type": "http.request", "body": c, "more_body": i + 1 < len(chunks)} for i, c in enumerate(chunks)]

    async def app(scope, receive, send) -> None:
        while True:
            message = await receive()
            got.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def receive() -> dict:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(BoundedBodies(app)({"type": "http", "headers": headers}, receive, send))
    return sent, got


def test_a_chunked_body_past_the_bound_is_refused_before_the_app_reads_it() -> None:
    chunk = b"a" * (1 << 20)
    sent, got = _serve([], [chunk] * ((MAX_BODY >> 20) + 1))
    assert sent[0]["status"] == 413 and b"request body over" in sent[1]["body"] and got == []


def test_a_chunked_body_within_the_bound_reaches_the_app_whole() -> None:
    sent, got = _serve([], [b'{"data":', b' ["x"]}'])
    assert sent[0]["status"] == 200 and got == [b'{"data": ["x"]}']


def test_a_declared_length_past_the_bound_or_not_a_number_is_refused() -> None:
    for declared in (str(MAX_BODY + 1).encode(), b"-1", b"12abc"):
        sent, got = _serve([(b"content-length", declared)], [b"{}"])
        assert sent[0]["status"] == 413 and got == [], declared
    sent, got = _serve([(b"content-length", b"2")], [b"{}"])
    assert sent[0]["status"] == 200 and got == [b"{}"]


def test_host_names_of_this_machine_only() -> None:
    assert [host_of(h) for h in ("localhost:7860", "[::1]:7860", "::1", "a.example")] == \
        ["localhost", "::1", "::1", "a.example"]
    assert is_loopback("127.0.0.9") and not is_loopback("localhost.rebinding.example")
