"""Producers: run each stream's producer as a task of this process, writing the event log.

``start`` creates a stream (its ``stream`` event and lease) and runs the kind's first producer;
``spawn`` runs any producer (a continuation after a takeover, too) from a given next event id.
The HTTP response that asked for a stream is only a reader, so a client leaving changes nothing.
A stream always ends with a terminal event, written together with its final status.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from functools import partial

from redis.exceptions import RedisError

from rag_stream.errors import EngineDied, EventLogUnavailable, RagStreamError
from rag_stream.schemas.events import Done, ErrorEvent, Event, FinishReason, StreamStarted
from rag_stream.schemas.tenants import LOCAL_TENANT
from rag_stream.settings import StreamingSettings
from rag_stream.store.db import unavailable
from rag_stream.streaming.admission import Ticket
from rag_stream.streaming.context import Stopped, StreamContext
from rag_stream.streaming.event_log import EventLog, FinishResult, NewStream
from rag_stream.streaming.feeds import Feeds
from rag_stream.streaming.flusher import Flusher
from rag_stream.streaming.kinds import Producer, StreamKind
from rag_stream.streaming.redis_conn import retry_redis
from rag_stream.streaming.start_keys import StartKey
from rag_stream.streaming.writer import GONE, StreamWriter

logger = logging.getLogger(__name__)


def new_stream_id() -> str:
    return secrets.token_urlsafe(24)  # 192 random bits


class Producers:
    def __init__(self, event_log: EventLog, cfg: StreamingSettings, feeds: Feeds) -> None:
        self.event_log = event_log
        self.cfg = cfg
        self.feeds = feeds
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._writers: dict[str, StreamWriter] = {}
        self._flusher = Flusher(event_log, cfg)
        # streams this process stopped because Redis was unreachable, to be settled once it is
        # back: by their log if it kept them, else marked lost (``settle_unreachable``)
        self._unreachable: dict[str, tuple[NewStream, int, Producer | None]] = {}

    @property
    def active(self) -> int:
        """Streams this process is generating now."""
        return len(self._tasks)

    def owns(self, stream_id: str) -> bool:
        return stream_id in self._tasks

    def hear_now(self, stream_id: str) -> None:
        """Have the stream's writer, if this process runs it, ask the log at once (an empty
        append) rather than at its next renewal: the answer carries a cancel just requested,
        which a stream with no events to write (queued, planning, searching) would otherwise
        learn only up to ``renew_interval_s`` later."""
        writer = self._writers.get(stream_id)
        if writer is not None:
            self._flusher.request(writer, urgent=True)

    async def start(
        self,
        kind: StreamKind,
        producer: Producer,
        wire: str | None = None,
        ticket: Ticket | None = None,
        tenant: str = LOCAL_TENANT,
        detached: bool = False,
        abandon_after_s: float | None = None,
        alias: str | None = None,
        start_key: StartKey | None = None,
    ) -> str:
        """Create a stream of ``kind`` and run its first producer; return the stream id.
        ``wire`` is stored with it for the API layer (the format a resume renders); with a
        ``ticket`` the producer waits for a generation slot first (see admission.py);
        ``abandon_after_s`` is its own window, ``alias`` another name for it (NewStream) and
        ``start_key`` the start's Idempotency-Key (start_keys.py)."""
        sid = new_stream_id()
        first = StreamStarted(
            id=0,
            stream_id=sid,
            conversation_id=producer.conversation_id,
            model=producer.model,
            created=time.time(),
        )
        new = NewStream(
            model=producer.model,
            kind=kind.name,
            created=first.created,
            wire=wire,
            tenant=tenant,
            detached=detached,
            abandon_after_s=abandon_after_s,
            alias=alias,
            start_key=None if start_key is None else start_key.key,
            start_fingerprint=None if start_key is None else start_key.fingerprint,
        )
        plan = producer.initial_plan
        await self.event_log.create(
            sid,
            first,
            new,
            self.owner,
            self.cfg.lease_ms,
            plan_json=None if plan is None else plan.model_dump_json(),
        )
        self.spawn(sid, new, [first], lambda: producer, ticket=ticket)
        return sid

    def spawn(
        self,
        sid: str,
        new: NewStream,
        logged: Sequence[Event],
        make: Callable[[], Producer],
        *,
        cancelled: bool = False,
        ticket: Ticket | None = None,
        taken_over: bool = False,
    ) -> None:
        """Run the producer ``make()`` for a stream this process holds the lease of, after the
        events ``logged`` (all of them: this process's readers are served from memory now);
        ``taken_over``: its producer died elsewhere (StreamWriter's abandonment window)."""
        self.feeds.produce(sid, logged)
        task = asyncio.create_task(
            self._produce(sid, new, logged[-1].id + 1, make, cancelled, ticket, taken_over),
            name=f"stream-{sid[:8]}",
        )
        self._tasks[sid] = task
        task.add_done_callback(lambda _t: self._tasks.pop(sid, None))

    async def _produce(
        self,
        sid: str,
        new: NewStream,
        next_id: int,
        make: Callable[[], Producer],
        cancelled: bool,
        ticket: Ticket | None,
        taken_over: bool,
    ) -> None:
        feeds = self.feeds
        writer = StreamWriter(
            self._flusher,
            sid,
            self.owner,
            next_id,
            self.cfg,
            publish=partial(feeds.publish, sid),
            local_seen_ms=partial(feeds.local_seen_ms, sid),
            abandonable=not new.detached,
            abandon_after_s=new.abandon_after_s,
            taken_over=taken_over,
        )
        self._writers[sid] = writer
        try:
            # the writer renews the lease while the stream waits for its generation slot
            async with contextlib.AsyncExitStack() as slot:
                if ticket is not None:
                    await _wait_for_slot(slot, ticket, writer)
                await self._run(sid, new, writer, make, cancelled)
        except asyncio.CancelledError:
            # shutting down while waiting for a slot: leave the stream to another process
            self._flusher.remove(writer)
            feeds.stop_producing(sid)
            raise
        finally:
            self._writers.pop(sid, None)

    async def _run(
        self,
        sid: str,
        new: NewStream,
        writer: StreamWriter,
        make: Callable[[], Producer],
        cancelled: bool,
    ) -> None:
        feeds = self.feeds
        run_id = f"{sid}:{uuid.uuid4().hex[:8]}"
        status = "done"
        producer: Producer | None = None
        try:
            producer = make()
            ctx = StreamContext(
                sid, run_id, writer, self.event_log, producer.accepted_at, new.tenant
            )
            reason: FinishReason = "cancelled"
            try:
                if not cancelled and writer.stop_reason is None:  # (cancelled while queued)
                    reason = await producer.run(ctx)
            except Stopped:
                reason = "cancelled"
            finally:
                await writer.close()
            if writer.stop_reason in GONE:
                await self._gone(sid, new, writer, producer)
                return
            if writer.stop_reason is not None:
                reason = "cancelled"
            terminal: Event = await producer.finish(ctx, reason, writer.next_id)
            if writer.stop_reason == "abandoned" and isinstance(terminal, Done):
                terminal = terminal.model_copy(update={"abandoned": True})
        except asyncio.CancelledError:
            # this process is shutting down: leave the stream to be taken over elsewhere
            await self._leave(sid, writer)
            raise
        except EngineDied:
            # so is it, for want of an engine (create_app stops it): leave the stream too,
            # rather than end it with an error a live process could have avoided
            logger.warning("stream %s: the engine died; left to be continued elsewhere", sid)
            await self._leave(sid, writer)
            return
        except Exception as exc:
            if writer.stop_reason in GONE:
                await self._gone(sid, new, writer, producer)
                return
            status = "error"
            terminal = error_event(writer.next_id, exc)
        events = [*writer.take_buffer(), terminal]
        outcome = await self.finish(sid, events, status, terminal, after=writer.logged_id)
        if outcome == "log_lost":
            await self._mark_lost(sid, new, terminal.id, producer)
        elif outcome != "done":
            feeds.stop_producing(sid)

    async def _leave(self, sid: str, writer: StreamWriter) -> None:
        """Stop producing without an end: the stream's lease lapses (or this process's
        presence goes) and another process continues it from its log."""
        self.feeds.stop_producing(sid)
        with contextlib.suppress(Exception):
            await writer.run_stop_callbacks()

    async def _gone(
        self, sid: str, new: NewStream, writer: StreamWriter, producer: Producer | None
    ) -> None:
        if writer.stop_reason == "log_lost":
            await self._mark_lost(sid, new, writer.next_id, producer)
            return
        if writer.stop_reason == "log_unavailable":
            self._unreachable[sid] = (new, writer.next_id, producer)
        # another process owns the stream now, or Redis is gone: readers look there
        self.feeds.stop_producing(sid)

    async def settle_unreachable(self) -> None:
        """For each stream this process gave up while Redis was unreachable, once Redis
        answers again: a log that survived (Redis restarted from its files) is continued by
        a takeover like any stream without a producer; one that did not (restarted empty) is
        marked lost here, as the streams still writing at the restart mark theirs, so that
        its readers read ``log_lost`` rather than find no stream at all. Called by the
        sweeper; a Redis still away leaves them for the next sweep."""
        for sid, (new, event_id, producer) in list(self._unreachable.items()):
            if await self.event_log.meta(sid) is None:
                await self._mark_lost(sid, new, event_id, producer)
            del self._unreachable[sid]

    async def _mark_lost(
        self, sid: str, new: NewStream, event_id: int, producer: Producer | None
    ) -> None:
        """The log lost events this process wrote (Redis restarted empty, say): end the stream
        with an error that says so, rather than extend a log with a hole."""
        logger.error("stream %s: its log lost events; ending it with an error", sid)
        lost = ErrorEvent(
            id=event_id,
            code="log_lost",
            message="the event log lost this stream's earlier events (its store restarted "
            "without them); the stream cannot be resumed or continued",
        )
        try:
            await self.event_log.mark_lost(sid, self.owner, new, lost, self.cfg.retention_s)
        except RedisError as exc:
            logger.warning("stream %s: could not record the lost log: %s", sid, exc)
        self.feeds.publish(sid, [lost])
        if producer is not None:
            try:
                await producer.log_lost(lost)  # a job's row: failed, not running for good
            except Exception:
                logger.exception("stream %s: recording the lost log failed", sid)

    async def finish(
        self, sid: str, events: list[Event], status: str, terminal: Event, after: int
    ) -> FinishResult | None:
        """Write the last events and the final status together (retrying while Redis blips);
        this process's readers see them once they are in the log."""
        reason = terminal.finish_reason if isinstance(terminal, Done) else "error"
        try:
            outcome = await retry_redis(
                lambda: self.event_log.finish(
                    sid, self.owner, events, status, reason, self.cfg.retention_s, after
                ),
                self.cfg.redis_retries,
                f"stream {sid}: writing its end",
            )
        except RedisError:
            logger.error("stream %s: could not write its end; it will be taken over later", sid)
            return None
        if outcome == "done":
            self.feeds.publish(sid, events)
        return outcome

    async def announce(self) -> None:
        await self.event_log.announce(self.owner)

    async def close(self) -> None:
        """Cancel every producer of this process (their streams are taken over elsewhere)."""
        with contextlib.suppress(Exception):
            # peers may take over at once; our presence record outlives our leases, no more
            await self.event_log.retire(self.owner, linger_ms=2 * self.cfg.lease_ms)
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._flusher.close()


