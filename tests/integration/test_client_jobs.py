"""rag_stream.client's jobs, conversation list and metrics against a real server (the suite's
tiny-model one, as in test_client.py; the real Redis): what the client reads back is what the
server wrote."""

from __future__ import annotations

import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rag_stream.client import AsyncClient, Client, Reconnect, RetryPolicy
from rag_stream.errors import InvalidRequest, NotFound
from rag_stream.schemas.events import (
    Citation,
    Done,
    Event,
    JobStarted,
    Outline,
    SectionDone,
    SectionStarted,
    StreamStarted,
    Token,
)
from tests.support.brake import Brake, engine_cores
from tests.support.kb import make_kb
from tests.support.proxy import TcpProxy
from tests.support.server import ServerProcess
from tests.support.waiting import eventually

pytestmark = pytest.mark.engine

DOCS = [
    (
        "The Skerry lighthouse",
        "# The Skerry lighthouse\n\nThe Skerry lighthouse was built in 1872 on a granite reef "
        "off the coast of Vell. Its lamp burned whale oil until 1905, then paraffin.\n\n"
        "## Keepers\n\nThree keepers lived at Skerry in rotation: two on the rock, one ashore.",
    ),
    (
        "The Zorblat river",
        "# The Zorblat river\n\nThe Zorblat river flows through the town of Quimby before "
        "reaching the sea at Vell. Its delta is home to grey herons and otters.",
    ),
]
TITLE = "A short guide to the coast of Vell"
OUTLINE = ["The Skerry lighthouse", "The Zorblat river"]
SECTION_TOKENS = 24
QUICK = RetryPolicy(max_retries=5, backoff_s=0.05, max_backoff_s=0.5)


@pytest.fixture(scope="module")
def server(tiny_server: ServerProcess) -> ServerProcess:
    return tiny_server


@pytest.fixture(scope="module")
def kb(server: ServerProcess) -> str:
    return make_kb(server.url, DOCS, prefix="client-jobs")


def _sections(events: list[Event]) -> dict[int, str]:
    texts: dict[int, str] = {}
    for e in events:
        if isinstance(e, Token):
            assert e.section is not None, e  # a job's tokens say their section
            texts[e.section] = texts.get(e.section, "") + e.text
    return texts


def _check_document_events(events: list[Event], job_id: str, outline: list[str]) -> Done:
    """One stream, contiguous ids, typed events in the documented order; returns its ``done``."""
    assert [e.id for e in events] == list(range(len(events)))
    assert isinstance(events[0], StreamStarted)
    assert isinstance(events[1], JobStarted) and events[1].job_id == job_id
    assert events[1].sections == len(outline)
    assert isinstance(events[2], Outline) and events[2].headings == outline
    started = [(e.index, e.heading) for e in events if isinstance(e, SectionStarted)]
    assert started == list(enumerate(outline))
    assert [e.index for e in events if isinstance(e, SectionDone)] == list(range(len(outline)))
    done = events[-1]
    assert isinstance(done, Done), done
    return done


def _jobs_finished(metrics: str, finish_reason: str) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(metrics)
        if family.name == "rag_stream_streams_finished"
        for sample in family.samples
        if sample.name.endswith("_total")
        and sample.labels.get("kind") == "job"
        and sample.labels.get("finish_reason") == finish_reason
    )


