"""Takeover: continue a running stream whose producing process died.

A producer is known dead when its process's presence connection to Redis is gone (the kernel
closes it when the process dies: no wait), or when its lease expires (a hung process). A reader
that finds such a stream (``follow``), a cancel request, or the sweeper that every process runs,
takes the lease and hands the stream to its kind's continuation: the kind rebuilds the engine
input from the saved plan plus every generated token id in the log and goes on with the same
sampling and the rest of the token budget, so the client sees one stream. Taking the lease is
one atomic step that names the dead holder, and appends check the lease, so a producer wrongly
thought dead can never write again once replaced.
"""

from __future__ import annotations

import asyncio
import logging

from redis.exceptions import RedisError

from rag_stream.errors import StartInterrupted
from rag_stream.schemas.events import Done, Event, is_terminal
from rag_stream.streaming.event_log import EventLog, StreamMeta
from rag_stream.streaming.kinds import KindRegistry, Producer, StreamKind
from rag_stream.streaming.producer import Producers

logger = logging.getLogger(__name__)


class Takeover:
    def __init__(self, producers: Producers, kinds: KindRegistry, sweep_interval_s: float) -> None:
        self._producers = producers
        self._kinds = kinds
        self._log: EventLog = producers.event_log
        self._sweep_interval_s = sweep_interval_s
        self._sweeper: asyncio.Task[None] | None = None
        self._closing = False

    async def producer_gone(self, meta: StreamMeta) -> bool:
        """Whether the running stream ``meta`` has no live producer."""
        owner = meta.lease_owner
        if owner is None:
            return True
        return owner != self._producers.owner and not await self._log.owner_alive(owner)

    async def take_over(self, sid: str) -> bool:
        """Continue ``sid`` if its producer died. True if this process now produces it."""
        producers = self._producers
        if producers.owns(sid):
            return True
        meta = await self._log.meta(sid)
        if meta is None:
            # listed as running with no meta (it expired): every sweeper would look it up
            # every few seconds for ever, and the list would never empty
            await self._log.forget(sid)
            return False
        if meta.status != "running" or not await self.producer_gone(meta):
            return False
        kind = self._kinds.get(meta.kind)
        if kind is None or not await kind.can_continue(meta):
            return False  # leave it to a process that runs this kind (and model)
        taken = await self._log.acquire(
            sid, producers.owner, producers.cfg.lease_ms, stale_owner=meta.lease_owner
        )
        if not taken:
            return False
        events = await self._read_all(sid)
        if not events:
            return False
        if is_terminal(events[-1]):  # it ended but died before marking it: just mark it
            last = events[-1]
            status = "done" if isinstance(last, Done) else "error"
            await producers.finish(sid, [], status, last, after=last.id)
            return False
        logger.info(
            "stream %s: taking over after event %d from %s", sid, events[-1].id, meta.lease_owner
        )
        producers.spawn(
            sid,
            meta.new,
            events,
            lambda: _continuation(kind, meta, events),
            cancelled=meta.cancel,
            taken_over=True,
        )
        return True

    async def _read_all(self, sid: str) -> list[Event]:
        events: list[Event] = []
        while True:
            batch = await self._log.read(sid, events[-1].id if events else -1, None)
            if not batch:
                return events
            events.extend(batch)

    # -- the sweeper: streams nobody reads still end ---------------------------------------

    def start_sweeper(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep(), name="stream-sweeper")

    async def close(self) -> None:
        # the flag as well as the cancel: a cancel that lands inside a Redis call can come out
        # of redis-py as a connection error, which the loop below survives (it hung a CI run)
        self._closing = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)

    async def _sweep(self) -> None:
        while not self._closing:
            try:
                await self._producers.announce()  # (re)publish this process's presence
                await self._producers.settle_unreachable()
                for sid in await self._log.running():
                    if not self._producers.owns(sid):
                        await self.take_over(sid)
            except RedisError as exc:
                logger.warning("sweeper: event log unavailable: %s", exc)
            except Exception:
                logger.exception("sweeper failed")
            await asyncio.sleep(self._sweep_interval_s)


def _continuation(kind: StreamKind, meta: StreamMeta, events: list[Event]) -> Producer:
    if meta.plan is None:
        raise StartInterrupted(
            "the stream's process died before it saved what a takeover needs; ask again"
        )
    return kind.continuation(meta.plan, events)
