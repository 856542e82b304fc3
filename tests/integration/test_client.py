"""rag_stream.client against a real server through a TCP proxy that cuts every connection
mid-stream: the caller still sees one clean stream, with the text an uninterrupted run of the
same request gives. The server is the suite's tiny-model one (vLLM, float32, greedy): what is
checked is the protocol, not the prose, and it decodes hundreds of tokens a second where
SmolLM2 decodes 17."""

from __future__ import annotations

import re

import pytest

from rag_stream.client import AsyncClient, Client, Reconnect, RetryPolicy
from rag_stream.errors import InvalidRequest, NotFound
from rag_stream.schemas.events import Citation, Done, Event, StreamStarted, Token
from tests.support.brake import Brake, engine_cores
from tests.support.kb import make_kb
from tests.support.proxy import TcpProxy
from tests.support.server import ServerProcess

pytestmark = pytest.mark.engine

DOCS = [
    (
        "Lighthouses",
        "# Lighthouses\n\nThe Skerry lighthouse was built in 1872 on a granite reef. Its lamp "
        "burned whale oil until 1905, then paraffin, and it was automated in 1987.\n\n"
        "## Keepers\n\nThree keepers lived at Skerry in rotation, four weeks on and two weeks "
        "off. They wound the clockwork that turned the lens every two hours through the night.",
    ),
    (
        "Rivers",
        "# Rivers\n\nThe Zorblat river flows through the town of Quimby before reaching the sea."
        "\n\nIts delta is home to many herons.",
    ),
]
QUESTION = "Describe the Skerry lighthouse and the life of its keepers."
MAX_TOKENS = 400  # about a second on the tiny model; the cuts slow it (tests/support/brake.py)
CUT_AT_TOKEN = 5  # token events received before the connection is cut
QUICK = RetryPolicy(max_retries=5, backoff_s=0.05, max_backoff_s=0.5)


@pytest.fixture(scope="module")
def server(tiny_server: ServerProcess) -> ServerProcess:
    return tiny_server


@pytest.fixture(scope="module")
def kb(server: ServerProcess) -> str:
    return make_kb(server.url, DOCS, prefix="client")


@pytest.fixture(scope="module")
def reference(server: ServerProcess, kb: str) -> list[Event]:
    """The same request, uninterrupted."""
    with Client(server.url) as client:
        events = list(client.ask(kb, QUESTION, max_tokens=MAX_TOKENS))
    tokens = [e for e in events if isinstance(e, Token)]
    # the cut must fall well inside the answer for the test to mean anything
    assert len(tokens) >= 3 * CUT_AT_TOKEN, events
    return events


def _text(events: list[Event]) -> str:
    return "".join(e.text for e in events if isinstance(e, Token))


def _assert_same_answer(events: list[Event], reference: list[Event]) -> None:
    assert [e.id for e in events] == list(range(len(events)))  # one stream, nothing twice
    assert isinstance(events[0], StreamStarted)
    assert sum(isinstance(e, StreamStarted | Done) for e in events) == 2
    done, ref_done = events[-1], reference[-1]
    assert isinstance(done, Done) and isinstance(ref_done, Done)
    assert _text(events) == _text(reference)
    cited = [e.chunk_id for e in events if isinstance(e, Citation)]
    assert cited == [e.chunk_id for e in reference if isinstance(e, Citation)]
    assert done.finish_reason == ref_done.finish_reason
    assert done.usage.completion_tokens == ref_done.usage.completion_tokens


async def test_async_client_rides_out_cut_connections(
    server: ServerProcess, kb: str, reference: list[Event]
) -> None:
    notices: list[Reconnect] = []
    events: list[Event] = []
    with TcpProxy(server.port) as proxy:
        async with (
            AsyncClient(proxy.url, retry=QUICK, on_reconnect=notices.append) as client,
            AsyncClient(server.url) as direct,
        ):
            # the engine slowed, and stopped at the cut: the stream is live when it is cut,
            # however far this reader trails it (tests/support/brake.py)
            with Brake(engine_cores(server.proc.pid)) as brake:
                stream = client.ask(kb, QUESTION, max_tokens=MAX_TOKENS)
                async for event in stream:
                    events.append(event)
                    if sum(isinstance(e, Token) for e in events) == CUT_AT_TOKEN and not notices:
                        assert stream.stream_id is not None
                        with brake.hold():
                            status = await direct.stream_status(stream.stream_id)
                            assert status.status == "running", status  # cut a live stream
                            assert status.finish_reason is None
                            proxy.refuse_next(2)  # the first two reconnections fail as well
                            assert proxy.drop() == 1
                        brake.release()
        assert proxy.accepted == 4  # the start, two refused, the resume that finished it
    _assert_same_answer(events, reference)
    assert [n.attempt for n in notices] == [1, 2, 3]
    # events already in the client's buffer at the cut were passed on; the rest came again
    assert _cut_id(events) <= notices[0].last_event_id < events[-1].id
    assert notices[1].delay_s > notices[0].delay_s  # backing off


def _cut_id(events: list[Event]) -> int:
    """The id of the event at which the connection was cut."""
    tokens = [e for e in events if isinstance(e, Token)]
    return tokens[CUT_AT_TOKEN - 1].id


