"""A minimal SSE client for tests: parse frames into (id, event, data) with httpx-sse."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from httpx_sse import connect_sse


@dataclass
class Frame:
    id: int
    event: str
    data: dict[str, Any]
    received: float = field(default_factory=time.monotonic, compare=False)  # parsed at


def read_stream(
    client: httpx.Client,
    method: str,
    url: str,
    *,
    stop_after: int | None = None,
    on_frame: Callable[[Frame], None] | None = None,
    **kwargs: Any,
) -> list[Frame]:
    """Read frames until the stream ends (or stop_after frames, then disconnect); call
    ``on_frame`` after each. An event sent without an id (a reader's own error) gets id -1."""
    frames: list[Frame] = []
    with connect_sse(client, method, url, **kwargs) as source:
        source.response.raise_for_status()
        for sse in source.iter_sse():
            if not sse.data:
                # a keep-alive comment: httpx-sse surfaces it as an empty event because the
                # last id carries over; browsers (per the SSE spec) dispatch nothing
                continue
            frame = Frame(int(sse.id) if sse.id else -1, sse.event, json.loads(sse.data))
            frames.append(frame)
            if on_frame is not None:
                on_frame(frame)
            if stop_after is not None and len(frames) >= stop_after:
                break
    return frames


def text_of(frames: list[Frame]) -> str:
    return "".join(f.data["text"] for f in frames if f.event == "token")
