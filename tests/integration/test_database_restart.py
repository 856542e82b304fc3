"""PostgreSQL stopped and started again under running streams (found by the chaos campaign,
scripts/chaos.py): an answer whose end came while the database was down ended with
``internal_error`` although its text was whole, and a request during the restart failed with a
500 (or an "Exception in ASGI application" after its response). Now the answer's end waits for
the database and the request gets a 503 ``database_unavailable``. On the service in the test
process (tests/support/inprocess.py), where an exception the app raises after its response
reaches the test instead of uvicorn's log."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import SESSION_PREFIX
from tests.support.inprocess import InProcessFactory, read_stream
from tests.support.own_pg import OwnPostgres
from tests.support.sse import Frame, text_of

KB = "herons"


@pytest.fixture(scope="module")
def pg() -> Iterator[OwnPostgres]:
    base = Path(tempfile.mkdtemp(prefix="rs-own-pg-"))  # not under pytest's root-only folder:
    shutil.chown(base, "postgres", "postgres")  # PostgreSQL runs as its own user
    own = OwnPostgres(base / "pg")
    own.start()
    try:
        yield own
    finally:
        own.stop()
        shutil.rmtree(base, ignore_errors=True)


async def test_an_answer_ending_while_the_database_is_down_waits_for_it(
    in_process_factory: InProcessFactory, pg: OwnPostgres
) -> None:
    async with (
        in_process_factory(
            delay_s=0.01,  # 100 tokens a second
            database_url=pg.url,
            streaming__key_prefix=f"{SESSION_PREFIX}-pg-{uuid.uuid4().hex[:6]}",
            limits__max_tokens=4000,
        ) as service
    ):
        client = service.client
        (await client.post("/v1/kbs", json={"name": KB})).raise_for_status()
        doc = {"title": "Herons", "text": "Herons nest in the reed beds of the delta each spring."}
        (await client.post(f"/v1/kbs/{KB}/documents", json=doc)).raise_for_status()
        frames: list[Frame] = []
        body = {"kb": KB, "question": "Where do herons nest?", "max_tokens": 300}
        reader = asyncio.create_task(
            read_stream(service.live, "POST", "/v1/answers", json=body, on_frame=frames.append)
        )
        deadline = time.monotonic() + 60
        while sum(f.event == "token" for f in frames) < 5:
            assert time.monotonic() < deadline, frames
            assert not reader.done(), reader
            await asyncio.sleep(0.01)
        await asyncio.to_thread(pg.stop)  # the stream runs ~3 s more, ends while it is down
        try:
            await asyncio.sleep(4.0)
            # waiting for it
            assert not reader.done() and frames[-1].event == "token", frames[-1:]
            # the key check meets the refused connection first: a 503, not a 500, and nothing
            # raised after the response (the transport would raise it here)
            r = await client.get("/v1/kbs")
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "database_unavailable"
        finally:
            await asyncio.to_thread(pg.start)
        await asyncio.wait_for(reader, 60)  # (it raises what the app raised, if anything)
        assert frames[-1].event == "done", frames[-1]  # not an error: the answer was whole
        conversation = frames[0].data["conversation_id"]
        saved = await client.get(f"/v1/conversations/{conversation}")
        saved.raise_for_status()
        assert saved.json()["messages"][-1]["content"] == text_of(frames)
