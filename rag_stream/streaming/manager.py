"""Streams decoupled from HTTP: producers write the Redis log, readers follow it from a cursor.

- ``start`` creates a stream (its ``stream`` event and lease) and runs its pipeline as a task of
  this process; the HTTP response is only a reader, so a client leaving changes nothing.
- ``follow`` replays events after a cursor, then follows live ones to the terminal event. When
  it finds a running stream whose lease has expired (its process died) it takes the stream over.
- A sweeper in every process takes over orphaned streams nobody is reading, so they still end.
- ``take_over`` rebuilds the engine input from the stored prompt token ids plus every generated
  token id in the log and continues with the same sampling and the remaining token budget.
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
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

from redis.exceptions import RedisError

from rag_stream.errors import EventLogUnavailable, RagStreamError
from rag_stream.generation.engine import Engine
from rag_stream.pipeline.context import Finalizer, Stopped, StreamContext
from rag_stream.pipeline.plan import Plan
from rag_stream.schemas.events import (
    Done,
    ErrorEvent,
    Event,
    StreamStarted,
    Token,
    TransientError,
    is_terminal,
)
from rag_stream.settings import StreamingSettings
from rag_stream.streaming.event_log import EventLog, StreamMeta
from rag_stream.streaming.writer import StreamWriter

log = logging.getLogger(__name__)

Body = Callable[[StreamContext], Awaitable[None]]
EngineProvider = Callable[[], Awaitable[Engine]]


def new_stream_id() -> str:
    return secrets.token_urlsafe(24)  # 192 random bits


def transient_error(code: str, message: str) -> TransientError:
    """An error the reader saw itself (not in the log): sent without an SSE id (see to_sse)."""
    return TransientError(id=0, code=code, message=message)


class StreamManager:
    def __init__(
        self,
        event_log: EventLog,
        cfg: StreamingSettings,
        engine: EngineProvider,
        finalizers: Mapping[str, Finalizer],
    ) -> None:
        self.log = event_log
        self.cfg = cfg
        self._engine = engine
        self._finalizers = finalizers
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._sweeper: asyncio.Task[None] | None = None

    @property
    def active(self) -> int:
        """Streams this process is generating now."""
        return len(self._tasks)

    # -- lifecycle -------------------------------------------------------------------------

    def start_sweeper(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep(), name="stream-sweeper")

    async def close(self) -> None:
        tasks = [t for t in (self._sweeper, *self._tasks.values()) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.sweep_interval_s)
            try:
                for sid in await self.log.running():
                    if sid not in self._tasks:
                        await self.take_over(sid)
            except RedisError as exc:
                log.warning("sweeper: event log unavailable: %s", exc)
            except Exception:
                log.exception("sweeper failed")

    # -- producing -------------------------------------------------------------------------

    async def start(
        self, *, model: str, kind: str, body: Body, conversation_id: str | None = None
    ) -> str:
        sid = new_stream_id()
        first = StreamStarted(
            id=0, stream_id=sid, conversation_id=conversation_id, model=model, created=time.time()
        )
        meta = {"model": model, "kind": kind, "created": str(first.created)}
        await self.log.create(sid, first, meta, self.owner, self.cfg.lease_ms)
        self._spawn(sid, 1, kind, body)
        return sid

    def _spawn(self, sid: str, next_id: int, kind: str, body: Body) -> None:
        task = asyncio.create_task(
            self._produce(sid, next_id, kind, body), name=f"stream-{sid[:8]}"
        )
        self._tasks[sid] = task
        task.add_done_callback(lambda _t: self._tasks.pop(sid, None))

    async def _produce(self, sid: str, next_id: int, kind: str, body: Body) -> None:
        try:
            engine = await self._engine()
        except Exception as exc:  # the engine failed to start: end the stream with an error
            failed = _error_event(next_id, exc)
            await self._finish(sid, [failed], "error", failed)
            return
        request_id = f"{sid}:{uuid.uuid4().hex[:8]}"
        writer = StreamWriter(
            self.log, sid, self.owner, next_id, self.cfg, on_stop=lambda: engine.abort(request_id)
        )
        ctx = StreamContext(sid, request_id, engine, writer, self.log)
        status = "done"
        try:
            try:
                await body(ctx)
                reason = ctx.run.finish_reason
            except Stopped:
                reason = "cancelled"
            finally:
                await writer.close()
            if writer.stop_reason in ("lost", "log_unavailable"):
                return  # another process owns the stream now, or Redis is gone
            if writer.stop_reason is not None:
                reason = "cancelled"
            finalize = self._finalizers[kind]
            terminal: Event = await finalize(ctx, reason, writer.next_id)
        except asyncio.CancelledError:
            # this process is shutting down: leave the stream to be taken over elsewhere
            await engine.abort(request_id)
            raise
        except Exception as exc:
            if writer.stop_reason in ("lost", "log_unavailable"):
                return
            status = "error"
            terminal = _error_event(writer.next_id, exc)
        await self._finish(sid, [*writer.take_buffer(), terminal], status, terminal)

    async def _finish(self, sid: str, events: list[Event], status: str, terminal: Event) -> None:
        reason = terminal.finish_reason if isinstance(terminal, Done) else "error"
        for attempt in range(self.cfg.redis_retries + 1):
            try:
                await self.log.finish(sid, self.owner, events, status, reason, self.cfg.retention_s)
                return
            except RedisError as exc:
                log.warning("stream %s: finish failed (%s), attempt %d", sid, exc, attempt)
                await asyncio.sleep(0.2 * (attempt + 1))
        log.error("stream %s: could not write its end; it will be taken over later", sid)

    # -- takeover --------------------------------------------------------------------------

    async def take_over(self, sid: str) -> bool:
        """Continue a running stream whose owner died. True if this process now owns it."""
        if sid in self._tasks:
            return True
        engine = await self._engine()
        meta = await self.log.meta(sid)
        if meta is None or meta.status != "running" or meta.lease_owner is not None:
            return False
        if meta.model != engine.model_name:
            return False  # leave it to a process running the same model
        if not await self.log.acquire(sid, self.owner, self.cfg.lease_ms):
            return False
        events = await self._read_all(sid)
        if not events:
            return False
        if is_terminal(events[-1]):  # it ended but died before marking it: just mark it
            last = events[-1]
            reason = last.finish_reason if isinstance(last, Done) else "error"
            status = "done" if isinstance(last, Done) else "error"
            await self.log.finish(sid, self.owner, [], status, reason, self.cfg.retention_s)
            return False
        log.info("stream %s: taking over after event %d", sid, events[-1].id)
        self._spawn(
            sid, events[-1].id + 1, meta.kind, lambda ctx: self._continue(ctx, meta, events)
        )
        return True

    async def _read_all(self, sid: str) -> list[Event]:
        events: list[Event] = []
        while True:
            batch = await self.log.read(sid, events[-1].id if events else -1, None)
            if not batch:
                return events
            events.extend(batch)

    async def _continue(self, ctx: StreamContext, meta: StreamMeta, events: list[Event]) -> None:
        if meta.plan is None:
            raise RagStreamError("the stream's process died before generation started; retry")
        plan = Plan.from_dict(meta.plan)
        ctx.plan = plan
        if meta.cancel:
            raise Stopped("cancelled")
        tokens = [e for e in events if isinstance(e, Token)]
        generated = [t for e in tokens for t in e.token_ids]
        ctx.text = [e.text for e in tokens]
        ctx.generated_before = len(generated)
        from rag_stream.pipeline.phases import token_phase

        await token_phase(ctx, plan, generated)

    # -- reading ---------------------------------------------------------------------------

    async def follow(self, sid: str, after: int) -> AsyncIterator[Event]:
        """Every event after ``after``, then live events until the terminal one."""
        cursor = after
        while True:
            try:
                events = await self.log.read(sid, cursor, self.cfg.read_block_ms)
            except RedisError as exc:
                yield transient_error("event_log_unavailable", f"event log unavailable: {exc}")
                return
            for event in events:
                yield event
                cursor = event.id
                if is_terminal(event):
                    return
            if events:
                continue
            try:
                meta = await self.log.meta(sid)
                if meta is None:
                    yield transient_error("not_found", "stream expired")
                    return
                if meta.status != "running" and cursor >= meta.last_event_id:
                    return
                if meta.status == "running" and meta.lease_owner is None:
                    await self.take_over(sid)
            except RedisError as exc:
                yield transient_error("event_log_unavailable", f"event log unavailable: {exc}")
                return

    async def wait_finished(self, sid: str, timeout_s: float) -> StreamMeta | None:
        deadline = time.monotonic() + timeout_s
        while True:
            meta = await self.log.meta(sid)
            if meta is None or meta.status != "running" or time.monotonic() > deadline:
                return meta
            await asyncio.sleep(0.05)


def _error_event(event_id: int, exc: BaseException) -> ErrorEvent:
    if isinstance(exc, RagStreamError):
        return ErrorEvent(id=event_id, code=exc.code, message=exc.message)
    if isinstance(exc, RedisError):
        err = EventLogUnavailable(f"event log unavailable: {exc}")
        return ErrorEvent(id=event_id, code=err.code, message=err.message)
    log.exception("stream failed", exc_info=exc)
    return ErrorEvent(id=event_id, code="internal_error", message="generation failed unexpectedly")
