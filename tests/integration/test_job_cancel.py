"""Cancelling a job at each phase, in the test process on the paced stub engine, which keeps
every request it was sent (``ledger``): the job ends ``cancelled`` within a second (or once a
running search ends), the cancel call answers with the job as the cancel left it, and the
engine generates nothing for it afterwards. The phases: waiting behind admission for a
generation slot, planning its outline, and between two sections (the next one's retrieval,
slowed here). Mid-section cancels are
tests/integration/test_client_jobs.py's and test_jobs.py's, on real engines."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.support import inprocess
from tests.support.inprocess import InProcess
from tests.support.sse import Frame
from tests.support.waiting import eventually

# One generation slot (a queued job waits behind the running one); 10 ms a token, so an
# outline attempt (jobs.outline_tokens, 200) takes 2 s; a search holding "(slow)" 2 s. Leases
# are renewed every 30 s, not every second: what a cancel does here, it does by itself, not
# at the producer's next renewal (which also tells it of a cancel).
SLOW_S = 2.0
pytestmark = pytest.mark.in_process(
    delay_s=0.01,
    slow_query_s=SLOW_S,
    ledger=True,
    limits__max_active_streams=1,
    streaming__renew_interval_s=30,
    streaming__lease_ms=90_000,
)

DOCS = [
    ("harbours.md", "# Harbours\n\nThe harbour of Vell shelters forty boats behind its mole."),
    ("boats.md", "# Boats\n\nThe boats of Vell are clinker-built of larch on oak frames."),
]
TITLE = "A short guide to Vell"
CANCEL_S = 1.0  # the cancel takes effect within this, whatever the job was doing
# how a request stopped early ends: aborted, or its reader stopped reading (which aborts it)
STOPPED = ("cancelled", "left")


@pytest.fixture(scope="module")
async def kb(in_process_module: InProcess) -> str:
    return await inprocess.make_kb(in_process_module.client, DOCS, prefix="cancel")


async def _start(service: InProcess, **body: Any) -> dict[str, Any]:
    r = await service.client.post("/v1/jobs", json={"title": TITLE, "top_k": 1, **body})
    assert r.status_code == 202, r.text
    return dict(r.json())


async def _cancel(service: InProcess, job_id: str) -> tuple[dict[str, Any], float]:
    """The cancel call's answer, and how long it took."""
    started = time.monotonic()
    r = await service.client.post(f"/v1/jobs/{job_id}/cancel")
    took = time.monotonic() - started
    assert r.status_code == 200, r.text
    return dict(r.json()), took


async def _events(service: InProcess, job_id: str) -> list[Frame]:
    return await inprocess.read_stream(service.client, "GET", f"/v1/jobs/{job_id}/events")


def _requests(service: InProcess, job: dict[str, Any]) -> dict[str, Any]:
    """The engine requests of the job's stream, by the part of their id after the run's."""
    return {r.request_id.rsplit(":", 1)[1]: r for r in service.ledger.of_stream(job["stream_id"])}


async def test_a_job_cancelled_while_its_outline_is_planned_ends_cancelled_at_once(
    in_process_module: InProcess, kb: str
) -> None:
    """It used to go on planning (the retry started after the abort) and end
    ``outline_failed``, while the cancel call waited its 10 s and answered ``queued``."""
    service = in_process_module
    job = await _start(service, kb=kb, sections=5, section_tokens=16)

    async def planning() -> bool:
        outline = _requests(service, job).get("outline0")
        return outline is not None and outline.tokens >= 3

    await eventually(planning, "the outline's first tokens")
    cancelled, took = await _cancel(service, job["id"])
    assert cancelled["status"] == "cancelled" and cancelled["error"] is None, cancelled
    assert took < CANCEL_S, took
    frames = await _events(service, job["id"])
    assert [f.event for f in frames] == ["stream", "job", "done"], frames
    assert frames[-1].data["finish_reason"] == "cancelled"
    # the outline's request was aborted well short of its 200 tokens, and no retry was sent
    requests = _requests(service, job)
    assert list(requests) == ["outline0"], requests
    assert requests["outline0"].ended in STOPPED, requests
    assert requests["outline0"].tokens < 100, requests
    status = (await service.client.get(f"/v1/jobs/{job['id']}")).json()
    assert status["status"] == "cancelled" and status["error"] is None, status


async def test_a_job_cancelled_while_it_waits_for_a_slot_ends_cancelled_at_once(
    in_process_module: InProcess, kb: str
) -> None:
    """It used to wait for the running job to end first (the cancel call gave up after 10 s,
    answering ``queued``)."""
    service = in_process_module
    # the one slot: a section of 5 s
    running = await _start(service, kb=kb, outline=["Harbours"], section_tokens=500)

    async def generating() -> bool:
        return "s0" in _requests(service, running)

    await eventually(generating, "the running job's section")
    queued = await _start(service, kb=kb, outline=["Boats"], section_tokens=16)
    assert queued["status"] == "queued", queued
    stream = (await service.client.get(f"/v1/streams/{queued['stream_id']}")).json()
    assert stream["last_event_id"] == 0, stream  # waiting: nothing but its `stream` event
    cancelled, took = await _cancel(service, queued["id"])
    assert cancelled["status"] == "cancelled", cancelled
    assert took < CANCEL_S, took
    frames = await _events(service, queued["id"])
    assert [f.event for f in frames] == ["stream", "done"], frames
    assert frames[-1].data["finish_reason"] == "cancelled"
    assert _requests(service, queued) == {}  # it never reached the engine
    # the running job went on meanwhile, in its slot; it is cancelled in the middle of it
    assert _requests(service, running)["s0"].ended is None
    ended, took = await _cancel(service, running["id"])
    assert ended["status"] == "cancelled" and took < CANCEL_S, (ended, took)
    section = _requests(service, running)["s0"]
    assert section.ended in STOPPED and section.tokens < 500, section
    admission = service.resources.streams.admission

    async def free() -> bool:
        return (admission.active, admission.queued) == (0, 0)

    await eventually(free, "both jobs' places given back")


async def test_a_job_cancelled_between_two_sections_writes_no_more(
    in_process_module: InProcess, kb: str
) -> None:
    """Cancelled once its first section is written, while the second one's sources are
    searched for: the search finishes (it is not cut short), then nothing else happens."""
    service = in_process_module
    job = await _start(service, kb=kb, outline=["Harbours", "Boats (slow)"], section_tokens=16)
    cancelled: list[tuple[dict[str, Any], float]] = []

    async def on_frame(frame: Frame) -> None:
        if frame.event == "section_done" and not cancelled:
            cancelled.append(await _cancel(service, job["id"]))

    frames = await inprocess.read_stream(
        service.live, "GET", f"/v1/jobs/{job['id']}/events", on_frame=on_frame
    )
    assert cancelled, frames
    answer, took = cancelled[0]
    assert answer["status"] == "cancelled", answer
    assert took < SLOW_S + CANCEL_S, took
    assert frames[-1].event == "done" and frames[-1].data["finish_reason"] == "cancelled"
    assert [f.data["index"] for f in frames if f.event == "section"] == [0]
    assert [f.data["index"] for f in frames if f.event == "section_done"] == [0]
    assert list(_requests(service, job)) == ["s0"]  # no request for the second section
    result = (
        await service.client.get(f"/v1/jobs/{job['id']}/result", params={"format": "json"})
    ).json()
    assert result["status"] == "cancelled" and [s["index"] for s in result["sections"]] == [0]
