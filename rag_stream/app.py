"""create_app(settings): the only place that wires long-lived clients together."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from rag_stream.api import (
    answers,
    conversations,
    documents,
    generate,
    health,
    kbs,
    search,
    streams,
)
from rag_stream.api import metrics as metrics_api
from rag_stream.errors import RagStreamError
from rag_stream.generation.engine import Engine
from rag_stream.ingest.sample_kb import start_sample_kb
from rag_stream.ingest.service import Ingestor
from rag_stream.metrics import Metrics
from rag_stream.pipeline.answer import make_answer_finalizer
from rag_stream.pipeline.context import Finalizer
from rag_stream.pipeline.generate import make_generate_finalizer
from rag_stream.resources import Resources
from rag_stream.retrieval.embedder import Embedder, SentenceTransformerEmbedder
from rag_stream.retrieval.retriever import Retriever
from rag_stream.retrieval.vector_store import QdrantVectorStore
from rag_stream.settings import Settings
from rag_stream.store.db import create_db
from rag_stream.streaming.event_log import EventLog, RedisEventLog
from rag_stream.streaming.manager import StreamManager
from rag_stream.streaming.memory_log import MemoryEventLog
from rag_stream.streaming.redis_conn import open_redis

log = logging.getLogger(__name__)

EngineFactory = Callable[[Settings], Awaitable[Engine]]
EmbedderFactory = Callable[[Settings], Awaitable[Embedder]]


async def _vllm_engine(settings: Settings) -> Engine:
    from rag_stream.generation.vllm_engine import VLLMEngine

    return await VLLMEngine.start(settings)


async def _st_embedder(settings: Settings) -> Embedder:
    return await SentenceTransformerEmbedder.load(
        settings.resolved_embedder, batch_size=settings.ingest.embed_batch_size
    )


def create_app(
    settings: Settings,
    *,
    engine_factory: EngineFactory = _vllm_engine,
    embedder_factory: EmbedderFactory = _st_embedder,
    exit_on_engine_failure: bool = True,
) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        redis = await open_redis(settings)
        db_engine, sessions = create_db(settings.resolved_database_url)
        vectors = QdrantVectorStore.from_settings(settings)
        engine_task: asyncio.Task[None] | None = None
        sample_task: asyncio.Task[None] | None = None
        resources: Resources | None = None
        try:
            embedder = await embedder_factory(settings)
            await vectors.ensure(embedder.dimension)
            retriever = Retriever(sessions, vectors, embedder)
            event_log: EventLog = (
                RedisEventLog(redis.client, prefix=settings.streaming.key_prefix)
                if settings.streaming.checkpoint
                else MemoryEventLog()
            )
            finalizers: dict[str, Finalizer] = {
                "generate": make_generate_finalizer(sessions, metrics),
                "answer": make_answer_finalizer(sessions, metrics),
            }

            async def engine_when_ready() -> Engine:
                assert resources is not None
                return await resources.wait_engine()

            stream_manager = StreamManager(
                event_log, settings.streaming, engine_when_ready, finalizers
            )
            metrics.active_streams.set_function(lambda: stream_manager.active)
            resources = Resources(
                settings, redis, db_engine, sessions, vectors, embedder, retriever, stream_manager
            )
            app.state.resources = resources
            ingestor = Ingestor(sessions, vectors, embedder, settings.ingest)
            app.state.ingestor = ingestor
            sample_task = start_sample_kb(settings, sessions, ingestor)
            # The engine loads in the background so /healthz and /readyz answer meanwhile.
            engine_task = asyncio.create_task(_start_engine(resources))
            stream_manager.start_sweeper()
            yield
        finally:
            if sample_task is not None:
                sample_task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await sample_task
            if resources is not None:
                await resources.streams.close()
            if engine_task is not None:
                engine_task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await engine_task
            if resources is not None and resources.engine_ready.is_set():
                await resources.engine.close()
            await vectors.close()
            await db_engine.dispose()
            await redis.close()

    async def _start_engine(resources: Resources) -> None:
        try:
            resources.set_engine(await engine_factory(settings))
        except Exception as exc:
            resources.engine_error = str(exc)
            log.error("engine: failed to start: %s", exc)
            if exit_on_engine_failure:
                os.kill(os.getpid(), signal.SIGTERM)

    metrics = Metrics()
    app = FastAPI(title="rag-stream", version="0.1.0", lifespan=lifespan)
    app.state.metrics = metrics

    @app.middleware("http")
    async def count_requests(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        response = await call_next(request)
        route = request.scope.get("route")
        path = getattr(route, "path", "unmatched")
        metrics.requests.labels(path, request.method, str(response.status_code)).inc()
        return response

    app.include_router(health.router)
    app.include_router(generate.router)
    app.include_router(streams.router)
    app.include_router(answers.router)
    app.include_router(conversations.router)
    app.include_router(metrics_api.router)
    app.include_router(kbs.router)
    app.include_router(documents.router)
    app.include_router(search.router)
    _install_error_handlers(app)
    return app


def _error(status: int, code: str, message: str, **extra: object) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message, **extra}}, status_code=status)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RagStreamError)
    async def _domain(_: Request, exc: RagStreamError) -> JSONResponse:
        if exc.status_code >= 500 and exc.status_code != 503:
            log.error("request failed: %s", exc.message)
        return _error(exc.status_code, exc.code, exc.message)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
            problems.append(f"{where or 'body'}: {err.get('msg', 'invalid')}")
        return _error(422, "invalid_request", "; ".join(problems))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return _error(exc.status_code, code, str(exc.detail))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return _error(500, "internal_error", "internal error; see the server log")
