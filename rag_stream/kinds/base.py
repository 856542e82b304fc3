"""What every kind of stream shares: its dependencies, the rule for continuing a stream here,
reading its saved plan back, and how it is registered (``KindSlice``, listed in
``registry.py``; the running kinds are a ``streaming.kinds.KindSet``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from fastapi import APIRouter
from pydantic import TypeAdapter, ValidationError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from rag_stream.generation.slot import EngineSlot
from rag_stream.metrics import Metrics
from rag_stream.retrieval.retriever import Retriever
from rag_stream.settings import Settings
from rag_stream.store.recorder import StreamRecorder
from rag_stream.streaming.event_log import StreamMeta
from rag_stream.streaming.kinds import StreamKind, plan_error

PlanT = TypeVar("PlanT")


@dataclass(frozen=True)
class KindDeps:
    """The long-lived services a kind may use; built once by the app's lifespan."""

    engines: EngineSlot
    sessions: async_sessionmaker[AsyncSession]
    records: StreamRecorder
    retriever: Retriever
    metrics: Metrics
    settings: Settings


class BaseKind(Generic[PlanT]):
    """A kind's common half. A subclass names itself, says how its plans are read
    (``plans``), and writes ``accept`` and ``continuation``."""

    name: ClassVar[str]
    detached: ClassVar[bool] = False  # True: its streams run to their end with no reader
    plans: ClassVar[TypeAdapter[Any]]  # the plan (or union of plans) it saves

    def __init__(self, deps: KindDeps) -> None:
        self.engines = deps.engines
        self.sessions = deps.sessions
        self.records = deps.records
        self.retriever = deps.retriever
        self.metrics = deps.metrics
        self.limits = deps.settings.limits
        self.settings = deps.settings

    async def can_continue(self, meta: StreamMeta) -> bool:
        """A stream continues only on the model that began it (same text, same token ids)."""
        return await self.engines.serves(meta.model)

    def read_plan(self, plan_json: str) -> PlanT:
        """The saved plan, validated; one from an incompatible version ends the stream with
        an ``incompatible_plan`` error."""
        try:
            plan: PlanT = self.plans.validate_json(plan_json)
        except ValidationError as exc:
            raise plan_error(self.name, exc) from None
        return plan

    async def started(self, stream_id: str, producer: Any) -> None:
        return None

    async def not_started(self, producer: Any, error: Exception) -> None:
        return None


@dataclass(frozen=True)
class KindSlice:
    """One kind as the app registers it: how to build it, and its routes."""

    build: Callable[[KindDeps], StreamKind]
    router: APIRouter
