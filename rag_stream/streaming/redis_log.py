"""The event log in Redis (see ``event_log.py`` for the contract).

Keys, under a prefix (``rs`` by default), for stream ``S``:

- ``{p}:s:S:log``    Redis Stream; event ``n`` is entry ``(n+1)-0`` with one field ``e`` holding
  the event JSON. Explicit, increasing entry ids mean a second writer can never insert an event
  twice or out of order: Redis refuses an id that is not greater than the last.
- ``{p}:s:S:meta``   hash: status, model, kind, created, plan (JSON), cancel flag, reader heartbeat.
- ``{p}:s:S:lease``  the owning process's name, with a short expiry renewed while it generates.
- ``{p}:alias:T:A`` the id of tenant ``T``'s latest stream created with alias ``A`` (an AI SDK
  chat's id, or ``start:`` and the digest of a start's Idempotency-Key), expiring with a
  running stream's log.
- ``{p}:active``     sorted set of running stream ids (the sweeper's work list).
- ``{p}:proc:O``     the Redis client id of process ``O``'s presence connection (see below);
  republished by every sweep with a day's expiry, cut to twice the lease when ``O`` stops.

Appends are one Lua script call for the batches of many streams (a process flushes all its
streams together, see ``flusher.py``), which checks for each stream: that the writer still holds
the lease (only the lease holder writes); that the log still ends where the writer left it (a
Redis that lost its data, restarted empty, must not be extended as if nothing happened: the
writer learns the log was lost); and returns the cancel flag and reader heartbeat, so the writer
learns both with no extra round trip.

Presence: every process keeps one idle connection named after itself. When a process dies the
kernel closes it and Redis forgets the client at once, so ``owner_alive`` (``CLIENT LIST ID``)
tells a dead producer from a slow one without waiting for its lease to expire.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence

from redis.asyncio import ConnectionPool, Redis
from redis.exceptions import RedisError

from rag_stream.errors import EventLogUnavailable
from rag_stream.schemas.events import EVENT_ADAPTER, Event
from rag_stream.streaming.event_log import (
    READ_PAGE,
    Append,
    AppendResult,
    FinishResult,
    NewStream,
    StreamMeta,
    now_ms,
)
from rag_stream.streaming.script_line import Arg, Call, LuaScript, ScriptLine, SharedLine

# Streams per call of the append script: bounds how long one call holds Redis; a larger flush
# is several calls, sent together in one write (script_line.py).
MAX_STREAMS_PER_CALL = 128

# Several streams' batches in one call. KEYS: (log, meta, lease) per stream. ARGV, per stream in
# KEYS' order: owner, lease_ms, the id of the event the log must end with (``Append.after``),
# the number of events n, then the n events' json: their ids follow on from it, so the script
# makes their entry ids, and those of the log's expected end and of the batch's last event (a
# retry of a batch that landed). hiredis packs the arguments in C (script_line.py), so an
# argument each costs less than one JSON document to build, escape and decode again. Returns
# (status, cancel, seen) per stream; status 1 written, 0 another owner holds the lease, -1 the
# log does not end where the writer left it (lost), -2 the log refused the ids (another
# writer's).
_APPEND = LuaScript(
    """
