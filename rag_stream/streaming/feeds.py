"""Feeds: one in-memory copy of each stream's recent events per process, shared by its readers.

Readers never hold a Redis connection of their own while they wait:

- In the process that produces a stream, the writer hands each batch to the stream's feed right
  after Redis acknowledged it (``publish``), so the promise holds (every event is in the log
  before any client sees it) and live events never make a round trip back from Redis.
- For streams produced elsewhere, one task per process (``_tail``) follows every such stream
  with a single blocking ``XREAD`` over all of them, and fills their feeds.

A feed keeps the last ``window`` events; a reader whose cursor is older catches up from the log
with non-blocking reads, then continues from the feed. Any number of readers of one stream cost
one Redis read, and the Redis connections of a process no longer grow with its readers.

A new feed (a resume in a process that does not hold the stream) is filled by the reader that
made it, from its cursor, with non-blocking reads whose first is small: its first event goes out
after a few events are read, whatever the stream's length, and without waiting for the tail's
blocking read of other streams to return. The tail follows the feed once that reader reached
the log's end (``caught_up``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from redis.exceptions import RedisError

from rag_stream.schemas.events import TERMINAL_TYPES, Event
from rag_stream.streaming.event_log import EventLog, now_ms

logger = logging.getLogger(__name__)


@dataclass
class Feed:
    stream_id: str
    local: bool  # produced by this process (filled by its writer) or tailed from Redis
    window: int
    events: list[Event] = field(default_factory=list)
    last_id: int = -1  # the newest event id this feed has seen (or the tail's cursor)
    readers: int = 0
    reader_seen_ms: int = 0  # when a reader of this process last left (now, while one reads)
    checked_at: float = 0.0  # when a reader last checked on the producer (one check per feed)
    ended: bool = False
    catching_up: bool = False  # its first reader is filling it from the log: no tail read yet
    changes: int = 0  # how many times it changed (``wake``): a reader's note of where it looked
    _waiting: list[asyncio.Future[None]] = field(default_factory=list)

    def push(self, events: Sequence[Event]) -> None:
        if not events:
            return
        fresh = events
        if events[0].id != self.last_id + 1:  # (a batch that follows on is taken as it is)
            fresh = [e for e in events if e.id > self.last_id]
            if not fresh:
                return
            if fresh[0].id != self.last_id + 1:
                self.events.clear()  # never keep a window with a hole: readers read the log
        self.events.extend(fresh)
        if len(self.events) > self.window:
            del self.events[: len(self.events) - self.window]
        last = fresh[-1]
        self.last_id = last.id
        if last.type in TERMINAL_TYPES:
            self.ended = True
        self.wake()

    def wake(self) -> None:
        """Wake every reader waiting on this feed."""
        self.changes += 1
        waiting, self._waiting = self._waiting, []
        for waiter in waiting:
            if not waiter.done():
                waiter.set_result(None)

    def next_change(self) -> asyncio.Future[None]:
        """A future done at the feed's next change: what a reader of a stream this process
        produces awaits for every batch (a future, where ``changed_since``'s coroutine would be
        one more frame made and resumed a token). A reader that leaves meanwhile cancels it;
        the next wake drops it."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        return waiter

    async def changed_since(self, changes: int) -> None:
        """Return once the feed changed after a reader noted ``changes`` (at once if it has)."""
        if self.changes != changes:
            return
        waiter = self.next_change()
        try:
            await waiter
        finally:
            if waiter.cancelled():  # (its reader gave up waiting: a timeout, or it left)
                with contextlib.suppress(ValueError):  # (a wake took the list already)
                    self._waiting.remove(waiter)

    def after(self, cursor: int) -> list[Event] | None:
        """Events after ``cursor`` held here, or None if the cursor is older than the window."""
        if cursor >= self.last_id:
            return []
        if not self.events or cursor + 1 < self.events[0].id:
            return None
        return self.events[cursor + 1 - self.events[0].id :]


