"""An in-process event log with the RedisEventLog contract, for ``streaming.checkpoint: false``.

It exists to measure what checkpointing to Redis costs (benchmarks) and for protocol unit tests:
streams then live only in this process, so they cannot be resumed elsewhere or survive a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from rag_stream.schemas.events import Event
from rag_stream.streaming.event_log import AppendResult, NewStream, StreamMeta, now_ms


@dataclass
class _Stream:
    meta: dict[str, str]
    events: list[Event] = field(default_factory=list)
    owner: str | None = None
    lease_until: float = 0.0
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def holder(self) -> str | None:
        return self.owner if self.lease_until > time.monotonic() else None

    def add(self, events: Sequence[Event]) -> None:
        for event in events:
            if self.events and event.id <= self.events[-1].id:
                raise ValueError("ID specified is not greater than the last one")
            self.events.append(event)
        self.changed.set()
        self.changed = asyncio.Event()


class MemoryEventLog:
    def __init__(self) -> None:
        self._streams: dict[str, _Stream] = {}

    async def create(
        self, stream_id: str, first: Event, new: NewStream, owner: str, lease_ms: int
    ) -> None:
        stream = _Stream({**new.fields(), "status": "running", "seen": str(now_ms())})
        stream.owner, stream.lease_until = owner, time.monotonic() + lease_ms / 1000
        stream.add([first])
        self._streams[stream_id] = stream

    async def append(
        self, stream_id: str, owner: str, events: Sequence[Event], lease_ms: int
    ) -> AppendResult:
        s = self._streams[stream_id]
        holder = s.holder()
        if holder not in (None, owner):
            return AppendResult(False, False, 0)
        s.owner, s.lease_until = owner, time.monotonic() + lease_ms / 1000
        s.add(events)
        return AppendResult(True, s.meta.get("cancel") == "1", int(s.meta.get("seen", "0")))

    async def read(self, stream_id: str, after: int, block_ms: int | None) -> list[Event]:
        s = self._streams[stream_id]
        s.meta["seen"] = str(now_ms())
        fresh = [e for e in s.events[after + 1 :]]
        if fresh or block_ms is None:
            return fresh
        waiter = s.changed
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(waiter.wait(), timeout=block_ms / 1000)
        return [e for e in s.events[after + 1 :]]

    async def meta(self, stream_id: str) -> StreamMeta | None:
        s = self._streams.get(stream_id)
        if s is None:
            return None
        return StreamMeta.from_fields(
            stream_id, s.meta, s.holder(), s.events[-1].id if s.events else -1
        )

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
    ) -> bool:
        s = self._streams[stream_id]
        if s.holder() not in (None, owner):
            return False
        s.add(events)
        s.meta.update(status=status, finish_reason=finish_reason)
        s.owner, s.lease_until = None, 0.0
        asyncio.get_running_loop().call_later(retention_s, self._streams.pop, stream_id, None)
        return True

    async def acquire(self, stream_id: str, owner: str, lease_ms: int) -> bool:
        s = self._streams.get(stream_id)
        if s is None or s.meta["status"] != "running" or s.holder() is not None:
            return False
        s.owner, s.lease_until = owner, time.monotonic() + lease_ms / 1000
        return True

    async def request_cancel(self, stream_id: str) -> None:
        self._streams[stream_id].meta["cancel"] = "1"

    async def touch_reader(self, stream_id: str) -> None:
        self._streams[stream_id].meta["seen"] = str(now_ms())

    async def running(self) -> list[str]:
        return [sid for sid, s in self._streams.items() if s.meta["status"] == "running"]
