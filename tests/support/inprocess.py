"""The service in the test process: ``create_app`` on the stub engine, its lifespan running,
called through httpx without a socket. A test starts in milliseconds instead of the seconds a
``rag-stream serve`` process takes (tests/support/server.py), so route, schema, tenant,
admission, error-shape and format tests run here; a process's death, a real engine or the wire
itself (uvicorn's parsing and timeouts, a socket) still needs a server process.

- Settings: the ``test`` profile and what the test passes, and nothing from the environment:
  a ``RAG_STREAM_`` variable set for some other test or process cannot reach an app here
  (``explicit_settings``). The real Redis under this session's prefix unless told otherwise.
- Engine: the stub engine (tests/support/fakes.py), with tests/support/stub_server.py's knobs
  (pace, text, round-trip time, a slow query embedding, a request log) as arguments, or one
  that keeps its requests in memory (``ledger=True``: ``InProcess.ledger``).
- Embedder: the prepared one, loaded once per session and shared by every app (the lifespan
  opens no embedder of its own and closes none: ``create_app`` only asks its factory).
- Two clients on one app: ``client`` is httpx's own ``ASGITransport``, which hands a response
  over only once its body has ended (so a stream read through it must end); ``live`` hands over
  the headers at once and the body as the app writes it, and tells the app the client left
  when the response is closed before its end: for a test that must act while a stream runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import shutil
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from asgi_lifespan import LifespanManager
from fastapi import FastAPI
from httpx_sse import aconnect_sse
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
)
from starlette.types import ASGIApp, Message

from rag_stream.app import create_app
from rag_stream.generation.engine import Engine
from rag_stream.preflight import migrate
from rag_stream.resources import Resources
from rag_stream.retrieval.embedder import Embedder
from rag_stream.settings import ProfileSource, Settings
from rag_stream.store.keys import create_key
from tests.conftest import REDIS_URL, SESSION_PREFIX
from tests.support.fakes import LedgerStubEngine, RecordingStubEngine, stub_engine
from tests.support.pg import postgres_database, sqlite_at_head
from tests.support.slow_embedder import SlowEmbedder
from tests.support.sse import Frame

# What a request's client sees as the server: a loopback name, so the browser guard's default
# trusted hosts (security.trusted_hosts) let it in, as they do a local server process.
BASE_URL = "http://127.0.0.1:8000"
TIMEOUT_S = 120.0  # no request of a test takes longer; without it a hung app hangs the run


class _ExplicitSettings(Settings):
    """Settings from the keyword arguments and the profile's YAML only: no environment, no
    .env file (the service's own class reads ``RAG_STREAM_*`` first)."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        assert isinstance(init_settings, InitSettingsSource)
        profile = init_settings.init_kwargs.get("profile") or "test"
        return (init_settings, ProfileSource(settings_cls, profile))


def _nested(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``limits__max_tokens=4000`` (the environment's ``RAG_STREAM_LIMITS__MAX_TOKENS``) as
    ``{"limits": {"max_tokens": 4000}}``; a group given as a dict merges with the same group's
    single keys."""
    tree: dict[str, Any] = {}
    for key, value in overrides.items():
        *groups, name = key.split("__")
        node = tree
        for group in groups:
            node = node.setdefault(group, {})
        if isinstance(value, Mapping) and isinstance(node.get(name), dict):
            node[name].update(value)
        else:
            node[name] = dict(value) if isinstance(value, Mapping) else value
    return tree


def explicit_settings(
    data_dir: Path, models_dir: Path, *, event_log: str = "redis", **overrides: Any
) -> Settings:
    """What ``server_factory`` gives a server process: the test profile, this data dir, the
    prepared models, the real Redis and this session's key prefix; then ``overrides``
    (``limits__max_tokens=4000`` or ``limits={"max_tokens": 4000}``). ``event_log="memory"``:
    streams live in the process (``streaming.checkpoint`` off; quotas still use Redis)."""
    if event_log not in ("redis", "memory"):
        raise ValueError(f"event_log must be 'redis' or 'memory', not {event_log!r}")
    base: dict[str, Any] = {
        "profile": "test",
        "data_dir": data_dir,
        "models_dir": models_dir,
        "redis_url": REDIS_URL,
        "streaming": {"key_prefix": SESSION_PREFIX, "checkpoint": event_log == "redis"},
    }
    for name, value in _nested(overrides).items():
        if isinstance(value, dict) and isinstance(base.get(name), dict):
            base[name] = {**base[name], **value}
        else:
            base[name] = value
    return _ExplicitSettings(**base)


class SchemaTemplate:
    """Each new app's data dir gets a copy of the SQLite file at the schema's head migrated once
    per process (tests/support/pg.py); a database URL given is migrated."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()

    async def prepare(self, settings: Settings) -> None:
        if settings.database_url is not None:
            await asyncio.to_thread(migrate, settings)
            return
        async with self._lock:  # (migrated on a thread the first time: one at a time)
            template = await asyncio.to_thread(sqlite_at_head)
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(template, settings.data_dir / "rag-stream.db")


@dataclass(frozen=True)
class StubOptions:
    """The stub engine and embedder of tests/support/stub_server.py, as arguments."""

    delay_s: float = 0.0  # seconds per token
    text: str | None = None  # what the engine repeats
    rtt_ms: float | None = None  # every request's round-trip time, for "coalesce": "auto"
    slow_query_s: float = 0.0  # a search query holding "(slow)" is embedded this slowly
    request_log: Path | None = None  # each engine request's sampling, appended as JSON lines
    ledger: bool = False  # every engine request kept in memory (fakes.LedgerStubEngine)

    def engine(self) -> Engine:
        options: dict[str, Any] = {"delay_s": self.delay_s}
        if self.text is not None:
            options["text"] = self.text
        if self.ledger:
            return LedgerStubEngine(**options)
        if self.request_log is not None:
            return RecordingStubEngine(str(self.request_log), **options)
        return stub_engine(**options)

    def embedder(self, shared: Embedder) -> Embedder:
        if self.slow_query_s:
            return SlowEmbedder(shared, self.slow_query_s, marker="(slow)")
        return shared


@dataclass
class InProcess:
    """One running app: ``client`` for requests whose responses end, ``live`` for a stream a
    test reads while it runs (see the module's docstring)."""

    app: FastAPI
    client: httpx.AsyncClient
    settings: Settings
    live: httpx.AsyncClient
    exit_requests: list[int] = field(default_factory=list)  # what would have stopped a process

    def __iter__(self) -> Any:  # ``app, client, settings = service``
        return iter((self.app, self.client, self.settings))

    @property
    def resources(self) -> Resources:
        resources: Resources = self.app.state.resources
        return resources

    @property
    def ledger(self) -> LedgerStubEngine:
        """The engine, when the app was started with ``ledger=True``."""
        engine = self.resources.engines.get()
        assert isinstance(engine, LedgerStubEngine), "start the app with ledger=True"
        return engine

    def client_for(self, **kwargs: Any) -> httpx.AsyncClient:
        """Another buffered client on this app (other headers, say); the caller closes it."""
        return _client(self.app, **kwargs)


# ``in_process_factory`` (tests/support/inprocess_fixtures.py): overrides in, an app out.
InProcessFactory = Callable[..., AbstractAsyncContextManager[InProcess]]


class _Deadline(httpx.ASGITransport):
    """httpx's ASGI transport with the client's read timeout as a whole-request deadline
    (it has none: an app that never answers would hang the run)."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeout = request.extensions.get("timeout", {}).get("read")
        try:
            return await asyncio.wait_for(super().handle_async_request(request), timeout)
        except TimeoutError:
            raise httpx.ReadTimeout("the app did not answer in time", request=request) from None


class _LiveBody(httpx.AsyncByteStream):
    def __init__(
        self,
        chunks: asyncio.Queue[bytes | None],
        left: asyncio.Event,
        task: asyncio.Task[None],
        timeout: float | None,
    ) -> None:
        self._chunks, self._left, self._task, self._timeout = chunks, left, task, timeout

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while (chunk := await asyncio.wait_for(self._chunks.get(), self._timeout)) is not None:
            yield chunk

    async def aclose(self) -> None:
        self._left.set()  # the app's next receive() says the client is gone
        try:
            await asyncio.wait_for(asyncio.shield(self._task), 30)
        except TimeoutError:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


class LiveASGITransport(httpx.AsyncBaseTransport):
    """An ASGI transport that returns a response once its headers are sent and streams its body
    as the app sends it (httpx's own waits for the end). Closing the response early sends the
    app ``http.disconnect``, as a server does when its client goes; so does cancelling the
    request before its response has started."""

    def __init__(self, app: ASGIApp, client: tuple[str, int] = ("127.0.0.1", 123)) -> None:
        self.app = app
        self.client = client

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.AsyncByteStream)
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": request.method,
            "headers": [(k.lower(), v) for (k, v) in request.headers.raw],
            "scheme": request.url.scheme,
            "path": request.url.path,
            "raw_path": request.url.raw_path.split(b"?")[0],
            "query_string": request.url.query,
            "server": (request.url.host, request.url.port),
            "client": self.client,
            "root_path": "",
        }
        body = request.stream.__aiter__()
        body_done = False
        left = asyncio.Event()
        started = asyncio.Event()
        head: dict[str, Any] = {}
        chunks: asyncio.Queue[bytes | None] = asyncio.Queue()

        async def receive() -> Message:
            nonlocal body_done
            if not body_done:
                try:
                    chunk = await body.__anext__()
                except StopAsyncIteration:
                    body_done = True
                    return {"type": "http.request", "body": b"", "more_body": False}
                return {"type": "http.request", "body": chunk, "more_body": True}
            await left.wait()
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            if message["type"] == "http.response.start":
                head["status"] = message["status"]
                head["headers"] = message.get("headers", [])
                started.set()
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    chunks.put_nowait(message["body"])
                if not message.get("more_body", False):
                    chunks.put_nowait(None)

        async def run() -> None:
            try:
                await self.app(scope, receive, send)
            finally:
                chunks.put_nowait(None)
                started.set()

        task = asyncio.create_task(run(), name=f"asgi {request.method} {request.url.path}")
        timeout = request.extensions.get("timeout", {}).get("read")
        try:
            await asyncio.wait_for(started.wait(), timeout)
        except TimeoutError:
            task.cancel()
            raise httpx.ReadTimeout("the app sent no response in time", request=request) from None
        except asyncio.CancelledError:
            # the client gave up before any answer (a task cancelled): as over a socket, the
            # app is told it left and goes on by itself
            left.set()
            raise
        if "status" not in head:
            await task  # the app failed before answering: its exception, as httpx's transport
            raise httpx.RemoteProtocolError("the app ended without a response", request=request)
        return httpx.Response(
            head["status"], headers=head["headers"], stream=_LiveBody(chunks, left, task, timeout)
        )


def _client(app: FastAPI, *, live: bool = False, **kwargs: Any) -> httpx.AsyncClient:
    transport: httpx.AsyncBaseTransport = LiveASGITransport(app) if live else _Deadline(app)
    return httpx.AsyncClient(
        transport=transport, base_url=BASE_URL, timeout=kwargs.pop("timeout", TIMEOUT_S), **kwargs
    )


@contextlib.asynccontextmanager
async def run_in_process(
    settings: Settings,
    embedder: Embedder,
    stub: StubOptions = StubOptions(),
    *,
    migrated: SchemaTemplate | None = None,
    headers: Mapping[str, str] | None = None,
) -> AsyncIterator[InProcess]:
    """``create_app(settings)`` on the stub engine, migrated, its lifespan started and the
    engine ready (``/readyz``); all stopped on exit."""
    if migrated is not None:
        await migrated.prepare(settings)
    else:
        await asyncio.to_thread(migrate, settings)

    async def engine_factory(_: Settings) -> Engine:
        return stub.engine()

    async def embedder_factory(_: Settings) -> Embedder:
        return stub.embedder(embedder)

    options: dict[str, Any] = {}
    if stub.rtt_ms is not None:
        rtt = stub.rtt_ms
        options["rtt_source"] = lambda _scope: rtt
    app = create_app(
        settings,
        engine_factory=engine_factory,
        embedder_factory=embedder_factory,
        exit_on_engine_failure=False,  # a failed engine fails the test, not the test process
        **options,
    )
    exits: list[int] = []
    app.state.request_exit = lambda: exits.append(1)  # (by default: SIGTERM to this process)
    try:
        async with (
            LifespanManager(app, startup_timeout=60, shutdown_timeout=60),
            _client(app, headers=headers) as client,
            _client(app, live=True, headers=headers) as live,
        ):
            await _wait_ready(client)
            yield InProcess(app, client, settings, live, exits)
    finally:
        # The engine's start froze the heap out of garbage collection (app.py), which suits a
        # server and not a test session running many apps.
        gc.unfreeze()


async def _wait_ready(client: httpx.AsyncClient, timeout_s: float = 30) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while (r := await client.get("/readyz")).status_code != 200:
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"the app is not ready: {r.status_code} {r.text}")
        await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def postgres(
    prefix: str = "rag_stream_inprocess", *, migrated: bool = False
) -> AsyncIterator[str]:
    """A fresh database on the real PostgreSQL (tests/support/pg.py; at the schema's head with
    ``migrated``), dropped on exit; its helper runs an event loop of its own, so it runs in a
    thread here."""
    databases = postgres_database(prefix, migrated=migrated)
    url = await asyncio.to_thread(next, databases)
    try:
        yield url
    finally:
        await asyncio.to_thread(next, databases, None)  # past its yield: dropped


async def new_key(service: InProcess, tenant: str) -> str:
    """An API key for ``tenant``, made as ``rag-stream keys create`` makes it."""
    async with service.resources.sessions() as session:
        return (await create_key(session, tenant, None)).key


async def keyed_clients(service: InProcess, *tenants: str) -> dict[str, httpx.AsyncClient]:
    """A client for each tenant, sending a key of its own (``new_key``; the caller closes
    them)."""
    clients = {}
    for tenant in tenants:
        key = await new_key(service, tenant)
        clients[tenant] = service.client_for(headers={"Authorization": f"Bearer {key}"})
    return clients


# Streams and knowledge bases, as tests/support/sse.py and kb.py do them over a socket.


async def read_stream(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    stop_after: int | None = None,
    on_frame: Callable[[Frame], Awaitable[None] | None] | None = None,
    **kwargs: Any,
) -> list[Frame]:
    """tests/support/sse.py's ``read_stream`` on an async client: frames until the stream ends
    (or ``stop_after`` frames, then the client leaves); ``on_frame`` after each (awaited if it
    returns an awaitable). With ``InProcess.client`` the frames come once the stream has
    ended, so ``stop_after`` and ``on_frame`` act while it runs only on ``InProcess.live``."""
    frames: list[Frame] = []
    async with aconnect_sse(client, method, url, **kwargs) as source:
        source.response.raise_for_status()
        async for sse in source.aiter_sse():
            if not sse.data:
                continue  # a keep-alive comment (see tests/support/sse.py)
            frame = Frame(int(sse.id) if sse.id else -1, sse.event, json.loads(sse.data))
            frames.append(frame)
            if on_frame is not None:
                done = on_frame(frame)
                if done is not None:
                    await done
            if stop_after is not None and len(frames) >= stop_after:
                break
    return frames


async def make_kb(
    client: httpx.AsyncClient, documents: list[tuple[str, str]], prefix: str = "kb"
) -> str:
    """A knowledge base holding (title, text) documents; its name (tests/support/kb.py)."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    (await client.post("/v1/kbs", json={"name": name})).raise_for_status()
    for title, text in documents:
        r = await client.post(f"/v1/kbs/{name}/documents", json={"title": title, "text": text})
        r.raise_for_status()
    return name
