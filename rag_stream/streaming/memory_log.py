"""An in-process event log with the RedisEventLog contract, for ``streaming.checkpoint: false``.

It exists to measure what checkpointing to Redis costs (benchmarks) and for protocol unit tests:
streams then live only in this process, so they cannot be resumed elsewhere or survive a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rag_stream.schemas.events import Event
from rag_stream.streaming.event_log import (
    READ_PAGE,
    Append,
    AppendResult,
    FinishResult,
    NewStream,
    StreamMeta,
    now_ms,
)


@dataclass
class _Stream:
    meta: dict[str, str]
    events: list[Event] = field(default_factory=list)
    owner: str | None = None
    lease_until: float = 0.0

    def holder(self) -> str | None:
        return self.owner if self.lease_until > time.monotonic() else None

    def add(self, events: Sequence[Event]) -> None:
        for event in events:
            if self.events and event.id <= self.events[-1].id:
                raise ValueError("ID specified is not greater than the last one")
            self.events.append(event)

    def tip(self) -> int:
        return self.events[-1].id if self.events else -1


class MemoryEventLog:
    def __init__(self) -> None:
        self._streams: dict[str, _Stream] = {}
        self._retired: set[str] = set()
        self._aliases: dict[tuple[str, str], str] = {}
        self._changed = asyncio.Event()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def create(
        self,
        stream_id: str,
        first: Event,
        new: NewStream,
        owner: str,
        lease_ms: int,
        plan_json: str | None = None,
    ) -> None:
        stream = _Stream({**new.fields(), "status": "running", "seen": str(now_ms())})
        if plan_json is not None:
            stream.meta["plan"] = plan_json
        stream.owner, stream.lease_until = owner, time.monotonic() + lease_ms / 1000
        stream.add([first])
        self._streams[stream_id] = stream
        for alias in new.aliases:
            self._aliases[new.tenant, alias] = stream_id
        self._notify()

    async def named(self, tenant: str, alias: str) -> str | None:
        return self._aliases.get((tenant, alias))

    async def append(self, batches: Sequence[Append]) -> list[AppendResult]:
        return [self._append(batch) for batch in batches]

    def _append(self, batch: Append) -> AppendResult:
        s = self._streams.get(batch.stream_id)
        if s is not None and s.holder() not in (None, batch.owner):
            return AppendResult(False, False, 0)
        events, after = batch.events, batch.after
        last = events[-1].id if events else after
        if s is None or s.tip() not in (after, last):
            return AppendResult(False, False, 0, log_lost=True)
        s.owner, s.lease_until = batch.owner, time.monotonic() + batch.lease_ms / 1000
        if s.tip() == after:
            s.add(events)
            self._notify()
        return AppendResult(True, s.meta.get("cancel") == "1", int(s.meta.get("seen", "0")))

    async def read(
        self, stream_id: str, after: int, block_ms: int | None, count: int = READ_PAGE
    ) -> list[Event]:
        return (await self._read({stream_id: after}, block_ms, count)).get(stream_id, [])

    def _fresh(self, cursors: Mapping[str, int], count: int) -> dict[str, list[Event]]:
        found = {}
        for sid, after in cursors.items():
            s = self._streams.get(sid)
            if s is not None:
                s.meta["seen"] = str(now_ms())
                # (event n is at index n: a slice from the cursor, as Redis reads from an id)
                if page := s.events[after + 1 : after + 1 + count]:
                    found[sid] = page
        return found

    async def read_many(
        self, cursors: Mapping[str, int], block_ms: int | None
    ) -> dict[str, list[Event]]:
        return await self._read(cursors, block_ms, READ_PAGE)

    async def _read(
        self, cursors: Mapping[str, int], block_ms: int | None, count: int
    ) -> dict[str, list[Event]]:
        found = self._fresh(cursors, count)
        if found or block_ms is None:
            return found
        waiter = self._changed
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(block_ms / 1000):
                await waiter.wait()
        return self._fresh(cursors, count)

    async def meta(self, stream_id: str) -> StreamMeta | None:
        s = self._streams.get(stream_id)
        if s is None:
            return None
        return StreamMeta.from_fields(stream_id, s.meta, s.holder(), s.tip())

    async def set_plan(self, stream_id: str, plan_json: str) -> None:
        self._streams[stream_id].meta["plan"] = plan_json

    async def finish(
        self,
        stream_id: str,
        owner: str,
        events: Sequence[Event],
        status: str,
        finish_reason: str,
        retention_s: int,
        after: int,
    ) -> FinishResult:
        s = self._streams.get(stream_id)
        if s is not None and s.holder() not in (None, owner):
            return "lease_lost"
        last = events[-1].id if events else after
        if s is None or s.tip() not in (after, last):
            return "log_lost"
        if s.tip() == after:
            s.add(events)
        s.meta.update(status=status, finish_reason=finish_reason)
        s.owner, s.lease_until = None, 0.0
        asyncio.get_running_loop().call_later(retention_s, self._streams.pop, stream_id, None)
        self._notify()
        return "done"

    async def mark_lost(
        self, stream_id: str, owner: str, new: NewStream, error: Event, retention_s: int
    ) -> None:
        s = self._streams.setdefault(stream_id, _Stream({}))
        if s.holder() not in (None, owner):
            return
        s.meta.update(new.fields(), status="error", finish_reason="log_lost")
        if s.tip() < error.id:
            s.add([error])
        s.owner, s.lease_until = None, 0.0
        self._notify()

    async def acquire(
        self, stream_id: str, owner: str, lease_ms: int, stale_owner: str | None = None
    ) -> bool:
        s = self._streams.get(stream_id)
        if s is None or s.meta["status"] != "running":
            return False
        holder = s.holder()
        if holder is not None and (stale_owner is None or holder != stale_owner):
            return False
        s.owner, s.lease_until = owner, time.monotonic() + lease_ms / 1000
        return True

    async def request_cancel(self, stream_id: str) -> None:
        self._streams[stream_id].meta["cancel"] = "1"

    async def running(self) -> list[str]:
        return [sid for sid, s in self._streams.items() if s.meta.get("status") == "running"]

    async def forget(self, stream_id: str) -> None:
        return None  # ``running`` lists only streams that exist here

    async def announce(self, owner: str) -> None:
        self._retired.discard(owner)

    async def retire(self, owner: str, linger_ms: int) -> None:
        self._retired.add(owner)

    async def owner_alive(self, owner: str) -> bool:
        return owner not in self._retired
