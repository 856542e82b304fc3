"""Admission control: how many streams this process generates at once, and how many may wait.

A route asks for a ``Ticket`` before it does any work (no retrieval, no engine request, nothing
written): when ``max_active`` streams are generating and ``max_queued`` more are waiting, the
answer is ``TooManyRequests`` (a 429 with ``Retry-After``), so the queue is never unbounded and
a refused client has lost nothing. An admitted stream's producer waits for a generation slot
(``Ticket.slot``); waiting streams get slots in priority order (``interactive`` before
``batch``), first come first served within a class. Continuations after a takeover were
admitted where they started and run without a ticket.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Literal

from rag_stream.errors import TooManyRequests

Priority = Literal["interactive", "batch"]
_RANK: dict[Priority, int] = {"interactive": 0, "batch": 1}


class Admission:
    def __init__(
        self,
        max_active: int,
        max_queued: int,
        retry_after_s: int,
        on_reject: Callable[[str], None] = lambda _reason: None,
    ) -> None:
        self.max_active = max_active
        self.max_queued = max_queued
        self.retry_after_s = retry_after_s
        self._on_reject = on_reject
        self._admitted = 0  # tickets not yet released (generating, waiting, or about to)
        self._active = 0
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    @property
    def active(self) -> int:
        return self._active

    @property
    def queued(self) -> int:
        return self._admitted - self._active

    def admit(self, priority: Priority = "interactive") -> Ticket:
        """A ticket for one new stream, or TooManyRequests when the queue is full."""
        if self._admitted >= self.max_active + self.max_queued:
            self._on_reject("queue_full")
            raise TooManyRequests(
                f"the server is at its limit: {self.max_active} streams generating "
                f"(limits.max_active_streams) and {self.max_queued} waiting "
                "(limits.max_queued); retry later",
                retry_after_s=self.retry_after_s,
            )
        self._admitted += 1
        return Ticket(self, priority)

    @contextlib.contextmanager
    def ticket(self, priority: Priority = "interactive") -> Iterator[Ticket]:
        """``admit``, giving the ticket back if the block fails (the stream never started)."""
        ticket = self.admit(priority)
        try:
            yield ticket
        except BaseException:
            ticket.release()
            raise

    async def _acquire(self, ticket: Ticket) -> None:
        if self._active < self.max_active and not self._waiting:
            self._active += 1
            return
        waiter = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (_RANK[ticket.priority], next(self._order), waiter))
        try:
            await waiter  # _wake_next hands the slot over (counted there)
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._free_slot()  # the slot arrived as we were cancelled: pass it on
            else:
                self._waiting = [w for w in self._waiting if w[2] is not waiter]
                heapq.heapify(self._waiting)
            raise

    def _free_slot(self) -> None:
        self._active -= 1
        while self._waiting and self._active < self.max_active:
            _, _, waiter = heapq.heappop(self._waiting)
            if not waiter.done():
                self._active += 1
                waiter.set_result(None)

    def _release(self, held_slot: bool) -> None:
        self._admitted -= 1
        if held_slot:
            self._free_slot()


class Ticket:
    """One admitted stream's place: a slot to wait for, then to give back."""

    def __init__(self, admission: Admission, priority: Priority) -> None:
        self._admission = admission
        self.priority: Priority = priority
        self._released = False
        self._claimed = False  # its stream's producer took it over: only slot() frees it

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Wait for a generation slot; hold it while the body runs; then free the ticket."""
        if self._released:  # given back before its producer started: run uncounted
            yield
            return
        self._claimed = True
        held = False
        try:
            await self._admission._acquire(self)
            held = True
            yield
        finally:
            self._release(held)

    def release(self) -> None:
        """Give the ticket back unused (the request failed before its stream started); once
        its stream's producer holds it, only the producer frees it."""
        if not self._claimed:
            self._release(False)

    def _release(self, held_slot: bool) -> None:
        if not self._released:
            self._released = True
            self._admission._release(held_slot)
