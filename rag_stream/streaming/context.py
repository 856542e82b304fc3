"""StreamContext: what a producer sees of the stream it writes."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from pydantic import BaseModel
from redis.exceptions import RedisError

from rag_stream.schemas.events import Event
from rag_stream.streaming.event_log import EventLog
from rag_stream.streaming.redis_conn import retry_redis
from rag_stream.streaming.writer import StopReason, StreamWriter


class Stopped(Exception):
    """Raised inside a producer when its stream must stop (see ``StreamContext.check``)."""

    def __init__(self, reason: StopReason) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class StreamContext:
    stream_id: str
    run_id: str  # unique per producing run (a takeover starts a new one): the engine request id
    writer: StreamWriter
    event_log: EventLog
    accepted_at: float  # time.monotonic() when the request (or the takeover) was accepted
    tenant: str  # whose stream it is (its usage is recorded for this tenant)
    started: float = field(default_factory=time.monotonic)

    @property
    def queue_ms(self) -> float:
        """From acceptance to this producer starting to work."""
        return (self.started - self.accepted_at) * 1000

    def emit(self, make: Callable[[int], Event]) -> Event:
        """Append the event ``make(next id)`` (it reaches readers once its batch is in the log)."""
        return self.writer.emit(make)

    def check(self) -> None:
        """Raise Stopped if the stream was cancelled, abandoned or taken away."""
        if self.writer.stop_reason is not None:
            raise Stopped(self.writer.stop_reason)

    def on_stop(self, callback: Callable[[], Awaitable[None]]) -> None:
        """Run ``callback`` when the stream must stop or this process shuts down (abort the
        engine request there)."""
        self.writer.on_stop(callback)

    async def save_plan(self, plan: BaseModel) -> None:
        """Store what a takeover in another process needs to continue this stream. Retried
        while Redis blips, as appends are (a restart takes a second or two). If Redis stays
        away, raise Stopped: the stream is left as a failed append leaves it, to be continued
        from its log (and its last saved plan) once Redis is back, not ended with an error."""
        data = plan.model_dump_json()
        try:
            await retry_redis(
                lambda: self.event_log.set_plan(self.stream_id, data),
                self.writer.redis_retries,
                f"stream {self.stream_id}: saving its plan",
            )
        except RedisError:
            self.writer.log_unavailable()
            raise Stopped("log_unavailable") from None
