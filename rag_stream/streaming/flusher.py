"""One flush loop per process: the new events of every stream it writes go to the log together.

A writer with buffered events asks for a flush (``request``). The flusher waits
``flush_interval_ms`` after the first request (not at all once a writer holds
``flush_max_events``), then sends the batch of every writer that asked, plus an empty batch for
each writer whose lease is due for renewal, in one ``EventLog.append`` call, and hands each
writer its result. Streams decoding in step (one engine step gives a token to each) then cost one
Redis round trip per step, not one per stream per token.

Flushes run one after another, so a writer never has two batches in flight and its events land
in order. A Redis error fails the whole call; it is retried (a batch that landed before the
error is recognised by the log and not written twice), then every writer in it gives up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from operator import attrgetter
from typing import Protocol

from redis.exceptions import RedisError

from rag_stream.settings import StreamingSettings
from rag_stream.streaming.event_log import Append, AppendResult, EventLog
from rag_stream.streaming.redis_conn import retry_redis

logger = logging.getLogger(__name__)
_RENEW_DUE = attrgetter("renew_due")


class Flushable(Protocol):
    """What the flusher needs of a writer (``writer.StreamWriter``)."""

    renew_due: float  # time.monotonic() when its lease needs renewing

    def begin_flush(self) -> Append | None:
        """Take the buffered events as a batch (None: nothing may be written any more)."""
        ...

    def end_flush(self, result: AppendResult | None) -> None:
        """The log's answer to the batch (None: the log was unavailable)."""
        ...


class Flusher:
    def __init__(self, event_log: EventLog, cfg: StreamingSettings) -> None:
        self._log = event_log
        self._cfg = cfg
        self._writers: set[Flushable] = set()
        self._requested: dict[Flushable, None] = {}  # insertion-ordered set
        self._urgent = False
        # what the loop waits on while nothing is requested (a future, not an asyncio.Event:
        # every engine step sets it, and the Event's set and wait are Python, the future's C)
        self._idle: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None

    def add(self, writer: Flushable) -> None:
        self._writers.add(writer)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="stream-flusher")

    def remove(self, writer: Flushable) -> None:
        self._writers.discard(writer)
        self._requested.pop(writer, None)

    def request(self, writer: Flushable, *, urgent: bool = False) -> None:
        if writer in self._writers:
            self._requested[writer] = None
            self._urgent = self._urgent or urgent
            idle, self._idle = self._idle, None
            if idle is not None:
                _wake(idle)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self._writers or self._requested:
            if not self._requested:
                # until a request, or the first lease due for renewal
                renew_at = min(map(_RENEW_DUE, self._writers))
                idle = self._idle = loop.create_future()
                timer = loop.call_later(max(0.0, renew_at - time.monotonic()), _wake, idle)
                try:
                    await idle
                finally:
                    timer.cancel()
                    self._idle = None
            if self._requested and not self._urgent and self._cfg.flush_interval_ms > 0:
                await asyncio.sleep(self._cfg.flush_interval_ms / 1000)
            self._urgent = False
            now = time.monotonic()
            due = list(self._requested)
            due += [w for w in self._writers if w.renew_due <= now and w not in self._requested]
            self._requested.clear()
            await self._flush(due)

    async def _flush(self, writers: list[Flushable]) -> None:
        pairs: list[tuple[Flushable, Append]] = []
        for writer in writers:
            batch = writer.begin_flush()
            if batch is None:  # gone (lease or log lost): nothing to write or renew any more
                self.remove(writer)
            else:
                pairs.append((writer, batch))
        if not pairs:
            return
        results: list[AppendResult | None] = [None] * len(pairs)
        try:
            results = await self._send([b for _, b in pairs])
        except Exception:
            logger.exception("append of %d streams failed unexpectedly", len(pairs))
        finally:  # every writer hears back, even when this process is shutting down
            for (writer, _), result in zip(pairs, results, strict=True):
                writer.end_flush(result)

    async def _send(self, batches: list[Append]) -> list[AppendResult | None]:
        try:
            results = await retry_redis(
                lambda: self._log.append(batches),
                self._cfg.redis_retries,
                f"append of {len(batches)} streams",
            )
        except RedisError:
            return [None] * len(batches)
        return [*results]

    async def close(self) -> None:
        self._writers.clear()
        self._requested.clear()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def _wake(idle: asyncio.Future[None]) -> None:
    if not idle.done():
        idle.set_result(None)
