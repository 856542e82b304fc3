"""The event log's contract: what every stream's events and state look like to the rest.

Two implementations: ``redis_log.RedisEventLog`` (the real one; its module docstring has the key
layout and the scripts) and ``memory_log.MemoryEventLog`` (one process only, for measuring the
cost of checkpointing and for unit tests).

The promises every implementation keeps:
- events get explicit, increasing ids from 0; an id is never written twice;
- only the holder of a stream's lease appends; an append also renews the lease and returns the
  cancel flag and the last reader heartbeat;
- an append (or finish) says ``log_lost`` instead of writing when the log no longer ends where
  the writer left it (its store lost data): nothing is ever appended after a hole.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from rag_stream.schemas.events import Event
from rag_stream.schemas.tenants import LOCAL_TENANT


@dataclass(slots=True)  # (not frozen: one a stream a step, and a frozen init costs 4x as much)
class AppendResult:
    owned: bool  # False: another process holds the lease now (or the log was lost); stop
    cancel: bool
    reader_seen_ms: int
    log_lost: bool = False  # the log lost events this writer appended: end the stream
    superseded: bool = False  # the log refused the batch's ids: another writer wrote them


FinishResult = Literal["done", "lease_lost", "log_lost"]
READ_PAGE = 1000  # the most events one read returns for one stream
StreamStatus = Literal["running", "done", "error"]


# The names a start key is found by are its digest after this (an alias's namespace of its own).
START_ALIAS = "start:"


@dataclass(frozen=True)
class StreamMeta:
    """What the log knows about a stream besides its events."""

    stream_id: str
    status: StreamStatus
    model: str
    kind: str  # the name of the StreamKind that produces it
    created: float
    plan: str | None  # the kind's plan as JSON; the kind validates it when it reads it back
    wire: str | None  # how the API renders the stream (opaque here); None: SSE events
    tenant: str  # who may read, resume or cancel it (another tenant sees a 404)
    finish_reason: str | None
    cancel: bool
    lease_owner: str | None
    last_event_id: int
    detached: bool = False  # see NewStream
    abandon_after_s: float | None = None  # see NewStream
    start_key: str | None = None  # see NewStream
    start_fingerprint: str | None = None

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
            wire=fields.get("wire"),
            tenant=fields.get("tenant", LOCAL_TENANT),  # streams from before tenants
            finish_reason=fields.get("finish_reason"),
            cancel=fields.get("cancel") == "1",
            lease_owner=lease_owner,
            last_event_id=last_event_id,
            detached=fields.get("detached") == "1",
            abandon_after_s=_seconds(fields.get("abandon_after_s")),
            start_key=fields.get("start_key"),
            start_fingerprint=fields.get("start_fingerprint"),
        )

    @property
    def new(self) -> NewStream:
        return NewStream(
            model=self.model,
            kind=self.kind,
            created=self.created,
            wire=self.wire,
            tenant=self.tenant,
            detached=self.detached,
            abandon_after_s=self.abandon_after_s,
            start_key=self.start_key,
            start_fingerprint=self.start_fingerprint,
        )


def _seconds(field: str | None) -> float | None:
    try:
        return None if field is None else float(field)
    except ValueError:
        return None  # unreadable: the service's default applies


@dataclass(slots=True)  # (not frozen: one a stream a step, as AppendResult)
class Append:
    """One stream's batch in an append: ``events`` follow event ``after`` (the last one its
    writer knows is in the log), their ids following on from it. An empty batch renews the
    lease."""

    stream_id: str
    owner: str
    events: Sequence[Event]
    lease_ms: int
    after: int


@dataclass(frozen=True)
class NewStream:
    """The fields a stream is created with (the first event carries the same model/created)."""

    model: str
    kind: str
    created: float
    wire: str | None = None  # the response format a resume must use (opaque here)
    tenant: str = LOCAL_TENANT
    # Runs whether or not anyone reads it (a background job): never ended as abandoned.
    detached: bool = False
    # Ended as abandoned this long after its last reader left; None: streaming.abandon_after_s.
    abandon_after_s: float | None = None
    # A name its tenant also finds it by (an AI SDK chat's id): the latest stream named so.
    alias: str | None = None
    # The start's key (a digest of its Idempotency-Key), which also finds it (``START_ALIAS``),
    # and a digest of the request it started (streaming/start_keys.py)
    start_key: str | None = None
    start_fingerprint: str | None = None

    @property
    def aliases(self) -> list[str]:
        """Every name its tenant finds it by (``EventLog.named``)."""
        names = [] if self.alias is None else [self.alias]
        if self.start_key is not None:
            names.append(START_ALIAS + self.start_key)
        return names

    def fields(self) -> dict[str, str]:
        fields = {
            "model": self.model,
            "kind": self.kind,
            "created": repr(self.created),
            "tenant": self.tenant,
        }
        if self.wire is not None:
            fields["wire"] = self.wire
        if self.detached:
            fields["detached"] = "1"
        if self.abandon_after_s is not None:
            fields["abandon_after_s"] = repr(self.abandon_after_s)
        if self.start_key is not None and self.start_fingerprint is not None:
            fields["start_key"] = self.start_key
            fields["start_fingerprint"] = self.start_fingerprint
        return fields


class EventLog(Protocol):
    async def create(
        self,
        stream_id: str,
        first: Event,
        new: NewStream,
        owner: str,
        lease_ms: int,
        plan_json: str | None = None,
    ) -> None:
        """The stream, its first event and its lease, at once; with ``plan_json``, its plan
        too (as ``set_plan``), so no moment exists where it runs without one."""
        ...

    async def append(self, batches: Sequence[Append]) -> list[AppendResult]:
        """Append the batches of several streams in one round trip; one result per batch, in
        order. Each batch is checked and written on its own (one stream's lost lease does not
        affect the others). One call at a time: the process's flusher makes them in turn."""
        ...

    async def read(
        self, stream_id: str, after: int, block_ms: int | None, count: int = READ_PAGE
    ) -> list[Event]:
        """Up to ``count`` events after id ``after``, in order; waits up to block_ms for new
        ones (None: no wait). Its cost follows ``count``, never the events before ``after``."""
        ...

    async def read_many(
        self, cursors: Mapping[str, int], block_ms: int | None
    ) -> dict[str, list[Event]]:
        """``read`` (up to READ_PAGE events each) for many streams in one wait; refreshes each
        one's reader heartbeat."""
        ...

    async def meta(self, stream_id: str) -> StreamMeta | None: ...

    async def named(self, tenant: str, alias: str) -> str | None:
        """The id of ``tenant``'s latest stream created with ``alias`` (NewStream), if any."""
        ...

    async def set_plan(self, stream_id: str, plan_json: str) -> None: ...

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
        """Append the last events and set the final status, in one step."""
        ...

    async def mark_lost(
        self, stream_id: str, owner: str, new: NewStream, error: Event, retention_s: int
    ) -> None:
        """Record that the stream's log lost events: status ``error``, reason ``log_lost``, and
        ``error`` as its last event, so readers end and nobody continues it."""
        ...

    async def acquire(
        self, stream_id: str, owner: str, lease_ms: int, stale_owner: str | None = None
    ) -> bool:
        """Take the lease of a running stream if nobody holds it or ``stale_owner`` does."""
        ...

    async def request_cancel(self, stream_id: str) -> None: ...

    async def running(self) -> list[str]: ...

    async def forget(self, stream_id: str) -> None:
        """Drop ``stream_id`` from ``running``: its meta is gone (expired while it was listed,
        say, when no live process could continue it), so nothing can ever end it."""
        ...

    async def announce(self, owner: str) -> None:
        """Make this process's presence known (see ``owner_alive``); called periodically."""
        ...

    async def retire(self, owner: str, linger_ms: int) -> None:
        """This process stops producing: it no longer counts as present. What said it was
        present goes ``linger_ms`` later: once the leases it held have lapsed, peers take its
        streams over without it, and it would otherwise stay behind (a key per process start)."""
        ...

    async def owner_alive(self, owner: str) -> bool:
        """False only when the process ``owner`` is known to be gone."""
        ...


def now_ms() -> int:
    return int(time.time() * 1000)