class Feeds:
    def __init__(self, event_log: EventLog, block_ms: int, window: int = 2048) -> None:
        self._log = event_log
        self._block_ms = block_ms
        self._window = window
        self._feeds: dict[str, Feed] = {}
        self._tail_task: asyncio.Task[None] | None = None
        self._tail_wake = asyncio.Event()
        self._closed = False

    # -- the producing side ----------------------------------------------------------------

    def produce(self, sid: str, first: Sequence[Event] = ()) -> None:
        """This process now produces ``sid``: its writer will publish every batch."""
        feed = self._feeds.get(sid)
        if feed is None:
            feed = self._feeds[sid] = Feed(sid, local=True, window=self._window)
        feed.local = True
        feed.push(first)

    def publish(self, sid: str, events: Sequence[Event]) -> None:
        """Events Redis has acknowledged; readers of this process see them now."""
        feed = self._feeds.get(sid)
        if feed is not None:
            feed.push(events)
            if feed.readers <= 0:
                self._drop_if_unused(feed)

    def stop_producing(self, sid: str) -> None:
        """The producer stopped without an end (lost lease, shutdown): tail it from Redis."""
        feed = self._feeds.get(sid)
        if feed is not None and not feed.ended:
            feed.local = False
            feed.wake()  # its readers now follow the log (and check on the new producer)
            self._tail_wake.set()
        if feed is not None:
            self._drop_if_unused(feed)

    def local_seen_ms(self, sid: str) -> int:
        """When a reader of this process last followed ``sid`` (now while one does; 0: never)."""
        feed = self._feeds.get(sid)
        if feed is None:
            return 0
        return now_ms() if feed.readers > 0 else feed.reader_seen_ms

    # -- the reading side ------------------------------------------------------------------

    def attach(self, sid: str, cursor: int) -> tuple[Feed, bool]:
        """The stream's feed, and whether this reader fills it from the log first (it made the
        feed, at its cursor); then it calls ``caught_up``."""
        feed = self._feeds.get(sid)
        fill = feed is None
        if feed is None:
            feed = Feed(sid, local=False, window=self._window, last_id=cursor, catching_up=True)
            self._feeds[sid] = feed
        feed.readers += 1
        if not feed.local and not feed.catching_up:
            self._ensure_tail()
        return feed, fill

    def caught_up(self, feed: Feed) -> None:
        """The reader filling a new feed reached the log's end (or left): the tail takes over."""
        if feed.catching_up:
            feed.catching_up = False
            if not feed.local and not feed.ended:
                self._ensure_tail()

    def detach(self, feed: Feed) -> None:
        feed.readers -= 1
        feed.reader_seen_ms = now_ms()
        self._drop_if_unused(feed)

    def _drop_if_unused(self, feed: Feed) -> None:
        unused = feed.readers <= 0 and (feed.ended or not feed.local)
        if unused and self._feeds.get(feed.stream_id) is feed:
            del self._feeds[feed.stream_id]

    # -- one blocking read for every stream produced elsewhere ----------------------------------

    def _ensure_tail(self) -> None:
        self._tail_wake.set()
        if self._tail_task is None or self._tail_task.done():
            self._tail_task = asyncio.create_task(self._tail(), name="stream-tail")

    async def _tail(self) -> None:
        while not self._closed:
            remote = {
                s: f
                for s, f in self._feeds.items()
                if not f.local and not f.ended and not f.catching_up
            }
            if not remote:
                self._tail_wake.clear()
                await self._tail_wake.wait()
                continue
            try:
                found = await self._log.read_many(
                    {s: f.last_id for s, f in remote.items()}, self._block_ms
                )
            except RedisError as exc:
                logger.warning("stream tail: event log unavailable: %s", exc)
                for feed in remote.values():
                    feed.wake()  # readers notice and check the log themselves
                await asyncio.sleep(0.2)
                continue
            for sid, events in found.items():
                tailed = self._feeds.get(sid)
                if tailed is not None and not tailed.local:
                    tailed.push(events)

    async def close(self) -> None:
        self._closed = True
        self._tail_wake.set()
        if self._tail_task is not None:
            self._tail_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._tail_task
