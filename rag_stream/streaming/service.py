"""Streams: the one object routes and kinds use to start, follow, inspect and cancel streams.

``launch`` is the only way a stream starts: admission (a ticket, or a 429 before any work), the
kind's ``accept``, the priority the accepted run waits in, the stream's creation and its first
producer, in that order, for every kind. It composes the parts, each in its own module:
``Admission`` bounds what this process runs, ``Producers`` run its producers, ``Takeover``
continues streams whose process died (and sweeps orphans), ``Readers`` follow a log from a
cursor. Any process sharing the Redis log can serve any of these for any stream.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Generic

from redis.exceptions import RedisError

from rag_stream.errors import EventLogUnavailable, InvalidRequest, NotFound
from rag_stream.schemas.events import Event, Token
from rag_stream.settings import StreamingSettings
from rag_stream.streaming.admission import Admission, Priority
from rag_stream.streaming.event_log import EventLog, StreamMeta
from rag_stream.streaming.feeds import Feeds
from rag_stream.streaming.kinds import (
    IntentT,
    KindRegistry,
    LaunchableKind,
    ProducerT,
    StreamKind,
)
from rag_stream.streaming.producer import Producers
from rag_stream.streaming.reader import Readers
from rag_stream.streaming.start_keys import StartKey
from rag_stream.streaming.takeover import Takeover

# What ``opening`` reads at a time: a stream event and an answer's citations fit in one or two.
OPENING_PAGE = 16


@dataclass(frozen=True)
class CancelOutcome:
    cancelled: bool
    meta: StreamMeta
    message: str


@dataclass(frozen=True)
class Launched(Generic[ProducerT]):
    stream_id: str
    # the first run, as the kind accepted it (e.g. a job's id is in it); None when the start's
    # key found the stream an earlier start launched (start_keys.py), which is read from its start
    producer: ProducerT | None


class Streams:
    def __init__(
        self,
        event_log: EventLog,
        cfg: StreamingSettings,
        kinds: Sequence[StreamKind],
        admission: Admission,
    ) -> None:
        self.event_log = event_log
        self.admission = admission
        self.feeds = Feeds(event_log, cfg.tail_block_ms)
        self.producers = Producers(event_log, cfg, self.feeds)
        self.takeover = Takeover(self.producers, KindRegistry(kinds), cfg.sweep_interval_s)
        self.readers = Readers(event_log, self.feeds, self.takeover, cfg.dead_check_ms)

    @property
    def active(self) -> int:
        return self.producers.active

    def start_sweeper(self) -> None:
        self.takeover.start_sweeper()

    async def close(self) -> None:
        await self.takeover.close()
        await self.producers.close()
        await self.feeds.close()

    async def launch(
        self,
        kind: LaunchableKind[IntentT, ProducerT],
        intent: IntentT,
        *,
        tenant: str,
        priority: Priority,
        wire: str | None = None,
        abandon_after_s: float | None = None,
        alias: str | None = None,
        start_key: StartKey | None = None,
    ) -> Launched[ProducerT]:
        """Start a stream of ``kind`` for ``intent``: a ticket first (429 before any work when
        this process, or the tenant, is full), then ``kind.accept``, then the stream waits for a
        generation slot in the class its accepted run needs (a long prompt: ``batch``).
        ``wire`` (opaque here) tells a later resume how the API renders the stream; only
        ``tenant`` may read, resume or cancel it; ``abandon_after_s``: how long after its last
        reader left it stops (None: ``streaming.abandon_after_s``); ``alias``: a name the tenant
        also finds it by (``named``), such as a chat's id; ``start_key``: the start's
        Idempotency-Key, which finds the stream an earlier start with it launched instead."""
        if start_key is not None:
            earlier = await self.named(start_key.alias, tenant=tenant)
            if earlier is not None:
                start_key.check(earlier)
                return Launched(earlier.stream_id, None)
        async with self.admission.ticket(priority, tenant) as ticket:
            producer = await kind.accept(intent, tenant)
            ticket.priority = producer.priority
            try:
                sid = await self.producers.start(
                    kind,
                    producer,
                    wire,
                    ticket,
                    tenant,
                    detached=kind.detached,
                    abandon_after_s=abandon_after_s,
                    alias=alias,
                    start_key=start_key,
                )
            except Exception as exc:
                await kind.not_started(producer, exc)
                raise
        await kind.started(sid, producer)
        return Launched(sid, producer)

    def follow(self, sid: str, after: int = -1) -> AsyncIterator[Event]:
        return self.readers.follow(sid, after)

    def follow_batches(self, sid: str, after: int = -1) -> AsyncGenerator[list[Event], None]:
        """``follow``, with the events that are ready together in one list (one SSE write)."""
        return self.readers.follow_batches(sid, after)

    async def status(self, sid: str, *, tenant: str) -> StreamMeta:
        """The stream's meta; NotFound for another tenant's stream, as for an unknown one."""
        try:
            meta = await self.event_log.meta(sid)
        except RedisError as exc:
            raise EventLogUnavailable(f"event log (Redis) unavailable: {exc}") from exc
        if meta is None or meta.tenant != tenant:
            raise NotFound(f"stream {sid!r} not found (unknown, or expired after retention)")
        return meta

    async def last_event(self, sid: str, *, tenant: str) -> Event | None:
        """The stream's last logged event (its terminal one, once it ended)."""
        meta = await self.status(sid, tenant=tenant)
        try:
            events = await self.event_log.read(sid, meta.last_event_id - 1, None)
        except RedisError as exc:
            raise EventLogUnavailable(f"event log (Redis) unavailable: {exc}") from exc
        return events[-1] if events else None

    async def opening(self, sid: str, upto: int) -> list[Event]:
        """The stream's events up to id ``upto`` that come before its first token, that token
        included (the ``stream`` event, citations...): what a renderer of another wire needs to
        know of the part a resumed client already has. How many they are does not depend on the
        stream's length."""
        events: list[Event] = []
        try:
            while not events or events[-1].id < upto:
                after = events[-1].id if events else -1
                page = await self.event_log.read(sid, after, None, OPENING_PAGE)
                token = next((i for i, e in enumerate(page) if isinstance(e, Token)), None)
                events += page if token is None else page[: token + 1]
                if not page or token is not None:
                    break
        except RedisError as exc:
            raise EventLogUnavailable(f"event log (Redis) unavailable: {exc}") from exc
        return [e for e in events if e.id <= upto]

    async def events_between(self, sid: str, after: int, upto: int) -> list[Event]:
        """The logged events with ids in (``after``, ``upto``], read in pages (RedisError
        passes: a caller that has started a response says so in it)."""
        events: list[Event] = []
        cursor = after
        while cursor < upto:
            page = await self.event_log.read(sid, cursor, None)
            if not page:
                break
            events += (e for e in page if e.id <= upto)
            cursor = page[-1].id
        return events

    async def named(self, alias: str, *, tenant: str) -> StreamMeta | None:
        """The meta of ``tenant``'s latest stream launched with ``alias``, if it is still kept."""
        try:
            sid = await self.event_log.named(tenant, alias)
            meta = None if sid is None else await self.event_log.meta(sid)
        except RedisError as exc:
            raise EventLogUnavailable(f"event log (Redis) unavailable: {exc}") from exc
        return meta if meta is not None and meta.tenant == tenant else None

    async def check_cursor(self, sid: str, cursor: int, *, tenant: str) -> StreamMeta:
        """The stream's meta, once a reader's cursor (-1: from the start) is checked against
        it; then ``follow_batches`` reads on."""
        meta = await self.status(sid, tenant=tenant)
        if cursor > meta.last_event_id:
            raise InvalidRequest(
                f"last_event_id {cursor} is beyond the stream's last event ({meta.last_event_id})"
            )
        return meta

    async def cancel(self, sid: str, *, tenant: str, wait_s: float = 10) -> CancelOutcome:
        meta = await self.status(sid, tenant=tenant)
        if meta.status != "running":
            return CancelOutcome(
                False, meta, f"stream already finished ({meta.finish_reason}); nothing to cancel"
            )
        try:
            await self.event_log.request_cancel(sid)
            self.producers.hear_now(sid)  # run here: it stops now, not at its next renewal
            if meta.lease_owner is None:  # its process died: end it from here
                await self.takeover.take_over(sid)
            final = await self.readers.wait_finished(sid, timeout_s=wait_s) or meta
        except RedisError as exc:
            raise EventLogUnavailable(f"event log unavailable: {exc}") from exc
        if final.status == "running":
            return CancelOutcome(True, final, "cancel requested; the stream is ending")
        if final.finish_reason == "cancelled":
            return CancelOutcome(True, final, "cancelled")
        return CancelOutcome(False, final, "the stream ended first")
