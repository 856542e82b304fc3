"""Admission control: how many streams this process generates at once, and how many may wait.

A route asks for a ``Ticket`` before it does any work (no retrieval, no engine request, nothing
written): when ``max_active`` streams are generating and ``max_queued`` more are waiting, the
answer is ``TooManyRequests`` (a 429 with ``Retry-After``), so the queue is never unbounded and
a refused client has lost nothing. An admitted stream's producer waits for a generation slot
(``Ticket.slot``); waiting streams get slots in priority order (``interactive`` before
``batch``), first come first served within a class; with ``max_active_batch``, at most that
many of the generating streams are ``batch`` ones (each batch stream's long prefills and decodes
share the engine's steps with the interactive ones). Continuations after a takeover were
admitted where they started and run without a ticket.

With ``Quotas`` (Redis), a ticket also holds one of its tenant's active-stream places, and the
tenant's limit is checked with the process's, before any work.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections.abc import AsyncIterator, Callable
from typing import Literal

from rag_stream.errors import TooManyRequests
from rag_stream.schemas.tenants import LOCAL_TENANT
from rag_stream.streaming.quotas import Quotas

Priority = Literal["interactive", "batch"]
_RANK: dict[Priority, int] = {"interactive": 0, "batch": 1}


class Admission:
    def __init__(
        self,
        max_active: int,
        max_queued: int,
        retry_after_s: int,
        on_reject: Callable[[str], None] = lambda _reason: None,
        quotas: Quotas | None = None,
        max_active_batch: int | None = None,
    ) -> None:
        self._quotas = quotas
        self.max_active_batch = max_active_batch
        self._active_batch = 0
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

    @contextlib.asynccontextmanager
    async def ticket(
        self, priority: Priority = "interactive", tenant: str = LOCAL_TENANT
    ) -> AsyncIterator[Ticket]:
        """``admit``, and a place among the tenant's active streams; the ticket is given back
        if the block fails (the stream never started)."""
        ticket = self.admit(priority)
        try:
            if self._quotas is not None:
                ticket.hold = await self._quotas.hold(tenant, self.retry_after_s)
            yield ticket
        except BaseException:
            ticket.release()
            raise

    async def _acquire(self, ticket: Ticket) -> bool:
        """Wait for a generation slot; whether it is one of the batch slots."""
        batch = ticket.priority == "batch"
        if self.free_now(ticket.priority):  # (the common case, taken without a wait)
            self._active += 1
            self._active_batch += batch
            return batch
        waiter = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (_RANK[ticket.priority], next(self._order), waiter))
        self._hand_out()
        try:
            await waiter  # _hand_out hands the slot over (counted there)
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._free_slot(batch)  # the slot arrived as we were cancelled: pass it on
            else:
                self._waiting = [w for w in self._waiting if w[2] is not waiter]
                heapq.heapify(self._waiting)
            raise
        return batch

    def free_now(self, priority: Priority) -> bool:
        """Whether a stream of ``priority`` would get a slot at once: one is free and no other
        stream waits for one."""
        return not self._waiting and self._fits(priority == "batch")

    def _fits(self, batch: bool) -> bool:
        if self._active >= self.max_active:
            return False
        cap = self.max_active_batch
        return not batch or cap is None or self._active_batch < cap

    def _hand_out(self) -> None:
        """Give free slots to the waiters in order. Interactive ones come first in the heap, so
        when the first waiter is a batch stream that does not fit, none that follow does."""
        while self._waiting:
            rank, _, waiter = self._waiting[0]
            batch = rank == _RANK["batch"]
            if not self._fits(batch):
                return
            heapq.heappop(self._waiting)
            if not waiter.done():
                self._active += 1
                self._active_batch += batch
                waiter.set_result(None)

    def _free_slot(self, batch: bool) -> None:
        self._active -= 1
        self._active_batch -= batch
        self._hand_out()

    def _release(self, held_slot: bool, batch: bool, hold: str | None) -> None:
        self._admitted -= 1
        if self._quotas is not None:
            self._quotas.release(hold)
        if held_slot:
            self._free_slot(batch)


class Ticket:
    """One admitted stream's place: a slot to wait for, then to give back."""

    def __init__(self, admission: Admission, priority: Priority) -> None:
        self._admission = admission
        self.priority: Priority = priority
        self._released = False
        self._claimed = False  # its stream's producer took it over: only slot() frees it
        self.hold: str | None = None  # its place among its tenant's active streams (Quotas)

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Wait for a generation slot; hold it while the body runs; then free the ticket."""
        if self._released:  # given back before its producer started: run uncounted
            yield
            return
        self._claimed = True
        held = batch = False
        try:
            batch = await self._admission._acquire(self)
            held = True
            yield
        finally:
            self._release(held, batch)

    @property
    def slot_free(self) -> bool:
        """Whether ``slot`` would hold a slot at once (until the next await)."""
        return not self._released and self._admission.free_now(self.priority)

    def release(self) -> None:
        """Give the ticket back unused (the request failed before its stream started); once
        its stream's producer holds it, only the producer frees it."""
        if not self._claimed:
            self._release(False, False)

    def _release(self, held_slot: bool, batch: bool) -> None:
        if not self._released:
            self._released = True
            self._admission._release(held_slot, batch, self.hold)