async def _wait_for_slot(
    stack: contextlib.AsyncExitStack, ticket: Ticket, writer: StreamWriter
) -> None:
    """Hold the ticket's generation slot for the rest of ``stack``, unless the stream stops
    while it waits (a cancel): then it gives its place up and goes on without a slot, since all
    it does next is write its end (``_run`` runs no producer for a stopped stream)."""
    if ticket.slot_free:  # nothing to wait for, so no stop to race: held before any await
        await stack.enter_async_context(ticket.slot())
        return
    stopped = asyncio.Event()

    async def note_stop() -> None:
        stopped.set()

    writer.on_stop(note_stop)
    waiting = asyncio.ensure_future(stack.enter_async_context(ticket.slot()))
    stop = asyncio.ensure_future(stopped.wait())
    try:
        await asyncio.wait((waiting, stop), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
        if not waiting.done():
            # the ticket leaves the queue and is freed (Ticket.slot); a slot handed over
            # meanwhile passes on to the next waiter (Admission._acquire)
            waiting.cancel()
            await asyncio.wait((waiting,))
            ticket.release()  # (only needed if the wait was cancelled before it began)
    if not waiting.cancelled():
        waiting.result()  # the slot is held (or its wait failed: raise that)


def error_event(event_id: int, exc: BaseException) -> ErrorEvent:
    if isinstance(exc, RagStreamError):
        return ErrorEvent(id=event_id, code=exc.code, message=exc.message)
    if isinstance(exc, RedisError):
        err = EventLogUnavailable(f"event log unavailable: {exc}")
        return ErrorEvent(id=event_id, code=err.code, message=err.message)
    if (db := unavailable(exc)) is not None:
        logger.warning("stream failed: %s", exc)
        return ErrorEvent(id=event_id, code=db.code, message=db.message)
    logger.exception("stream failed", exc_info=exc)
    return ErrorEvent(id=event_id, code="internal_error", message="generation failed unexpectedly")