def test_a_job_through_the_client_from_creation_to_deletion(server: ServerProcess, kb: str) -> None:
    with Client(server.url) as client:
        finished_before = _jobs_finished(client.metrics(), "stop")
        older = client.create_job(kb, "Skerry alone", outline=OUTLINE[:1], section_tokens=8)
        job = client.create_job(kb, TITLE, outline=OUTLINE, section_tokens=SECTION_TOKENS, top_k=2)
        assert job.status in ("queued", "running") and job.stream_id is not None
        assert job.title == TITLE and job.outline == OUTLINE
        assert job.section_tokens == SECTION_TOKENS

        stream = client.follow_job(job.id)
        events = list(stream)
        done = _check_document_events(events, job.id, OUTLINE)
        assert done.finish_reason == "stop"
        assert stream.stream_id == job.stream_id
        texts = _sections(events)
        assert any(t.strip() for t in texts.values())

        status = client.get_job(job.id)
        assert status.status == "completed" and status.finished_at is not None
        assert status.progress.sections_done == status.progress.sections_total == 2
        assert status.progress.tokens == done.usage.completion_tokens

        result = client.job_result(job.id)
        assert (result.id, result.title, result.status) == (job.id, TITLE, "completed")
        assert result.complete
        assert [s.heading for s in result.sections] == OUTLINE
        assert [s.text for s in result.sections] == [texts.get(i, "") for i in range(2)]
        cited = {e.chunk_id: e.n for e in events if isinstance(e, Citation)}
        assert cited, "each section cites its sources"
        assert {s.chunk_id: s.n for s in result.sources} == cited

        markdown = client.job_markdown(job.id)
        lines = markdown.splitlines()
        assert lines[0] == f"# {TITLE}"
        assert [line[3:] for line in lines if line.startswith("## ")] == [*OUTLINE, "Sources"]
        for source in result.sources:
            assert f"- [{source.n}] [" in markdown and f"({source.url})" in markdown
        for text in texts.values():
            assert text.strip() in markdown

        # both jobs counted (the server counts a job's end just after logging its done)
        deadline = time.monotonic() + 10
        while _jobs_finished(client.metrics(), "stop") < finished_before + 2:
            assert time.monotonic() < deadline, "the finished jobs never showed in /metrics"
            time.sleep(0.1)
        assert _jobs_finished(client.metrics(), "stop") == finished_before + 2

        first = client.list_jobs(limit=1)
        assert [j.id for j in first.data] == [job.id] and first.limit == 1
        assert first.data[0].status == "completed"
        assert first.next_before is not None
        second = client.list_jobs(limit=1, before=first.next_before)
        assert [j.id for j in second.data] == [older.id]

        client.delete_job(job.id)
        with pytest.raises(NotFound):
            client.get_job(job.id)
        with pytest.raises(NotFound):
            client.job_result(job.id)
        with pytest.raises(NotFound):
            client.job_markdown(job.id)
        listed = {j.id for j in client.list_jobs(limit=100).data}
        assert older.id in listed and job.id not in listed
        client.delete_job(older.id)


def test_following_a_job_rides_out_a_reset_connection(server: ServerProcess, kb: str) -> None:
    notices: list[Reconnect] = []
    events: list[Event] = []
    with (
        Client(server.url) as direct,
        TcpProxy(server.port) as proxy,
        Client(proxy.url, retry=QUICK, on_reconnect=notices.append) as client,
    ):
        # the engine slowed, and stopped at the cut: the job is running when it is cut, however
        # far this reader trails it (tests/support/brake.py)
        with Brake(engine_cores(server.proc.pid)) as brake:
            job = direct.create_job(kb, TITLE, outline=OUTLINE, section_tokens=300)
            for event in client.follow_job(job.id):
                events.append(event)
                if sum(isinstance(e, Token) for e in events) == 3 and not notices:
                    with brake.hold():
                        assert direct.get_job(job.id).status == "running"  # cut a live job
                        assert proxy.drop(reset=True) == 1
                    brake.release()
        whole = list(direct.follow_job(job.id))  # the log, read in one go
        direct.delete_job(job.id)
    assert len(notices) == 1 and notices[0].stream_id == job.stream_id
    _check_document_events(events, job.id, OUTLINE)
    assert events == whole  # nothing repeated, nothing missed


async def test_cancelling_a_job_mid_section_keeps_the_sections_written(
    server: ServerProcess, kb: str
) -> None:
    # Three sections: the cancel goes out once the reader sees the second one begin, and a
    # reader may lag the tiny model by a few hundred tokens on a busy machine; the job must
    # still be running then, in its second section or its third.
    outline = [*OUTLINE, "The town of Quimby"]
    async with AsyncClient(server.url) as client:
        job = await client.create_job(kb, TITLE, outline=outline, section_tokens=300)
        events: list[Event] = []
        cancelled = None
        async for event in client.follow_job(job.id):
            events.append(event)
            in_second = [e for e in events if isinstance(e, Token) and e.section == 1]
            if len(in_second) == 3 and cancelled is None:
                cancelled = await client.cancel_job(job.id)
        assert cancelled is not None, "the job ended before its second section got going"
        assert cancelled.id == job.id and cancelled.status == "cancelled"
        done = events[-1]
        assert isinstance(done, Done) and done.finish_reason == "cancelled"
        assert [e.id for e in events] == list(range(len(events)))
        written = [e.index for e in events if isinstance(e, SectionDone)]
        assert written in ([0], [0, 1]), written

        result = await client.job_result(job.id)
        assert result.status == "cancelled" and not result.complete
        assert [s.index for s in result.sections] == written
        texts = _sections(events)
        assert [s.text for s in result.sections] == [texts[i] for i in written]
        markdown = await client.job_markdown(job.id)
        assert markdown.startswith(f"# {TITLE}\n")
        assert all(f"## {outline[i]}" in markdown for i in written)
        assert f"## {outline[len(written)]}" not in markdown
        assert (await client.get_job(job.id)).status == "cancelled"
        again = await client.cancel_job(job.id)  # a no-op once it ended
        assert again.status == "cancelled"
        assert job.id in {j.id for j in (await client.list_jobs(limit=100)).data}
        await client.delete_job(job.id)
        with pytest.raises(NotFound):
            await client.get_job(job.id)


