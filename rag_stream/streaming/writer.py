"""The writing side of one stream: buffers events for the process's flusher and keeps the lease.

The producer emits events into the writer's buffer; the process's ``Flusher`` sends the buffers
of all its streams to the log together (see ``flusher.py``), and at least every
``renew_interval_s`` an empty batch renews the lease. Once the log has acknowledged a batch, the
writer hands it to this process's readers (``publish``). Each append tells it whether the stream
was cancelled, whether a reader is still attached, whether it still owns the stream, and whether
the log still ends where it left it; on any of these it records a stop reason and runs the
callbacks registered with ``on_stop`` (the producer's: they abort its engine request), so
generation ends within one decode step.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Literal

from rag_stream.schemas.events import Event
from rag_stream.settings import StreamingSettings
from rag_stream.streaming.event_log import Append, AppendResult, now_ms
from rag_stream.streaming.flusher import Flusher

logger = logging.getLogger(__name__)

StopReason = Literal["cancelled", "abandoned", "lost", "log_unavailable", "log_lost"]
# How often a writer asks whether its stream was abandoned: a window is seconds long (a chat
# stream's 3 s), and the question (this process's readers, then the clock: four calls) cost
# about 2 % of the CPU a token when it was asked at every flush.
ABANDON_CHECK_S = 0.25
# Reasons after which this writer must not touch the stream again.
GONE: frozenset[StopReason] = frozenset({"lost", "log_unavailable", "log_lost"})


class StreamWriter:
    def __init__(
        self,
        flusher: Flusher,
        stream_id: str,
        owner: str,
        next_id: int,
        cfg: StreamingSettings,
        publish: Callable[[Sequence[Event]], None],
        local_seen_ms: Callable[[], int],
        abandonable: bool = True,
        abandon_after_s: float | None = None,
        taken_over: bool = False,
    ) -> None:
        self._flusher = flusher
        self._abandonable = abandonable  # False: a detached stream (NewStream.detached)
        # this stream's own window (NewStream.abandon_after_s), else the service's
        self._abandon_after_s = cfg.abandon_after_s if abandon_after_s is None else abandon_after_s
        # After a takeover every reader lost its connection at the same moment, and finds this
        # process through its retries (and a load balancer's): until one is back, a short
        # window of the stream's own (a chat stream's 3 s) gives way to the service's.
        self._first_window_s = self._abandon_after_s
        if taken_over:
            self._first_window_s = max(self._abandon_after_s, cfg.abandon_after_s)
        # readers get the whole window from this run's start: after a takeover, those of the
        # dead process could not have come back before it
        self._since_ms = now_ms()
        self._sid = stream_id
        self._owner = owner
        self._cfg = cfg
        self._publish = publish
        self._local_seen_ms = local_seen_ms
        self._stop_callbacks: list[Callable[[], Awaitable[None]]] = []
        self._stopping: asyncio.Task[None] | None = None
        self._buffer: list[Event] = []
        self._sending: list[Event] = []  # the batch in flight
        self._flushing = False  # a batch is in flight (begin_flush, until end_flush)
        self._flushed: asyncio.Future[None] | None = None  # close() waits on it for that batch
        self.next_id = next_id
        self.logged_id = next_id - 1  # the last event known to be in the log
        self.stop_reason: StopReason | None = None
        self.renew_due = time.monotonic() + cfg.renew_interval_s
        self._abandon_check_at = 0.0  # (time.monotonic()) when _abandoned is next asked
        flusher.add(self)

    def emit(self, make: Callable[[int], Event]) -> Event:
        event = make(self.next_id)
        self.next_id += 1
        self._buffer.append(event)
        if len(self._buffer) == 1:
            self._flusher.request(self)
        elif len(self._buffer) >= self._cfg.flush_max_events:
            self._flusher.request(self, urgent=True)
        return event

    # -- called by the flusher ---------------------------------------------------------------

    def begin_flush(self) -> Append | None:
        if self.stop_reason in GONE:
            return None
        cap = self._cfg.append_max_events  # the rest goes in the next flush (end_flush asks)
        self._sending, self._buffer = self._buffer[:cap], self._buffer[cap:]
        self._flushing = True
        return Append(self._sid, self._owner, self._sending, self._cfg.lease_ms, self.logged_id)

    def end_flush(self, result: AppendResult | None) -> None:
        batch, self._sending = self._sending, []
        self._flushing = False
        if self._flushed is not None:
            if not self._flushed.done():
                self._flushed.set_result(None)
            self._flushed = None
        if result is not None and result.owned and batch:
            self.logged_id = batch[-1].id
            self._publish(batch)
        now = time.monotonic()
        self.renew_due = now + self._cfg.renew_interval_s
        if result is None:
            self._stop("log_unavailable")
        elif result.superseded:
            self._stop("lost")  # another writer appended these ids first
        elif result.log_lost:
            self._stop("log_lost")
        elif not result.owned:
            self._stop("lost")
        elif result.cancel:
            self._stop("cancelled")
        elif now >= self._abandon_check_at and self._abandoned(result.reader_seen_ms, now):
            self._stop("abandoned")
        if self._buffer and self.stop_reason not in GONE:
            self._flusher.request(self)  # emitted while the batch was in flight

    def _abandoned(self, seen_ms: int, now: float) -> bool:
        """No reader anywhere (this process's, or another's heartbeat in the log) for a while.
        Asked at most every ``ABANDON_CHECK_S`` (``now``: time.monotonic()), not at every flush
        (every engine step): ``end_flush`` asks only once ``_abandon_check_at`` has come."""
        self._abandon_check_at = now + ABANDON_CHECK_S
        seen = max(seen_ms, self._local_seen_ms())
        limit = self._abandon_after_s if seen > self._since_ms else self._first_window_s
        if not self._abandonable or limit <= 0:
            return False
        return now_ms() - max(seen, self._since_ms) > limit * 1000

    def on_stop(self, callback: Callable[[], Awaitable[None]]) -> None:
        """Run ``callback`` when the stream must stop (cancel, abandon, lost lease or log)."""
        self._stop_callbacks.append(callback)

    async def run_stop_callbacks(self) -> None:
        for callback in self._stop_callbacks:
            try:
                await callback()
            except Exception:
                logger.exception("stream %s: a stop callback failed", self._sid)

    @property
    def redis_retries(self) -> int:
        return self._cfg.redis_retries

    def log_unavailable(self) -> None:
        """A write of the producer's own (its plan) found Redis away after its retries: stop
        as a failed append does; the stream is continued from its log once Redis is back."""
        self._stop("log_unavailable")

    def _stop(self, reason: StopReason) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
            logger.info("stream %s: stopping (%s)", self._sid, reason)
            self._stopping = asyncio.create_task(self.run_stop_callbacks())

    async def close(self) -> None:
        """Leave the flusher after any flush in flight (never cut one in half: its events may
        or may not be in the log). The caller then writes the rest with finish()."""
        self._flusher.remove(self)
        if self._flushing:
            if self._flushed is None:
                self._flushed = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._flushed)
        if self._stopping is not None:
            await self._stopping

    def take_buffer(self) -> list[Event]:
        batch, self._buffer = self._buffer, []
        return batch
