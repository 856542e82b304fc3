"""The state of one running service: its long-lived clients and services, built and closed by
the app lifespan (``app.state.resources`` is the only application state)."""

from __future__ import annotations

from dataclasses import dataclass

from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from rag_stream.generation.engine import Engine
from rag_stream.generation.slot import EngineSlot
from rag_stream.ingest.service import Ingestor
from rag_stream.metrics import Metrics
from rag_stream.retrieval.embedder import Embedder
from rag_stream.retrieval.retriever import Retriever
from rag_stream.retrieval.vector_store import VectorStore
from rag_stream.settings import Settings
from rag_stream.store.keys import KeyRing
from rag_stream.streaming.coalesce import CoalescePolicy
from rag_stream.streaming.kinds import KindSet
from rag_stream.streaming.quotas import Quotas
from rag_stream.streaming.redis_conn import RedisHandle
from rag_stream.streaming.service import Streams


@dataclass
class Resources:
    settings: Settings
    metrics: Metrics
    redis: RedisHandle
    kv_redis: Redis | None  # where /metrics reads the KV connector's counters
    db_engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    vectors: VectorStore
    embedder: Embedder
    retriever: Retriever
    ingestor: Ingestor
    engines: EngineSlot
    streams: Streams  # the front door of every stream (admission, start), and its readers
    kinds: KindSet  # the running kinds (rag_stream/kinds/registry.py), found by class
    coalescing: CoalescePolicy  # tokens per event, per request
    keys: KeyRing  # who is calling (api/deps.py get_caller)
    quotas: Quotas  # per-tenant and per-key limits, across processes (Redis)

    @property
    def engine(self) -> Engine:
        return self.engines.get()
