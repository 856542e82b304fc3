"""Waiting for something that happens in the background: poll a condition until it holds or a
deadline passes. The deadline only bounds a failure; a passing test waits as long as the
condition takes, so a slow machine is slower, never wrong."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


async def eventually(
    check: Callable[[], Awaitable[bool]],
    what: str,
    timeout_s: float = 10.0,
    every_s: float = 0.01,
) -> None:
    """Return once ``await check()`` is true; AssertionError naming ``what`` after
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        await asyncio.sleep(every_s)


def eventually_sync(
    check: Callable[[], bool], what: str, timeout_s: float = 10.0, every_s: float = 0.05
) -> None:
    """``eventually`` for blocking code."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(every_s)