def test_sync_client_rides_out_a_reset_connection(
    server: ServerProcess, kb: str, reference: list[Event]
) -> None:
    notices: list[Reconnect] = []
    events: list[Event] = []
    with (
        TcpProxy(server.port) as proxy,
        Client(proxy.url, retry=QUICK, on_reconnect=notices.append) as client,
        Client(server.url) as direct,
        Brake(engine_cores(server.proc.pid)) as brake,
    ):  # as above
        stream = client.ask(kb, QUESTION, max_tokens=MAX_TOKENS)
        for event in stream:
            events.append(event)
            if sum(isinstance(e, Token) for e in events) == CUT_AT_TOKEN and not notices:
                assert stream.stream_id is not None
                with brake.hold():
                    assert direct.stream_status(stream.stream_id).status == "running"
                    assert proxy.drop(reset=True) == 1
                brake.release()
    _assert_same_answer(events, reference)
    assert len(notices) == 1
    assert _cut_id(events) <= notices[0].last_event_id < events[-1].id


def test_a_start_whose_answer_is_lost_goes_again_and_reads_the_stream_it_began(
    server: ServerProcess, kb: str, reference: list[Event]
) -> None:
    notices: list[Reconnect] = []
    with (
        TcpProxy(server.port) as proxy,
        Client(proxy.url, retry=QUICK, on_reconnect=notices.append) as client,
    ):
        proxy.lose_next_answer()  # the request reaches the server; its answer is cut
        stream = client.ask(kb, QUESTION, max_tokens=MAX_TOKENS)
        events = list(stream)
    assert len(proxy.lost) == 1 and proxy.lost[0].startswith(b"HTTP/1.1 200")
    # the server had started the stream; the start, sent again with its Idempotency-Key,
    # read that stream from its first event rather than starting another
    header = rf"\r\n(?i:x-stream-id): {re.escape(str(stream.stream_id))}\r\n"
    assert re.search(header.encode(), proxy.lost[0])
    assert [n.stream_id for n in notices] == [None]
    _assert_same_answer(events, reference)


def test_follow_continues_a_stream_from_a_given_event(
    server: ServerProcess, kb: str, reference: list[Event]
) -> None:
    with Client(server.url) as client:
        first: list[Event] = []
        with client.ask(kb, QUESTION, max_tokens=MAX_TOKENS) as stream:
            for event in stream:
                first.append(event)
                if isinstance(event, Token):
                    break  # the caller walks away; the stream goes on on the server
        assert stream.stream_id is not None
        rest = list(client.follow(stream.stream_id, after=first[-1].id))
    _assert_same_answer(first + rest, reference)


def test_errors_come_back_typed(server: ServerProcess, kb: str) -> None:
    with Client(server.url) as client:
        with pytest.raises(NotFound) as missing:
            client.get_kb("no-such-kb")
        assert missing.value.status_code == 404 and "no-such-kb" in missing.value.message
        with pytest.raises(NotFound):
            list(client.follow("no-such-stream"))
        with pytest.raises(InvalidRequest) as bad:
            list(client.ask(kb, QUESTION, max_tokens=9999))  # over the server's limit (512)
        assert bad.value.status_code == 422 and "max_tokens" in bad.value.message


async def test_cancel_mid_stream_ends_it_cancelled(server: ServerProcess, kb: str) -> None:
    async with AsyncClient(server.url) as client:
        events: list[Event] = []
        question = "Write a long, detailed essay about lighthouses, their history and keepers."
        outcome = None
        # the engine slowed, and stopped for the cancel: the stream is still running when the
        # cancel comes, however far this reader trails it (tests/support/brake.py)
        with Brake(engine_cores(server.proc.pid)) as brake:
            async for event in client.ask(kb, question, max_tokens=400):
                events.append(event)
                # once: the event after the third token may be the `done` the cancel brought
                if sum(isinstance(e, Token) for e in events) == 3 and outcome is None:
                    assert isinstance(events[0], StreamStarted)
                    with brake.hold():
                        outcome = await client.cancel(events[0].stream_id)
                    brake.release()
                    assert outcome.cancelled, outcome  # it was still running
        done = events[-1]
        assert isinstance(done, Done) and done.finish_reason == "cancelled"
        assert done.usage.completion_tokens < 400
        assert [e.id for e in events] == list(range(len(events)))
        status = await client.stream_status(events[0].stream_id)
        assert (status.status, status.finish_reason) == ("done", "cancelled")


def test_the_rest_of_the_api_answers_with_typed_results(server: ServerProcess, kb: str) -> None:
    with Client(server.url) as client:
        assert client.healthz() and client.readyz().ready
        assert kb in [k.name for k in client.list_kbs()]
        tides = ("tides.md", b"# Tides\n\nSpring tides follow full moons and new moons.")
        made = client.upload_file(kb, tides, title="Tides")
        assert made.created and made.title == "Tides"
        page = client.list_documents(kb)
        assert made.id in [d.id for d in page.data] and page.total == len(DOCS) + 1
        hits = client.search(kb, "when are spring tides", top_k=2)
        assert hits.results[0].document_id == made.id
        chunk = client.get_chunk(kb, hits.results[0].chunk_id)
        assert chunk.document.id == made.id and "full moons" in chunk.text
        doc = client.get_document(kb, made.id, include_chunks=True)
        assert doc.chunks is not None and doc.text.startswith("# Tides")
        answer = client.answer(kb, "When are spring tides?", max_tokens=20)
        conversation = client.conversation(answer.conversation_id)
        assert conversation.messages[-1].content == answer.answer
        assert client.stream_status(answer.stream_id).status == "done"
        assert client.usage().total.requests >= 1
        assert f"kb:{kb}" in [m.id for m in client.models().data]
        assert client.model(f"kb:{kb}").kb == kb
        client.delete_document(kb, made.id)
        with pytest.raises(NotFound):
            client.get_document(kb, made.id)
