"""How a native route answers once its stream is launched: SSE as it is written, or (with
``"stream": false``) one JSON body once it has ended."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from fastapi.responses import Response

from rag_stream.resources import Resources
from rag_stream.streaming.collect import Collected, collect
from rag_stream.streaming.sse import event_stream_response

Body = TypeVar("Body")


async def stream_or_collect(
    resources: Resources, stream_id: str, stream: bool, render: Callable[[Collected], Body]
) -> Response | Body:
    streams = resources.streams
    if stream:
        batches = streams.follow_batches(stream_id)
        keepalive = resources.settings.streaming.keepalive_s
        return event_stream_response(batches, keepalive, {"X-Stream-Id": stream_id})
    return render(await collect(streams.follow(stream_id)))
