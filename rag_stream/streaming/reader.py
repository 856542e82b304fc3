"""Readers: follow a stream from a cursor to its terminal event, from any process.

Live events come from this process's feed of the stream (``feeds.py``): from memory when this
process produces it, else from the one shared tail of the log. A reader whose cursor is older
than the feed's window catches up from the log first. While no event comes from a stream that
another process produces, one reader per feed checks on it every ``check_ms`` and takes it over
if its producer died. Readers of a stream this process produces wait for it: through a short
Redis outage they see nothing until the producer writes again, ends the stream, or gives up.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator

from redis.exceptions import RedisError

from rag_stream.schemas.events import TERMINAL_TYPES, Event, TransientError
from rag_stream.streaming.event_log import READ_PAGE, EventLog, StreamMeta
from rag_stream.streaming.feeds import Feed, Feeds
from rag_stream.streaming.takeover import Takeover

# A reader's first read from the log takes this many events, later ones READ_PAGE: the first
# event goes out once these are read, so the time to it does not follow what is left to replay.
FIRST_PAGE = 16


def transient_error(code: str, message: str) -> TransientError:
    """An error the reader saw itself (not in the log): sent without an SSE id (see to_sse)."""
    return TransientError(id=0, code=code, message=message)


def log_unavailable(exc: RedisError) -> TransientError:
    return transient_error("event_log_unavailable", f"event log unavailable: {exc}")


class Readers:
    def __init__(
        self, event_log: EventLog, feeds: Feeds, takeover: Takeover, check_ms: int
    ) -> None:
        self._log = event_log
        self._feeds = feeds
        self._takeover = takeover
        self._check_s = check_ms / 1000

    async def follow(self, sid: str, after: int) -> AsyncIterator[Event]:
        """Every event after ``after``, then live events until the terminal one."""
        async for batch in self.follow_batches(sid, after):
            for event in batch:
                yield event

    async def follow_batches(self, sid: str, after: int) -> AsyncGenerator[list[Event], None]:
        """``follow``, yielding the events that are ready together as one list."""
        feed, filling = self._feeds.attach(sid, after)
        cursor = after
        from_log = filling  # a new feed: this reader fills it from the log (feeds.py)
        page = FIRST_PAGE
        try:
            while True:
                changes = feed.changes
                try:
                    events = None if from_log else feed.after(cursor)
                    if events is None:  # from the log: older than the feed holds, or a new feed
                        count, page = page, READ_PAGE
                        events = await self._log.read(sid, cursor, None, count)
                        from_log = len(events) == count  # a whole page: read on at once
                        if filling:
                            feed.push(events)  # for its other readers, and the tail's cursor
                            if not from_log:
                                filling = False
                                self._feeds.caught_up(feed)
                except RedisError as exc:
                    yield [log_unavailable(exc)]
                    return
                if events:
                    # a terminal event is the log's last: it ends any batch it is in
                    yield events
                    last = events[-1]
                    if last.type in TERMINAL_TYPES:
                        return
                    cursor = last.id
                    if from_log or not feed.local or feed.last_id != cursor:
                        continue
                    # live, and nothing newer here yet (the common case: a token was just
                    # sent): wait for the next batch now, rather than ask the feed first
                    await feed.next_change()
                    continue
                if feed.local:
                    # this process produces it: its next batch, its end, or its giving up
                    # (``Feeds.stop_producing``) all wake the feed; no timer needed
                    if feed.changes == changes:
                        await feed.next_change()
                    continue
                # (asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._check_s):
                        await feed.changed_since(changes)
                        continue
                if time.monotonic() - feed.checked_at < self._check_s:
                    continue  # another reader of this feed has just checked
                feed.checked_at = time.monotonic()
                try:
                    verdict = await self._check(feed, cursor)
                except RedisError as exc:
                    yield [log_unavailable(exc)]
                    return
                if isinstance(verdict, TransientError):
                    yield [verdict]
                    return
                if verdict == "ended":
                    return
                from_log = verdict == "read_log"
        finally:
            if filling:
                self._feeds.caught_up(feed)
            self._feeds.detach(feed)

    async def _check(self, feed: Feed, cursor: int) -> str | TransientError:
        """After a quiet spell: is the stream over, or its producer dead (then take it over)?"""
        meta = await self._log.meta(feed.stream_id)
        if meta is None:
            return transient_error("not_found", "stream expired")
        if meta.status != "running":
            return "ended" if cursor >= meta.last_event_id else "read_log"
        if await self._takeover.producer_gone(meta):
            await self._takeover.take_over(feed.stream_id)
        return "wait"

    async def wait_finished(self, sid: str, timeout_s: float) -> StreamMeta | None:
        deadline = time.monotonic() + timeout_s
        while True:
            meta = await self._log.meta(sid)
            if meta is None or meta.status != "running" or time.monotonic() > deadline:
                return meta
            await asyncio.sleep(0.05)
