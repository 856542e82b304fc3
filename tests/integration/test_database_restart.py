"""PostgreSQL stopped and started again under running streams (found by the chaos campaign,
scripts/chaos.py): an answer whose end came while the database was down ended with
``internal_error`` although its text was whole, and a request during the restart failed with a
500 (or an "Exception in ASGI application" after its response). Now the answer's end waits for
the database and the request gets a 503 ``database_unavailable``."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import REDIS_URL, SESSION_PREFIX, ServerFactory
from tests.support.own_pg import OwnPostgres
from tests.support.server import ServerProcess
from tests.support.sse import Frame, read_stream, text_of

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


def test_an_answer_ending_while_the_database_is_down_waits_for_it(
    server_factory: ServerFactory, pg: OwnPostgres
) -> None:
    server: ServerProcess = server_factory(
        stub_delay_s=0.01,  # 100 tokens a second
        RAG_STREAM_DATABASE_URL=pg.url,
        RAG_STREAM_REDIS_URL=REDIS_URL,
        RAG_STREAM_STREAMING__KEY_PREFIX=f"{SESSION_PREFIX}-pg-{uuid.uuid4().hex[:6]}",
        RAG_STREAM_LIMITS__MAX_TOKENS="4000",
    )
    with httpx.Client(base_url=server.url, timeout=60) as client:
        client.post("/v1/kbs", json={"name": KB}).raise_for_status()
        doc = {"title": "Herons", "text": "Herons nest in the reed beds of the delta each spring."}
        client.post(f"/v1/kbs/{KB}/documents", json=doc).raise_for_status()
    frames: list[Frame] = []
    body = {"kb": KB, "question": "Where do herons nest?", "max_tokens": 300}

    def read() -> None:
        with httpx.Client(base_url=server.url, timeout=120) as client:
            read_stream(client, "POST", "/v1/answers", json=body, on_frame=frames.append)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + 60
    while sum(f.event == "token" for f in frames) < 5:
        assert time.monotonic() < deadline, frames
        time.sleep(0.01)
    pg.stop()  # the stream runs ~3 s more and ends while the database is down
    try:
        time.sleep(4.0)
        assert reader.is_alive() and frames[-1].event == "token", frames[-1:]  # waiting for it
        r = httpx.get(f"{server.url}/v1/kbs", timeout=30)
        assert r.status_code == 503, r.text  # not a 500
        assert r.json()["error"]["code"] == "database_unavailable"
    finally:
        pg.start()
    reader.join(60)
    assert frames[-1].event == "done", frames[-1]  # not an error: the answer was whole
    conversation = frames[0].data["conversation_id"]
    saved = httpx.get(f"{server.url}/v1/conversations/{conversation}", timeout=30)
    saved.raise_for_status()
    assert saved.json()["messages"][-1]["content"] == text_of(frames)
    # the key check of the request above met the refused connection first: answered 503 and
    # not re-raised after the response
    log = server.log_path.read_text(errors="replace")
    assert "Exception in ASGI application" not in log, server.log_tail()
