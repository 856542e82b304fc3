"""create_app(settings): the only place that wires long-lived clients together.

The lifespan opens each client in order and registers its closing on one exit stack, so a
failure at any step (say, the local Qdrant folder locked by another process) closes everything
opened before it, the embedded redis-server included.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from redis.asyncio import Redis
from starlette.types import Receive, Scope, Send

from rag_stream.ai_sdk import routes as ai_sdk_routes
from rag_stream.api import (
    conversations,
    documents,
    health,
    kbs,
    search,
    streams,
    usage,
    web,
)
from rag_stream.api import metrics as metrics_api
from rag_stream.api.browser_guard import BrowserGuard, default_trusted_hosts, is_loopback
from rag_stream.api.content_coding import RefuseContentCoding
from rag_stream.api.deps import CallerDep
from rag_stream.api.error_handlers import install_error_handlers
from rag_stream.api.methods import AllowHeader
from rag_stream.api.openapi import install_openapi
from rag_stream.api.request_metrics import RequestMetrics
from rag_stream.api.timeouts import BodyReadTimeout
from rag_stream.generation.engine import Engine
from rag_stream.generation.slot import EngineSlot
from rag_stream.ingest.sample_kb import start_sample_kb
from rag_stream.ingest.service import Ingestor
from rag_stream.kinds.base import KindDeps
from rag_stream.kinds.registry import KINDS
from rag_stream.malloc_arenas import limit_malloc_arenas
from rag_stream.metrics import Metrics
from rag_stream.openai import routes as openai_routes
from rag_stream.resources import Resources
from rag_stream.retrieval.embedder import Embedder, load_embedder
from rag_stream.retrieval.retriever import Retriever
from rag_stream.retrieval.stores import open_sparse_encoder, open_vector_store
from rag_stream.settings import Settings, load_settings
from rag_stream.store.db import create_db, sqlite_file_engine
from rag_stream.store.keys import KeyRing
from rag_stream.store.recorder import StreamRecorder
from rag_stream.streaming.admission import Admission
from rag_stream.streaming.coalesce import (
    CoalescePolicy,
    RttSource,
    kernel_rtt_ms,
    remember_socket,
)
from rag_stream.streaming.event_log import EventLog
from rag_stream.streaming.kinds import KindSet
from rag_stream.streaming.memory_log import MemoryEventLog
from rag_stream.streaming.quotas import Quotas
from rag_stream.streaming.redis_conn import open_redis
from rag_stream.streaming.redis_log import RedisEventLog
from rag_stream.streaming.service import Streams

logger = logging.getLogger(__name__)

EngineFactory = Callable[[Settings], Awaitable[Engine]]
EmbedderFactory = Callable[[Settings], Awaitable[Embedder]]


async def _vllm_engine(settings: Settings) -> Engine:
    if settings.engine_urls:  # vLLM servers elsewhere: no engine in this process
        from rag_stream.generation.remote_engine import RemoteEngine

        return await RemoteEngine.start(settings)
    from rag_stream.generation.vllm_engine import VLLMEngine

    if not settings.kv.enabled:
        return await VLLMEngine.start(settings)
    from rag_stream.kv.config import transfer_config  # the KV connector, loaded by vLLM

    return await VLLMEngine.start(settings, kv_transfer_config=transfer_config(settings))


async def _default_embedder(settings: Settings) -> Embedder:
    return await load_embedder(
        settings.resolved_embedder,
        batch_size=settings.ingest.embed_batch_size,
        backend=settings.embedder_backend,
    )


async def _cancel(task: asyncio.Task[None] | None) -> None:
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


# A young garbage collection once this many more objects are alive than at the last, not
# CPython's 700. A stream keeps each of its events (four objects the collector follows) in its
# feed until it ends, so at 700 a young collection came every ~85 tokens and walked the live
# streams' events again and again, and every tenth one all that survived: 3.3 µs of the
# gateway's CPU a token at 32 streams, 0.85 µs at this threshold (docs/benchmarks.md, tenth
# round). Memory is still freed by reference counting as soon as nothing holds it; only objects
# in reference cycles wait a little longer for their collection.
YOUNG_COLLECTION_AT = 20_000


def _freeze_startup_heap() -> None:
    """Leave what start-up loaded (torch, transformers, vLLM: millions of objects) out of every
    later garbage collection: otherwise each full collection walks it all, and streaming, which
    allocates a few objects per token, triggers one every few thousand tokens (the engine core
    process does the same: ``vllm.utils.gc_utils.freeze_gc_heap``). Young collections come
    less often (``YOUNG_COLLECTION_AT``)."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_AT, older, oldest)
    logger.info(
        "startup heap frozen: %d objects left out of garbage collection", gc.get_freeze_count()
    )