def _generating(metrics: str) -> float:
    """The streams the server is generating (each one's producer holds its engine request)."""
    families = text_string_to_metric_families(metrics)
    return next(
        sample.value
        for family in families
        if family.name == "rag_stream_active_streams"
        for sample in family.samples
    )


async def test_cancelling_a_job_while_its_outline_is_planned_ends_it_cancelled_at_once(
    server: ServerProcess, kb: str
) -> None:
    """The tiny model's random weights never write an exact outline: a job that goes on
    planning after the cancel retries, then ends ``failed`` (``outline_failed``), as it did
    (the cancel call waited 10 s and answered ``queued``). Planning takes it about 0.7 s here
    (two attempts); the cancel goes out as soon as the job is created, with no reader to wait
    for (one may lag the model on a busy machine)."""
    async with AsyncClient(server.url) as client:
        job = await client.create_job(kb, TITLE, sections=5, section_tokens=8)
        started = time.monotonic()
        answer = await client.cancel_job(job.id)
        took = time.monotonic() - started
        assert answer.status == "cancelled" and answer.error is None, answer
        assert took < 1.0, took
        events = [e async for e in client.follow_job(job.id)]
        # it was planning: it had begun (`job`), and no outline came
        assert [type(e) for e in events] == [StreamStarted, JobStarted, Done], events
        done = events[-1]
        assert isinstance(done, Done) and done.finish_reason == "cancelled"
        await client.delete_job(job.id)

        async def idle() -> bool:
            return _generating(await client.metrics()) == 0

        # nothing runs for it any more, its engine request (aborted) included
        await eventually(idle, "the job's producer ended", timeout_s=5)


def test_job_errors_come_back_typed(server: ServerProcess, kb: str) -> None:
    with Client(server.url) as client:
        with pytest.raises(NotFound) as missing:
            client.create_job("no-such-kb", TITLE, outline=OUTLINE)
        assert missing.value.status_code == 404 and "no-such-kb" in missing.value.message
        with pytest.raises(InvalidRequest) as bad:
            client.create_job(kb, TITLE, outline=["Origins", "  "])
        assert bad.value.status_code == 422 and "heading 1 is empty" in bad.value.message
        with pytest.raises(InvalidRequest) as too_long:
            client.create_job(kb, TITLE, outline=OUTLINE, section_tokens=5000)
        assert "jobs.max_section_tokens" in too_long.value.message
        with pytest.raises(InvalidRequest) as cursor:
            client.list_jobs(before="nope")
        assert "before" in cursor.value.message
        for call in (client.get_job, client.job_result, client.cancel_job, client.delete_job):
            with pytest.raises(NotFound):
                call("nope")
        with pytest.raises(NotFound):
            list(client.follow_job("nope"))


async def test_conversations_are_listed_newest_first_with_their_turns(
    server: ServerProcess, kb: str
) -> None:
    first_q, second_q = "When was the Skerry lighthouse built?", "Where does the Zorblat flow?"
    async with AsyncClient(server.url) as client:
        first = await client.answer(kb, first_q, max_tokens=8)
        second = await client.answer(kb, second_q, max_tokens=8)
        page = await client.list_conversations(limit=1)
        assert [c.id for c in page.data] == [second.conversation_id]
        newest = page.data[0]
        assert (newest.kb, newest.title, newest.turns) == (kb, second_q, 1)
        assert page.limit == 1 and page.next_before is not None
        older = await client.list_conversations(limit=1, before=page.next_before)
        assert [c.id for c in older.data] == [first.conversation_id]
        assert older.data[0].title == first_q

        follow_up = client.ask(
            kb, "And its keepers?", conversation_id=first.conversation_id, max_tokens=8
        )
        async for _ in follow_up:
            pass  # a follow-up turn in the older conversation
        listed = {c.id: c for c in (await client.list_conversations(limit=100)).data}
        assert listed[first.conversation_id].turns == 2
        assert listed[first.conversation_id].updated_at > older.data[0].updated_at
        assert listed[second.conversation_id].turns == 1