local out = {}
local a = 1
for s = 1, #KEYS / 3 do
  local log, meta, lease = KEYS[3 * s - 2], KEYS[3 * s - 1], KEYS[3 * s]
  local owner, lease_ms = ARGV[a], ARGV[a + 1]
  local base, n = tonumber(ARGV[a + 2]) + 1, tonumber(ARGV[a + 3])
  local after, last = string.format('%d-0', base), string.format('%d-0', base + n)
  local first, stop = a + 4, a + 3 + n
  a = stop + 1
  local status, cancel, seen = 1, 0, 0
  local holder = redis.call('GET', lease)
  local top = ''
  if holder and holder ~= owner then
    status = 0
  elseif redis.call('EXISTS', meta) == 0 then
    status = -1
  else
    local tip = redis.call('XREVRANGE', log, '+', '-', 'COUNT', 1)
    top = tip[1] and tip[1][1] or ''
    if top ~= after and top ~= last then status = -1 end
  end
  if status == 1 then
    if holder then
      redis.call('PEXPIRE', lease, lease_ms)
    else
      redis.call('SET', lease, owner, 'PX', lease_ms)
    end
    if top == after then
      for i = first, stop do
        local entry = string.format('%d-0', base + 1 + i - first)
        local added = redis.pcall('XADD', log, entry, 'e', ARGV[i])
        if type(added) == 'table' and added.err then
          status = -2
          break
        end
      end
    end
    cancel = redis.call('HGET', meta, 'cancel') and 1 or 0
    seen = tonumber(redis.call('HGET', meta, 'seen') or '0')
  end
  out[#out + 1] = status
  out[#out + 1] = cancel
  out[#out + 1] = seen
end
return out
"""
)

# KEYS: meta, lease, log, active, then the keys of the stream's aliases. ARGV: ttl_s, owner,
# lease_ms, the first event's entry id and json, stream_id, its score in the active set (when
# created), then the meta's fields as name, value pairs. One call where a MULTI/EXEC of six or
# more cost the API process a redis-py command each. A stream that exists is left as it is: the
# call was sent again after its reply was lost (script_line.py), and stream ids are random.
_CREATE = LuaScript(
    """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local ttl = ARGV[1]
local fields = {}
for i = 8, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('EXPIRE', KEYS[1], ttl)
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
redis.call('XADD', KEYS[3], ARGV[4], 'e', ARGV[5])
redis.call('EXPIRE', KEYS[3], ttl)
redis.call('ZADD', KEYS[4], ARGV[7], ARGV[6])
for i = 5, #KEYS do redis.call('SET', KEYS[i], ARGV[6], 'EX', ttl) end
return 1
"""
)

# KEYS: meta, lease, active, log.
# ARGV: owner, status, finish_reason, retention_s, stream_id, after, last, then (id, json) pairs.
# The last events (the terminal one included) and the status change land together.
_FINISH = LuaScript(
    """
local holder = redis.call('GET', KEYS[2])
if holder and holder ~= ARGV[1] then return 0 end
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local tip = redis.call('XREVRANGE', KEYS[4], '+', '-', 'COUNT', 1)
local top = tip[1] and tip[1][1] or ''
if top ~= ARGV[6] and top ~= ARGV[7] then return -1 end
if top == ARGV[6] then
  for i = 8, #ARGV, 2 do
    redis.call('XADD', KEYS[4], ARGV[i], 'e', ARGV[i + 1])
  end
end
redis.call('HSET', KEYS[1], 'status', ARGV[2], 'finish_reason', ARGV[3])
redis.call('ZREM', KEYS[3], ARGV[5])
redis.call('DEL', KEYS[2])
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('EXPIRE', KEYS[4], ARGV[4])
return 1
"""
)

# KEYS: meta, lease, active, log. ARGV: owner, retention_s, stream_id, error entry id, error
# json, then the stream's creation fields as name, value pairs (model, kind, tenant, wire...:
# a resume must still find whose stream it is and in which format it is read). The log lost
# its head: say so, so nobody extends or trusts it.
_MARK_LOST = LuaScript(
    """
local holder = redis.call('GET', KEYS[2])
if holder and holder ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'status', 'error', 'finish_reason', 'log_lost')
for i = 6, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
local tip = redis.call('XREVRANGE', KEYS[4], '+', '-', 'COUNT', 1)
local top = tip[1] and tonumber(string.match(tip[1][1], '^(%d+)')) or 0
if top < tonumber(string.match(ARGV[4], '^(%d+)')) then
  redis.call('XADD', KEYS[4], ARGV[4], 'e', ARGV[5])
end
redis.call('ZREM', KEYS[3], ARGV[3])
redis.call('DEL', KEYS[2])
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('EXPIRE', KEYS[4], ARGV[2])
return 1
"""
)

# KEYS: meta hashes. ARGV: field, value. Sets the field only in the hashes that exist: a
# reader's heartbeat, a cancel or a plan must not bring back a stream whose meta expired (or
# was lost with a Redis restarted empty), as a hash that would never expire.
_TOUCH = LuaScript(
    """
for i = 1, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then redis.call('HSET', KEYS[i], ARGV[1], ARGV[2]) end
end
return 0
"""
)

# KEYS: lease, meta. ARGV: owner, lease_ms, stale owner ('' for none). Take the lease of a
# running stream if nobody holds it, or if its holder is the given (dead) process.
_ACQUIRE = LuaScript(
    """
if redis.call('HGET', KEYS[2], 'status') ~= 'running' then return 0 end
local holder = redis.call('GET', KEYS[1])
if (not holder) or (ARGV[3] ~= '' and holder == ARGV[3]) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""
)


@functools.lru_cache(maxsize=4096)  # (a running stream's: asked for at every engine step)
def _stream_keys(prefix: str, sid: str) -> tuple[str, str, str]:
    """Stream ``sid``'s log, meta and lease keys."""
    base = f"{prefix}:s:{sid}"
    return f"{base}:log", f"{base}:meta", f"{base}:lease"


def entry_id(event_id: int) -> str:
    return f"{event_id + 1}-0"


def _entry_args(events: Sequence[Event]) -> list[str]:
    """(entry id, event JSON) pairs: a stream's entries in the append's and finish's arguments."""
    args: list[str] = []
    for event in events:
        args += [entry_id(event.id), event.as_json]
    return args


def _event_id(raw: bytes | str) -> int:
    text = raw.decode() if isinstance(raw, bytes) else raw
    return int(text.split("-", 1)[0]) - 1


def _events(entries: Sequence[tuple[bytes, Mapping[bytes, bytes]]]) -> list[Event]:
    return [EVENT_ADAPTER.validate_json(fields[b"e"]) for _entry, fields in entries]


class RedisEventLog:
    def __init__(self, redis: Redis, prefix: str = "rs", running_ttl_s: int = 86_400) -> None:
        self._r = redis
        self._p = prefix
        self._running_ttl = running_ttl_s
        # (script_line.py) the hot call, a step's appends, on a line of its own; a stream's
        # other writes on another, shared by its producers
        self._append_line = ScriptLine(redis)
        self._writes = SharedLine(ScriptLine(redis))
        self._mark_lost = redis.register_script(_MARK_LOST.source)
        self._acquire = redis.register_script(_ACQUIRE.source)
        self._touch = redis.register_script(_TOUCH.source)
        self._presence: Redis | None = None

    def _keys(self, sid: str) -> tuple[str, str, str]:
        return _stream_keys(self._p, sid)

    @property
    def _active(self) -> str:
        return f"{self._p}:active"

    def _alias(self, tenant: str, alias: str) -> str:
        # unambiguous: a tenant's name has no ':' (schemas/tenants.py)
        return f"{self._p}:alias:{tenant}:{alias}"

    async def named(self, tenant: str, alias: str) -> str | None:
        try:
            found = await self._r.get(self._alias(tenant, alias))
        except RedisError as exc:
            raise EventLogUnavailable(f"event log (Redis) unavailable: {exc}") from exc
        return None if found is None else found.decode() if isinstance(found, bytes) else found

    async def create(
        self,
        stream_id: str,
        first: Event,
        new: NewStream,
        owner: str,
        lease_ms: int,
        plan_json: str | None = None,
    ) -> None:
        log, meta_key, lease = self._keys(stream_id)
        fields = {"status": "running", "seen": str(now_ms()), **new.fields()}
        if plan_json is not None:
            fields["plan"] = plan_json
        keys = [meta_key, lease, log, self._active]
        keys += [self._alias(new.tenant, alias) for alias in new.aliases]
        args = [str(self._running_ttl), owner, str(lease_ms), entry_id(first.id), first.as_json]
        args += [stream_id, repr(time.time()), *(x for pair in fields.items() for x in pair)]
        try:
            await self._writes.call(_CREATE, keys, args)
        except RedisError as exc:
            raise EventLogUnavailable(f"event log (Redis) unavailable: {exc}") from exc

    async def append(self, batches: Sequence[Append]) -> list[AppendResult]:
        calls = [
            self._append_call(batches[i : i + MAX_STREAMS_PER_CALL])
            for i in range(0, len(batches), MAX_STREAMS_PER_CALL)
        ]
        flat = [status for reply in await self._append_line.run(calls) for status in reply]
        return [
            AppendResult(
                owned=flat[i] == 1,
                cancel=bool(flat[i + 1]),
                reader_seen_ms=int(flat[i + 2]),
                log_lost=flat[i] == -1,
                superseded=flat[i] == -2,
            )
            for i in range(0, len(flat), 3)
        ]

    def _append_call(self, batches: Sequence[Append]) -> Call:
        """One call of the append script: its keys and arguments (``_APPEND``)."""
        keys: list[str] = []
        args: list[Arg] = []
        prefix = self._p
        for b in batches:
            keys += _stream_keys(prefix, b.stream_id)
            events = b.events
            args += [b.owner, b.lease_ms, b.after, len(events)]
            args += [event.as_json for event in events]
        return _APPEND, keys, args

    async def read(
        self, stream_id: str, after: int, block_ms: int | None, count: int = READ_PAGE
    ) -> list[Event]:
        found = await self._read({stream_id: after}, block_ms, count)
        return found.get(stream_id, [])

    async def read_many(
        self, cursors: Mapping[str, int], block_ms: int | None
    ) -> dict[str, list[Event]]:
        return await self._read(cursors, block_ms, READ_PAGE)

    async def _read(
        self, cursors: Mapping[str, int], block_ms: int | None, count: int
    ) -> dict[str, list[Event]]:
        # XREAD from an entry id finds it in the stream's radix tree: the cost is the entries
        # returned (and parsed here), whatever the log holds before them
        by_key = {self._keys(sid)[0]: sid for sid in cursors}
        async with self._r.pipeline(transaction=False) as pipe:
            metas = [self._keys(sid)[1] for sid in cursors]
            await self._touch(keys=metas, args=["seen", str(now_ms())], client=pipe)
            pipe.xread(
                {self._keys(sid)[0]: entry_id(after) for sid, after in cursors.items()},
                count=count,
                block=block_ms,
            )
            *_, result = await pipe.execute()
        found: dict[str, list[Event]] = {}
        for key, entries in result or []:
            name = key.decode() if isinstance(key, bytes) else key
            found[by_key[name]] = _events(entries)
        return found

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
        # (into a meta that exists: Redis restarted empty, the next append finds the log lost)
        await self._writes.call(_TOUCH, [self._keys(stream_id)[1]], ["plan", plan_json])

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
        log, meta_key, lease = self._keys(stream_id)
        last = events[-1].id if events else after
        args = [owner, status, finish_reason, str(retention_s), stream_id]
        args += [entry_id(after), entry_id(last), *_entry_args(events)]
        done = await self._writes.call(_FINISH, [meta_key, lease, self._active, log], args)
        return {1: "done", 0: "lease_lost"}.get(int(done), "log_lost")  # type: ignore[return-value]

    async def mark_lost(
        self, stream_id: str, owner: str, new: NewStream, error: Event, retention_s: int
    ) -> None:
        log, meta_key, lease = self._keys(stream_id)
        args: list[str | int] = [owner, retention_s, stream_id]
        args += [entry_id(error.id), error.as_json]
        args += [part for pair in new.fields().items() for part in pair]
        await self._mark_lost(keys=[meta_key, lease, self._active, log], args=args)

    async def acquire(
        self, stream_id: str, owner: str, lease_ms: int, stale_owner: str | None = None
    ) -> bool:
        _, meta_key, lease = self._keys(stream_id)
        args: list[str | int] = [owner, lease_ms, stale_owner or ""]
        return bool(await self._acquire(keys=[lease, meta_key], args=args))

    async def request_cancel(self, stream_id: str) -> None:
        await self._touch(keys=[self._keys(stream_id)[1]], args=["cancel", "1"])

    async def running(self) -> list[str]:
        members = await self._r.zrange(self._active, 0, -1)
        return [m.decode() if isinstance(m, bytes) else str(m) for m in members]

    async def forget(self, stream_id: str) -> None:
        await self._r.zrem(self._active, stream_id)

    # -- presence -------------------------------------------------------------------------

    async def announce(self, owner: str) -> None:
        """Keep this process's presence connection open and its client id published."""
        if self._presence is None:
            pool = self._r.connection_pool
            self._presence = Redis(
                connection_pool=ConnectionPool(
                    connection_class=pool.connection_class,
                    max_connections=1,
                    **{**pool.connection_kwargs, "client_name": owner},
                )
            )
        client_id = await self._presence.client_id()
        await self._r.set(f"{self._p}:proc:{owner}", client_id, ex=86_400)

    async def retire(self, owner: str, linger_ms: int) -> None:
        if self._presence is not None:
            await self._presence.aclose(close_connection_pool=True)
            self._presence = None
        await self._r.pexpire(f"{self._p}:proc:{owner}", linger_ms)

    async def owner_alive(self, owner: str) -> bool:
        """False only when the process is known to be gone (its presence connection closed)."""
        client_id = await self._r.get(f"{self._p}:proc:{owner}")
        if client_id is None:
            return True  # unknown (an older process, or never announced): wait for the lease
        listing = await self._r.execute_command(  # type: ignore[no-untyped-call]
            "CLIENT", "LIST", "ID", int(client_id)
        )
        text = listing.decode() if isinstance(listing, bytes) else str(listing)
        return f" name={owner} " in f" {text} "