class _App(FastAPI):
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            remember_socket(scope, send)  # for "coalesce": "auto" (streaming/coalesce.py)
        await super().__call__(scope, receive, send)


def create_app(
    settings: Settings,
    *,
    engine_factory: EngineFactory = _vllm_engine,
    embedder_factory: EmbedderFactory = _default_embedder,
    exit_on_engine_failure: bool = True,
    rtt_source: RttSource = kernel_rtt_ms,
) -> FastAPI:
    limit_malloc_arenas()  # before the service's threads exist (see malloc_arenas.py)
    metrics = Metrics()

    async def load_engine(engines: EngineSlot) -> None:
        try:
            engine = await engine_factory(settings)
            engines.set(engine)
            _freeze_startup_heap()
        except Exception as exc:
            engines.fail(str(exc))
            logger.error("engine: failed to start: %s", exc)
            if exit_on_engine_failure:
                stop_process()
            return
        await engine.wait_dead()
        logger.error(
            "engine: the engine core died; stopping this process (exit status 1) so that its "
            "streams continue in another process, or here once a supervisor restarts it"
        )
        if exit_on_engine_failure:
            stop_process()

    def stop_process() -> None:
        app.state.exit_status = 1  # what `rag-stream serve` exits with
        app.state.request_exit()

    async def close_engine(engines: EngineSlot, loading: asyncio.Task[None]) -> None:
        await _cancel(loading)
        if engines.loaded is not None:
            await engines.loaded.close()

    async def open_resources(stack: AsyncExitStack) -> Resources:
        redis = await open_redis(settings)
        stack.push_async_callback(redis.close)
        db_engine, sessions = create_db(settings.resolved_database_url)
        stack.push_async_callback(db_engine.dispose)
        vectors = open_vector_store(settings)
        stack.push_async_callback(vectors.close)
        kv_redis = _kv_stats_client(settings, redis.client)
        if kv_redis is not None and kv_redis is not redis.client:
            stack.push_async_callback(kv_redis.aclose)
        # The engine loads in the background so /healthz and /readyz answer meanwhile.
        engines = EngineSlot()
        loading = asyncio.create_task(load_engine(engines), name="engine-load")
        stack.push_async_callback(close_engine, engines, loading)

        embedder = await embedder_factory(settings)
        await vectors.ensure(embedder.dimension)
        sparse = open_sparse_encoder()
        retriever = Retriever(sessions, vectors, embedder, sparse=sparse)
        ingestor = Ingestor(
            sessions,
            vectors,
            embedder,
            settings.ingest,
            sparse=sparse,
            retry_after_s=settings.limits.retry_after_s,
        )
        await ingestor.recover()
        stack.push_async_callback(ingestor.close)  # before the stores it writes to close
        event_log: EventLog = (
            RedisEventLog(redis.client, prefix=settings.streaming.key_prefix)
            if settings.streaming.checkpoint
            else MemoryEventLog()
        )
        records = StreamRecorder(sessions, sqlite_file_engine(db_engine))
        stack.push_async_callback(records.close)  # after the streams, before the database
        deps = KindDeps(engines, sessions, records, retriever, metrics, settings)
        kinds = KindSet([registered.build(deps) for registered in KINDS])
        limits = settings.limits
        quotas = Quotas(
            redis.client,
            settings.streaming.key_prefix,
            limits.per_tenant_active,
            limits.requests_per_minute,
            on_reject=lambda reason: metrics.rejected.labels(reason).inc(),
        )
        stack.push_async_callback(quotas.close)  # after the streams, which give places back
        admission = Admission(
            limits.max_active_streams,
            limits.max_queued,
            limits.retry_after_s,
            on_reject=lambda reason: metrics.rejected.labels(reason).inc(),
            quotas=quotas,
            max_active_batch=limits.max_active_batch,
        )
        streams = Streams(event_log, settings.streaming, list(kinds), admission)
        stack.push_async_callback(streams.close)  # before the engine closes
        metrics.active_streams.set_function(lambda: streams.active)
        keys = KeyRing(sessions, settings.security.require_keys or not is_loopback(settings.host))
        if not await keys.required():
            logger.warning(
                "open mode: no API key exists and the server listens on %s, so every request "
                "is served, as tenant 'local'; `rag-stream keys create --tenant NAME` makes "
                "keys required",
                settings.host,
            )
        sample = start_sample_kb(settings, sessions, ingestor)
        stack.push_async_callback(_cancel, sample)
        streams.start_sweeper()
        return Resources(
            settings=settings,
            metrics=metrics,
            redis=redis,
            kv_redis=kv_redis,
            db_engine=db_engine,
            sessions=sessions,
            vectors=vectors,
            embedder=embedder,
            retriever=retriever,
            ingestor=ingestor,
            engines=engines,
            streams=streams,
            kinds=kinds,
            coalescing=CoalescePolicy(settings.streaming, rtt_source),
            keys=keys,
            quotas=quotas,
        )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            app.state.resources = await open_resources(stack)
            yield

    docs = settings.security.docs == "open"  # "key": /openapi.json only, below
    app = _App(
        title="rag-stream",
        version="0.1.0",
        lifespan=lifespan,
        docs_url="/docs" if docs else None,
        redoc_url="/redoc" if docs else None,
        openapi_url="/openapi.json" if docs else None,
    )
    app.state.exit_status = 0
    # how the app asks to be stopped; `rag-stream serve` sets a clean stop of its server (after
    # a SIGTERM, uvicorn re-raises the signal at the end: the exit status would be lost)
    app.state.request_exit = lambda: os.kill(os.getpid(), signal.SIGTERM)

    app.add_middleware(AllowHeader, routes=app.router.routes)  # a 405 names what its path allows
    app.add_middleware(RequestMetrics, metrics=metrics)
    security = settings.security
    if security.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=security.cors_origins,
            allow_methods=["*"],
            allow_headers=["*"],
            expose_headers=["X-Stream-Id"],  # a page reads it to resume a chat completion
        )
    # a body that stalls half-way gets a 408 instead of holding its connection
    limits = settings.limits
    app.add_middleware(
        BodyReadTimeout, timeout_s=limits.body_read_timeout_s, deadline_s=limits.body_deadline_s
    )
    # a compressed body is refused by name rather than failing to parse (content_coding.py)
    app.add_middleware(RefuseContentCoding)
    # outermost: a request from a page elsewhere, or to a foreign Host, goes no further
    trusted = security.trusted_hosts
    app.add_middleware(
        BrowserGuard,
        trusted_hosts=default_trusted_hosts(settings.host) if trusted is None else trusted,
        cors_origins=security.cors_origins,
    )
    for module in (
        health,
        openai_routes,  # chat completions and models, over the generate and answer kinds
        ai_sdk_routes,  # the AI SDK's UI chat, over the same two kinds
        streams,
        conversations,
        metrics_api,
        kbs,
        documents,
        search,
        usage,
    ):
        app.include_router(module.router)
    for registered in KINDS:
        app.include_router(registered.router)
    app.include_router(web.router)  # the chat page at /, last
    if settings.security.docs == "key":

        @app.get("/openapi.json", include_in_schema=False)
        async def openapi(_: CallerDep) -> JSONResponse:
            return JSONResponse(app.openapi())

    install_error_handlers(app)
    install_openapi(app)  # every status each route answers (api/openapi.py)
    return app


def _kv_stats_client(settings: Settings, service_redis: Redis) -> Redis | None:
    """Where /metrics reads the KV connector's counters: the service's Redis, or one client to
    the connector's own Redis, made once (not per scrape)."""
    url = settings.resolved_kv_redis_url
    if not settings.kv.enabled or url is None:
        return None
    if url == settings.redis_url:
        return service_redis
    return Redis.from_url(url, socket_connect_timeout=3)


def app_from_environment() -> FastAPI:
    """The app of one of ``serve --workers N``'s processes: settings from the environment."""
    return create_app(load_settings())
