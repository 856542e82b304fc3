"""A recording reverse proxy: what a client sends to rag-stream, and how each exchange ended.

``scripts/check_open_webui.py`` puts it between Open WebUI and rag-stream. Open WebUI keeps
rag-stream's response headers to itself (the ``X-Stream-Id`` the Stop check needs) and says
nothing about what it sends upstream; the proxy records both, and passes every byte through
unchanged, as it arrives (SSE included). It is a plain ASGI app served by uvicorn in a thread:

- each request is forwarded on its own upstream connection, with the client's headers (less
  hop-by-hop ones) and body;
- the response is relayed chunk by chunk while a watcher waits for the client's
  ``http.disconnect``: when the client closes (Open WebUI's Stop), the upstream response is
  closed at once, as if the client had been connected directly, and the time is recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn

# Headers that describe one connection, not the message: never forwarded.
_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
}


@dataclass
class Exchange:
    """One request through the proxy. Times are ``time.time()``."""

    started: float
    method: str
    path: str
    headers: dict[str, str]
    body: Any  # the JSON body, or None
    status: int | None = None
    response_headers: dict[str, str] = field(default_factory=dict)
    first_byte: float | None = None
    ended: float | None = None
    ended_by: str | None = None  # "upstream" (complete), "client" (closed first), "error"
    error: str | None = None
    received: bytearray = field(default_factory=bytearray)

    @property
    def stream_id(self) -> str | None:
        return self.response_headers.get("x-stream-id")

    def sse_data(self) -> list[dict[str, Any]]:
        """The JSON of each ``data:`` line relayed so far (``[DONE]`` left out)."""
        out = []
        for line in bytes(self.received).decode(errors="replace").splitlines():
            if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]"):
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line[5:]))
        return out


class RecordingProxy:
    def __init__(self, upstream: str, port: int) -> None:
        self.upstream = upstream.rstrip("/")
        self.url = f"http://127.0.0.1:{port}"
        self.exchanges: list[Exchange] = []
        self._lock = threading.Lock()
        config = uvicorn.Config(
            self._app,
            host="127.0.0.1",
            port=port,
            log_level="warning",
            lifespan="off",
            interface="asgi3",  # a bound method looks like ASGI2 to uvicorn's guess
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="proxy", daemon=True)

    def start(self, timeout_s: float = 30) -> None:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"the recording proxy did not start on {self.url}")
            time.sleep(0.05)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)

    def snapshot(self) -> list[Exchange]:
        with self._lock:
            return list(self.exchanges)

    def wait_for(self, match: Callable[[Exchange], bool], timeout_s: float, what: str) -> Exchange:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for ex in self.snapshot():
                if match(ex):
                    return ex
            time.sleep(0.05)
        raise TimeoutError(f"no request through the proxy {what} within {timeout_s:.0f} s")

    async def _app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        parsed = None
        with contextlib.suppress(ValueError):
            parsed = json.loads(body) if body else None
        ex = Exchange(time.time(), scope["method"], scope["path"], headers, parsed)
        with self._lock:
            self.exchanges.append(ex)
        query = scope.get("query_string", b"").decode("latin-1")
        target = self.upstream + scope["path"] + (f"?{query}" if query else "")
        forward = [(k, v) for k, v in headers.items() if k.lower() not in _HOP]
        relay = asyncio.ensure_future(self._relay(ex, target, forward, body, send))
        watcher = asyncio.ensure_future(self._client_gone(receive))
        await asyncio.wait({relay, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if not relay.done():  # the client closed first
            ex.ended_by = ex.ended_by or "client"
            relay.cancel()
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await relay

    @staticmethod
    async def _client_gone(receive: Any) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    async def _relay(
        self, ex: Exchange, target: str, headers: list[tuple[str, str]], body: bytes, send: Any
    ) -> None:
        timeout = httpx.Timeout(30, read=None)
        try:
            async with (
                httpx.AsyncClient(timeout=timeout) as client,
                client.stream(ex.method, target, headers=headers, content=body) as resp,
            ):
                ex.status = resp.status_code
                ex.response_headers = {k.lower(): v for k, v in resp.headers.items()}
                out = [
                    (k.encode("latin-1"), v.encode("latin-1"))
                    for k, v in resp.headers.items()
                    if k.lower() not in _HOP
                ]
                await send(
                    {"type": "http.response.start", "status": resp.status_code, "headers": out}
                )
                async for chunk in resp.aiter_raw():
                    ex.first_byte = ex.first_byte or time.time()
                    ex.received += chunk
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                ex.ended_by = "upstream"
        except asyncio.CancelledError:
            ex.ended_by = ex.ended_by or "client"
            raise
        except OSError as exc:  # the client went away while we wrote to it
            ex.ended_by = ex.ended_by or "client"
            ex.error = repr(exc)
        except httpx.HTTPError as exc:
            ex.ended_by, ex.error = "error", repr(exc)
            if ex.status is None:
                with contextlib.suppress(Exception):
                    await send({"type": "http.response.start", "status": 502, "headers": []})
                    await send({"type": "http.response.body", "body": str(exc).encode()})
        finally:
            ex.ended = time.time()
