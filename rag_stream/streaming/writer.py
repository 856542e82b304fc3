"""The writing side of one stream: batches events into the log and keeps the lease.

A writer flushes when its buffer reaches ``flush_max_events`` or ``flush_interval_ms`` after the
first buffered event, and at least every ``renew_interval_s`` (an empty append renews the lease).
Once the log has acknowledged a batch, the writer hands it to this process's readers
(``publish``). Each append tells it whether the stream was cancelled, whether a reader is still
attached, whether it still owns the stream, and whether the log still ends where it left it; on
any of these it records a stop reason and runs the callbacks registered with ``on_stop`` (the
producer's: they abort its engine request), so generation ends within one decode step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Literal

from redis.exceptions import RedisError

from rag_stream.schemas.events import Event
from rag_stream.settings import StreamingSettings
from rag_stream.streaming.event_log import EventLog, now_ms

logger = logging.getLogger(__name__)

StopReason = Literal["cancelled", "abandoned", "lost", "log_unavailable", "log_lost"]
# Reasons after which this writer must not touch the stream again.
GONE: frozenset[StopReason] = frozenset({"lost", "log_unavailable", "log_lost"})


class StreamWriter:
    def __init__(
        self,
        event_log: EventLog,
        stream_id: str,
        owner: str,
        next_id: int,
        cfg: StreamingSettings,
        publish: Callable[[Sequence[Event]], None],
        local_seen_ms: Callable[[], int],
    ) -> None:
        self._log = event_log
        self._sid = stream_id
        self._owner = owner
        self._cfg = cfg
        self._publish = publish
        self._local_seen_ms = local_seen_ms
        self._stop_callbacks: list[Callable[[], Awaitable[None]]] = []
        self._buffer: list[Event] = []
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        self.next_id = next_id
        self.logged_id = next_id - 1  # the last event known to be in the log
        self.stop_reason: StopReason | None = None
        self._closing = False
        self._task = asyncio.create_task(self._run(), name=f"writer-{stream_id[:8]}")

    def emit(self, make: Callable[[int], Event]) -> Event:
        event = make(self.next_id)
        self.next_id += 1
        self._buffer.append(event)
        if len(self._buffer) == 1 or len(self._buffer) >= self._cfg.flush_max_events:
            self._wake.set()
        return event

    async def _run(self) -> None:
        while self.stop_reason is None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._cfg.renew_interval_s):
                    await self._wake.wait()
            self._wake.clear()
            if self._closing:
                return
            if 0 < len(self._buffer) < self._cfg.flush_max_events:
                await asyncio.sleep(self._cfg.flush_interval_ms / 1000)
            await self.flush()

    async def flush(self) -> None:
        async with self._lock:
            if self.stop_reason in GONE:
                return
            batch, self._buffer = self._buffer, []
            result = None
            superseded = False
            for attempt in range(self._cfg.redis_retries + 1):
                try:
                    result = await self._log.append(
                        self._sid, self._owner, batch, self._cfg.lease_ms, self.logged_id
                    )
                    break
                except RedisError as exc:
                    if "ID specified" in str(exc):  # another writer appended these ids first
                        superseded = True
                        break
                    logger.warning(
                        "stream %s: append failed (%s), attempt %d", self._sid, exc, attempt
                    )
                    await asyncio.sleep(0.2 * (attempt + 1))
            if result is not None and result.owned and batch:
                self.logged_id = batch[-1].id
                self._publish(batch)
        if superseded:
            await self._stop("lost")
        elif result is None:
            await self._stop("log_unavailable")
        elif result.log_lost:
            await self._stop("log_lost")
        elif not result.owned:
            await self._stop("lost")
        elif result.cancel:
            await self._stop("cancelled")
        elif self._abandoned(result.reader_seen_ms):
            await self._stop("abandoned")

    def _abandoned(self, seen_ms: int) -> bool:
        """No reader anywhere (this process's, or another's heartbeat in the log) for a while."""
        limit = self._cfg.abandon_after_s
        seen = max(seen_ms, self._local_seen_ms())
        return limit > 0 and seen > 0 and now_ms() - seen > limit * 1000

    def on_stop(self, callback: Callable[[], Awaitable[None]]) -> None:
        """Run ``callback`` when the stream must stop (cancel, abandon, lost lease or log)."""
        self._stop_callbacks.append(callback)

    async def run_stop_callbacks(self) -> None:
        for callback in self._stop_callbacks:
            try:
                await callback()
            except Exception:
                logger.exception("stream %s: a stop callback failed", self._sid)

    async def _stop(self, reason: StopReason) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
            logger.info("stream %s: stopping (%s)", self._sid, reason)
            await self.run_stop_callbacks()

    async def close(self) -> None:
        """Stop the background flusher after any flush in flight (never cut one in half: its
        events may or may not be in the log). The caller then writes the rest with finish()."""
        self._closing = True
        self._wake.set()
        await self._task

    def take_buffer(self) -> list[Event]:
        batch, self._buffer = self._buffer, []
        return batch
