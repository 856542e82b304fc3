"""The long-lived clients of one running service, built and closed by the app lifespan."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from rag_stream.errors import EngineUnavailable
from rag_stream.generation.engine import Engine
from rag_stream.retrieval.embedder import Embedder
from rag_stream.retrieval.retriever import Retriever
from rag_stream.retrieval.vector_store import VectorStore
from rag_stream.settings import Settings
from rag_stream.streaming.manager import StreamManager
from rag_stream.streaming.redis_conn import RedisHandle


@dataclass
class Resources:
    settings: Settings
    redis: RedisHandle
    db_engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    vectors: VectorStore
    embedder: Embedder
    retriever: Retriever
    streams: StreamManager
    engine_ready: asyncio.Event = field(default_factory=asyncio.Event)
    engine_error: str | None = None
    _engine: Engine | None = None

    def set_engine(self, engine: Engine) -> None:
        self._engine = engine
        self.engine_ready.set()

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            state = self.engine_error or "still loading"
            raise EngineUnavailable(f"engine not ready: {state}")
        return self._engine

    async def wait_engine(self) -> Engine:
        """The engine, once loaded (producers started during start-up wait for it)."""
        while self._engine is None:
            if self.engine_error:
                raise EngineUnavailable(f"engine failed to start: {self.engine_error}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.engine_ready.wait(), timeout=1)
        return self._engine

    @property
    def engine_state(self) -> str:
        if self._engine is not None:
            return "ready"
        return f"failed: {self.engine_error}" if self.engine_error else "loading"
