"""An SSE parser for load tools: frames with their arrival time, cheap enough for thousands of
concurrent readers in one process (httpx-sse parses field by field in Python; this splits
whole frames)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass(frozen=True)
class TimedFrame:
    id: int  # -1: sent without an id
    event: str  # "message" when the frame names none (chat-completion chunks)
    data: Any  # the parsed JSON, or the raw text ("[DONE]")
    at: float  # time.monotonic() when its last byte arrived


def parse_block(block: bytes, at: float) -> TimedFrame | None:
    """One SSE frame (the text between blank lines); None for comments alone (keep-alives)."""
    event_id, event, data = -1, "message", None
    for line in block.split(b"\n"):
        if not line or line.startswith(b":"):
            continue
        name, _, value = line.partition(b":")
        value = value.removeprefix(b" ")
        if name == b"id":
            event_id = int(value)
        elif name == b"event":
            event = value.decode()
        elif name == b"data":
            data = value
    if data is None:
        return None
    parsed: Any = data.decode() if data == b"[DONE]" else json.loads(data)
    return TimedFrame(event_id, event, parsed, at)


async def timed_frames(response: httpx.Response) -> AsyncIterator[TimedFrame]:
    """The frames of a streaming response as they arrive."""
    buf = b""
    async for chunk in response.aiter_bytes():
        buf += chunk.replace(b"\r\n", b"\n") if b"\r" in chunk else chunk
        if b"\n\n" not in buf:
            continue
        at = time.monotonic()
        *blocks, buf = buf.split(b"\n\n")
        for block in blocks:
            frame = parse_block(block, at)
            if frame is not None:
                yield frame
