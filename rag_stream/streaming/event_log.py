"""The per-stream event log in Redis.

Keys, under a prefix (``rs`` by default), for stream ``S``:

- ``{p}:s:S:log``    Redis Stream; event ``n`` is entry ``(n+1)-0`` with one field ``e`` holding
  the event JSON. Explicit, increasing entry ids mean a second writer can never insert an event
  twice or out of order: Redis refuses an id that is not greater than the last.
- ``{p}:s:S:meta``   hash: status, model, created, plan (JSON), cancel flag, reader heartbeat.
- ``{p}:s:S:lease``  the owning process's token, with a short expiry renewed while it generates.
- ``{p}:active``     sorted set of running stream ids (the sweeper's work list).

Appends are Lua scripts that check the lease first, so only the lease holder writes, and that
return the cancel flag and reader heartbeat, so the writer learns both with no extra round trip.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from redis.asyncio import Redis
from redis.exceptions import RedisError

from rag_stream.errors import EventLogUnavailable
from rag_stream.schemas.events import EVENT_ADAPTER, Event


@dataclass(frozen=True)
class AppendResult:
    owned: bool  # False: another process holds the lease now; stop writing
    cancel: bool
    reader_seen_ms: int


StreamStatus = Literal["running", "done", "error"]


@dataclass(frozen=True)
class StreamMeta:
    """What the log knows about a stream besides its events."""

    stream_id: str
    status: StreamStatus
    model: str
    kind: str  # the name of the StreamKind that produces it
    created: float
    plan: str | None  # the kind's plan as JSON; the kind validates it when it reads it back
    finish_reason: str | None
    cancel: bool
    lease_owner: str | None
    last_event_id: int

    @classmethod
    def from_fields(
        cls,
        stream_id: str,
        fields: Mapping[str, str],
        lease_owner: str | None,
        last_event_id: int,
    ) -> StreamMeta:
        """Build from the string fields of the meta hash (the same in every log)."""
        status = fields.get("status", "running")
        return cls(
            stream_id=stream_id,
            status=status if status in ("done", "error") else "running",  # type: ignore[arg-type]
            model=fields.get("model", ""),
            kind=fields.get("kind", ""),
            created=float(fields.get("created", "0")),
            plan=fields.get("plan"),
            finish_reason=fields.get("finish_reason"),
            cancel=fields.get("cancel") == "1",
            lease_owner=lease_owner,
            last_event_id=last_event_id,
        )


@dataclass(frozen=True)
class NewStream:
    """The fields a stream is created with (the first event carries the same model/created)."""

    model: str
    kind: str
    created: float

    def fields(self) -> dict[str, str]:
        return {"model": self.model, "kind": self.kind, "created": repr(self.created)}


class EventLog(Protocol):
    async def create(
        self, stream_id: str, first: Event, new: NewStream, owner: str, lease_ms: int
    ) -> None: ...

    async def append(
        self, stream_id: str, owner: str, events: Sequence[Event], lease_ms: int
    ) -> AppendResult: ...

    async def read(self, stream_id: str, after: int, block_ms: int | None) -> list[Event]:
        """Events after id ``after``; waits up to block_ms for new ones (None: no wait)."""
        ...

    async def meta(self, stream_id: str) -> StreamMeta | None: ...

    async def set_plan(self, stream_id: str, plan_json: str) -> None: ...

    async def finish(
        self,
        stream_id: str,
        owner: str,
        events: Sequence[Event],
        status: str,
        finish_reason: str,
        retention_s: int,
    ) -> bool: ...

    async def acquire(self, stream_id: str, owner: str, lease_ms: int) -> bool: ...

    async def request_cancel(self, stream_id: str) -> None: ...

    async def touch_reader(self, stream_id: str) -> None: ...

    async def running(self) -> list[str]: ...


def now_ms() -> int:
    return int(time.time() * 1000)


# KEYS: log, meta, lease. ARGV: owner, lease_ms, then (entry_id, json) pairs.
_APPEND = """
local holder = redis.call('GET', KEYS[3])
if holder ~= ARGV[1] then
  if holder then return {0, 0, 0} end
  redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[2])
else
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
end
for i = 3, #ARGV, 2 do
  redis.call('XADD', KEYS[1], ARGV[i], 'e', ARGV[i + 1])
end
local cancel = redis.call('HGET', KEYS[2], 'cancel')
local seen = redis.call('HGET', KEYS[2], 'seen')
return {1, cancel and 1 or 0, tonumber(seen or '0')}
"""

# KEYS: meta, lease, active, log.
# ARGV: owner, status, finish_reason, retention_s, stream_id, then (entry_id, json) pairs.
# The last events (the terminal one included) and the status change land together.
_FINISH = """
local holder = redis.call('GET', KEYS[2])
if holder and holder ~= ARGV[1] then return 0 end
for i = 6, #ARGV, 2 do
  redis.call('XADD', KEYS[4], ARGV[i], 'e', ARGV[i + 1])
