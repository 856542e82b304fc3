"""What the async and sync clients do differently besides HTTP, each written twice: waiting
before a reconnection and reading a file to upload.

``async_client.py`` and ``async_stream.py`` call the ``a``-names; scripts/gen_sync_client.py
turns each into the plain name beside it when it writes the sync modules.
"""

from __future__ import annotations

import time
from pathlib import Path

import anyio


async def asleep(seconds: float) -> None:
    await anyio.sleep(seconds)


async def aread_bytes(path: Path) -> bytes:
    return await anyio.Path(path).read_bytes()  # off the event loop


def sleep(seconds: float) -> None:
    time.sleep(seconds)


def read_bytes(path: Path) -> bytes:
    return path.read_bytes()
