"""Admission: a bounded queue in front of a bounded number of generation slots."""

from __future__ import annotations

import asyncio

import pytest

from rag_stream.errors import TooManyRequests
from rag_stream.streaming.admission import Admission, Ticket


async def _hold(ticket: Ticket, started: list[str], name: str, until: asyncio.Event) -> None:
    async with ticket.slot():
        started.append(name)
        await until.wait()


def test_the_queue_is_bounded_and_a_refusal_names_the_limits() -> None:
    rejected: list[str] = []
    admission = Admission(max_active=2, max_queued=1, retry_after_s=7, on_reject=rejected.append)
    tickets = [admission.admit() for _ in range(3)]
    with pytest.raises(TooManyRequests) as caught:
        admission.admit()
    assert caught.value.retry_after_s == 7 and caught.value.status_code == 429
    assert "limits.max_active_streams" in caught.value.message
    assert "limits.max_queued" in caught.value.message
    assert rejected == ["queue_full"]
    tickets[0].release()  # a request that failed before its stream started gives it back
    admission.admit()
    tickets[0].release()  # twice is once
    with pytest.raises(TooManyRequests):
        admission.admit()


def test_a_failed_block_gives_its_ticket_back() -> None:
    async def run() -> None:
        admission = Admission(max_active=1, max_queued=0, retry_after_s=1)
        with pytest.raises(ValueError):
            async with admission.ticket():
                raise ValueError("bad request")
        assert admission.queued == 0
        admission.admit()

    asyncio.run(run())


def test_slots_are_handed_out_interactive_first_then_in_order() -> None:
    async def run() -> list[str]:
        admission = Admission(max_active=1, max_queued=10, retry_after_s=1)
        started: list[str] = []
        gates = {n: asyncio.Event() for n in ("first", "b1", "b2", "i1", "i2")}
        tasks = [asyncio.create_task(_hold(admission.admit(), started, "first", gates["first"]))]
        await asyncio.sleep(0)
        for name, priority in (
            ("b1", "batch"),
            ("i1", "interactive"),
            ("b2", "batch"),
            ("i2", "interactive"),
        ):
            ticket = admission.admit(priority)  # type: ignore[arg-type]
            tasks.append(asyncio.create_task(_hold(ticket, started, name, gates[name])))
        await asyncio.sleep(0.01)
        assert started == ["first"] and admission.active == 1 and admission.queued == 4
        for name in ("first", "i1", "i2", "b1", "b2"):
            await asyncio.sleep(0.01)
            assert started[-1] == name and admission.active == 1
            gates[name].set()
        await asyncio.gather(*tasks)
        assert admission.active == 0 and admission.queued == 0
        return started

    assert asyncio.run(run()) == ["first", "i1", "i2", "b1", "b2"]


def test_a_waiter_cancelled_in_the_queue_leaves_it() -> None:
    async def run() -> None:
        admission = Admission(max_active=1, max_queued=2, retry_after_s=1)
        started: list[str] = []
        gate = asyncio.Event()
        holder = asyncio.create_task(_hold(admission.admit(), started, "a", gate))
        await asyncio.sleep(0)
        waiter = asyncio.create_task(_hold(admission.admit(), started, "b", gate))
        await asyncio.sleep(0.01)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert admission.queued == 0 and admission.active == 1
        late = asyncio.create_task(_hold(admission.admit(), started, "c", gate))
        gate.set()
        await asyncio.gather(holder, late)
        assert started == ["a", "c"] and admission.active == 0

    asyncio.run(run())


def test_once_a_producer_holds_the_ticket_only_it_frees_it() -> None:
    async def run() -> None:
        admission = Admission(max_active=1, max_queued=0, retry_after_s=1)
        ticket = admission.admit()
        async with ticket.slot():
            ticket.release()  # a late release from the request's side changes nothing
            assert admission.active == 1 and admission.queued == 0
            with pytest.raises(TooManyRequests):
                admission.admit()
        assert admission.active == 0
        early = admission.admit()
        early.release()  # given back first: its producer then runs without a slot
        async with early.slot():
            assert admission.active == 0
        admission.admit()  # and nothing was counted twice

    asyncio.run(run())


def test_batch_streams_take_at_most_their_share_of_the_slots() -> None:
    """max_active_batch 1 of 3 slots: a second batch stream waits even with slots free, and an
    interactive one that comes after it is not held up behind it."""

    async def run() -> list[str]:
        admission = Admission(max_active=3, max_queued=10, retry_after_s=1, max_active_batch=1)
        started: list[str] = []
        gates = {n: asyncio.Event() for n in ("b1", "b2", "i1")}
        tasks = []
        for name, priority in (("b1", "batch"), ("b2", "batch"), ("i1", "interactive")):
            ticket = admission.admit(priority)  # type: ignore[arg-type]
            tasks.append(asyncio.create_task(_hold(ticket, started, name, gates[name])))
            await asyncio.sleep(0.01)
        assert started == ["b1", "i1"] and admission.active == 2 and admission.queued == 1
        gates["b1"].set()
        await asyncio.sleep(0.01)
        assert started == ["b1", "i1", "b2"]
        gates["b2"].set()
        gates["i1"].set()
        await asyncio.gather(*tasks)
        assert admission.active == 0 and admission.queued == 0
        return started

    assert asyncio.run(run()) == ["b1", "i1", "b2"]