end
redis.call('HSET', KEYS[1], 'status', ARGV[2], 'finish_reason', ARGV[3])
redis.call('ZREM', KEYS[3], ARGV[5])
redis.call('DEL', KEYS[2])
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('EXPIRE', KEYS[4], ARGV[4])
return 1
"""

# KEYS: lease, meta. ARGV: owner, lease_ms. Take a lease nobody holds on a running stream.
_ACQUIRE = """
if redis.call('HGET', KEYS[2], 'status') ~= 'running' then return 0 end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return 0
"""


def _entry_id(event_id: int) -> str:
    return f"{event_id + 1}-0"


def _entry_args(events: Sequence[Event]) -> list[str | int]:
    """(entry id, event JSON) pairs, the tail of the append and finish scripts' arguments."""
    args: list[str | int] = []
    for event in events:
        args += [_entry_id(event.id), event.model_dump_json()]
    return args


def _event_id(entry_id: bytes | str) -> int:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.split("-", 1)[0]) - 1


class RedisEventLog:
    def __init__(self, redis: Redis, prefix: str = "rs", running_ttl_s: int = 86_400) -> None:
        self._r = redis
        self._p = prefix
        self._running_ttl = running_ttl_s
        self._append = redis.register_script(_APPEND)
        self._finish = redis.register_script(_FINISH)
        self._acquire = redis.register_script(_ACQUIRE)

    def _keys(self, sid: str) -> tuple[str, str, str]:
        base = f"{self._p}:s:{sid}"
        return f"{base}:log", f"{base}:meta", f"{base}:lease"

    @property
    def _active(self) -> str:
        return f"{self._p}:active"

    async def create(
        self, stream_id: str, first: Event, new: NewStream, owner: str, lease_ms: int
    ) -> None:
        log, meta_key, lease = self._keys(stream_id)
        fields: dict[bytes | bytearray | memoryview[int] | str | int | float, str | int] = {
            "status": "running",
            "seen": str(now_ms()),
        }
        fields.update(new.fields())
        try:
            async with self._r.pipeline(transaction=True) as pipe:
                pipe.hset(meta_key, mapping=fields)
                pipe.expire(meta_key, self._running_ttl)
                pipe.set(lease, owner, px=lease_ms)
                pipe.xadd(log, {"e": first.model_dump_json()}, id=_entry_id(first.id))
                pipe.expire(log, self._running_ttl)
                pipe.zadd(self._active, {stream_id: time.time()})
                await pipe.execute()
        except RedisError as exc:
            raise EventLogUnavailable(f"event log (Redis) unavailable: {exc}") from exc

    async def append(
        self, stream_id: str, owner: str, events: Sequence[Event], lease_ms: int
    ) -> AppendResult:
        args: list[str | int] = [owner, lease_ms]
        args += _entry_args(events)
        owned, cancel, seen = await self._append(keys=list(self._keys(stream_id)), args=args)
        return AppendResult(bool(owned), bool(cancel), int(seen))

    async def read(self, stream_id: str, after: int, block_ms: int | None) -> list[Event]:
        log, meta_key, _ = self._keys(stream_id)
        async with self._r.pipeline(transaction=False) as pipe:
            pipe.hset(meta_key, "seen", str(now_ms()))
            pipe.xread({log: _entry_id(after)}, count=1000, block=block_ms)
            _, result = await pipe.execute()
        events: list[Event] = []
        for _key, entries in result or []:
            for _entry, fields in entries:
                events.append(EVENT_ADAPTER.validate_json(fields[b"e"]))
        return events

    async def meta(self, stream_id: str) -> StreamMeta | None:
        log, meta_key, lease = self._keys(stream_id)
        async with self._r.pipeline(transaction=False) as pipe:
            pipe.hgetall(meta_key)
            pipe.get(lease)
            pipe.xrevrange(log, count=1)
            raw, owner, last = await pipe.execute()
        if not raw:
            return None
        fields = {k.decode(): v.decode() for k, v in raw.items()}
        return StreamMeta.from_fields(
            stream_id,
            fields,
            owner.decode() if owner else None,
            _event_id(last[0][0]) if last else -1,
        )

    async def set_plan(self, stream_id: str, plan_json: str) -> None:
        await self._r.hset(self._keys(stream_id)[1], "plan", plan_json)

    async def finish(
        self,
        stream_id: str,
        owner: str,
        events: Sequence[Event],
        status: str,
        finish_reason: str,
        retention_s: int,
    ) -> bool:
        log, meta_key, lease = self._keys(stream_id)
        args: list[str | int] = [owner, status, finish_reason, retention_s, stream_id]
        args += _entry_args(events)
        done = await self._finish(keys=[meta_key, lease, self._active, log], args=args)
        return bool(done)

    async def acquire(self, stream_id: str, owner: str, lease_ms: int) -> bool:
        _, meta_key, lease = self._keys(stream_id)
        return bool(await self._acquire(keys=[lease, meta_key], args=[owner, lease_ms]))

    async def request_cancel(self, stream_id: str) -> None:
        await self._r.hset(self._keys(stream_id)[1], "cancel", "1")

    async def touch_reader(self, stream_id: str) -> None:
        await self._r.hset(self._keys(stream_id)[1], "seen", str(now_ms()))

    async def running(self) -> list[str]:
        members = await self._r.zrange(self._active, 0, -1)
        return [m.decode() if isinstance(m, bytes) else str(m) for m in members]
