"""Takeover: continue a running stream whose producing process died.

A stream's lease expires when its producer stops renewing it. A reader that finds such a stream
(``follow``), a cancel request, or the sweeper that every process runs, takes the lease and hands
the stream to its kind's continuation: the kind rebuilds the engine input from the saved plan
plus every generated token id in the log and goes on with the same sampling and the rest of the
token budget, so the client sees one stream.
"""

from __future__ import annotations

import asyncio
import logging

from redis.exceptions import RedisError

from rag_stream.errors import RagStreamError
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

    async def take_over(self, sid: str) -> bool:
        """Continue ``sid`` if its owner died. True if this process now produces it."""
        producers = self._producers
        if producers.owns(sid):
            return True
        meta = await self._log.meta(sid)
        if meta is None or meta.status != "running" or meta.lease_owner is not None:
            return False
        kind = self._kinds.get(meta.kind)
        if kind is None or not await kind.can_continue(meta):
            return False  # leave it to a process that runs this kind (and model)
        if not await self._log.acquire(sid, producers.owner, producers.cfg.lease_ms):
            return False
        events = await self._read_all(sid)
        if not events:
            return False
        if is_terminal(events[-1]):  # it ended but died before marking it: just mark it
            last = events[-1]
            status = "done" if isinstance(last, Done) else "error"
            await producers.finish(sid, [], status, last)
            return False
        logger.info("stream %s: taking over after event %d", sid, events[-1].id)
        producers.spawn(
            sid,
            events[-1].id + 1,
            lambda: _continuation(kind, meta, events),
            cancelled=meta.cancel,
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
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self._sweep_interval_s)
            try:
                for sid in await self._log.running():
                    if not self._producers.owns(sid):
                        await self.take_over(sid)
            except RedisError as exc:
                logger.warning("sweeper: event log unavailable: %s", exc)
            except Exception:
                logger.exception("sweeper failed")


def _continuation(kind: StreamKind, meta: StreamMeta, events: list[Event]) -> Producer:
    if meta.plan is None:
        raise RagStreamError("the stream's process died before generation started; retry")
    return kind.continuation(meta.plan, events)
