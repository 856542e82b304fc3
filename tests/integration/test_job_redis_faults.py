"""Jobs through Redis faults, on the stub engine with a redis-server of the test's own (the
chaos campaign's Redis rounds found both failures; scripts/chaos.py, docs/reliability.md).

- Redis restarted from its append-only file while a job moves from one section to the next:
  the job goes on and completes, one contiguous log (it used to fail with `internal_error`:
  saving the next section's plan was the one Redis write not retried).
- Redis restarted empty under a running job: the stream ends with `log_lost` and the job's
  row says `failed` (it said `running` for good).
- Redis restarted empty while no process ran the job: the job reads `failed` (`log_lost`),
  in its status and in the list, where it read `running` for good.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from httpx_sse import connect_sse

from tests.conftest import STUB_DELAY_S, ServerFactory
from tests.support.kb import make_kb
from tests.support.redis_server import RedisServer
from tests.support.server import ServerProcess
from tests.support.sse import read_stream

OUTLINE = ["Harbours", "Lights", "Tides"]
SECTION_TOKENS = 400  # 2 s a section at the stub's 5 ms a token
DOCS = [
    ("harbours.md", "# Harbours\n\nThe harbour of Vell shelters forty boats behind its mole."),
    ("lights.md", "# Lights\n\nThe Skerry light shows two white flashes every ten seconds."),
]


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis")
    yield server
    server.kill()


def _server(factory: ServerFactory, redis_url: str, data: Path) -> ServerProcess:
    return factory(data_dir=data, stub_delay_s=STUB_DELAY_S, RAG_STREAM_REDIS_URL=redis_url)


def _start_job(server: ServerProcess, kb: str) -> str:
    body = {"kb": kb, "title": "Vell", "outline": OUTLINE, "section_tokens": SECTION_TOKENS}
    r = httpx.post(f"{server.url}/v1/jobs", json=body, timeout=60)
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def _follow_until(server: ServerProcess, job_id: str, section: int, tokens: int) -> None:
    """Follow the job's events until ``tokens`` tokens of ``section`` have come (the job is
    then running: it has not written that section's end)."""
    seen = 0
    with (
        httpx.Client(base_url=server.url, timeout=60) as client,
        connect_sse(client, "GET", f"/v1/jobs/{job_id}/events") as source,
    ):
        for sse in source.iter_sse():
            if not sse.data:
                continue  # a keep-alive
            assert sse.event not in ("done", "error"), sse.data
            data = json.loads(sse.data)
            if sse.event == "token" and data["section"] == section:
                seen += len(data["token_ids"])
                if seen >= tokens:
                    return
    raise AssertionError("the job's events ended early")


def _row(data: Path, job_id: str) -> tuple[str, str | None]:
    """The job's row as SQL has it (not as the API reports it: that reconciles)."""
    with sqlite3.connect(data / "rag-stream.db") as db:
        status, code = db.execute(
            "SELECT status, error_code FROM jobs WHERE id = ?", (job_id,)
        ).fetchone()
    return str(status), code


def _wait_for_row(data: Path, job_id: str, timeout_s: float = 60) -> tuple[str, str | None]:
    deadline = time.monotonic() + timeout_s
    while (row := _row(data, job_id))[0] in ("queued", "running"):
        assert time.monotonic() < deadline, f"the job's row still says {row}"
        time.sleep(0.2)
    return row


def _job(server: ServerProcess, job_id: str) -> dict[str, Any]:
    return dict(httpx.get(f"{server.url}/v1/jobs/{job_id}", timeout=30).json())


def test_a_job_goes_on_through_a_redis_restart_at_a_section_boundary(
    server_factory: ServerFactory, private_redis: RedisServer, tmp_path: Path
) -> None:
    private_redis.start(persist=True)
    server = _server(server_factory, private_redis.url, tmp_path / "data")
    try:
        job_id = _start_job(server, make_kb(server.url, DOCS, prefix="blip"))
        # 40 tokens (0.2 s) before section 0 ends, Redis goes away for a second: the section
        # ends and the next one is planned while it is down
        _follow_until(server, job_id, 0, SECTION_TOKENS - 40)
        private_redis.kill()
        time.sleep(1.0)
        private_redis.start(persist=True)
        assert _wait_for_row(tmp_path / "data", job_id) == ("completed", None)
        with httpx.Client(base_url=server.url, timeout=60) as client:
            frames = read_stream(client, "GET", f"/v1/jobs/{job_id}/events")
        assert [f.id for f in frames] == list(range(len(frames)))  # one log, no hole
        assert frames[-1].event == "done" and frames[-1].data["finish_reason"] == "stop"
        done = [f.data for f in frames if f.event == "section_done"]
        assert [d["index"] for d in done] == [0, 1, 2]
        assert all(d["tokens"] == SECTION_TOKENS for d in done)
        tokens = [t for f in frames if f.event == "token" for t in f.data["token_ids"]]
        assert len(tokens) == 3 * SECTION_TOKENS  # nothing written twice
    finally:
        server.stop()


def test_a_job_whose_log_is_lost_under_it_fails(
    server_factory: ServerFactory, private_redis: RedisServer, tmp_path: Path
) -> None:
    private_redis.start()
    data = tmp_path / "data"
    server = _server(server_factory, private_redis.url, data)
    try:
        job_id = _start_job(server, make_kb(server.url, DOCS, prefix="lost"))
        _follow_until(server, job_id, 1, 100)
        private_redis.kill()  # and back empty
        time.sleep(0.3)
        private_redis.start()
        assert _wait_for_row(data, job_id) == ("failed", "log_lost")
        job = _job(server, job_id)
        assert job["status"] == "failed" and job["error"]["code"] == "log_lost", job
        result = httpx.get(
            f"{server.url}/v1/jobs/{job_id}/result", params={"format": "json"}, timeout=30
        ).json()
        assert [s["index"] for s in result["sections"]] == [0]  # what was written is kept
        assert result["complete"] is False
    finally:
        server.stop()


def test_a_job_whose_stream_vanished_while_nothing_ran_it_reads_failed(
    server_factory: ServerFactory, private_redis: RedisServer, tmp_path: Path
) -> None:
    private_redis.start()
    data = tmp_path / "data"
    server = _server(server_factory, private_redis.url, data)
    job_id = _start_job(server, make_kb(server.url, DOCS, prefix="vanish"))
    _follow_until(server, job_id, 0, 50)
    server.kill()  # kill -9: the job's row says running
    private_redis.kill()  # and Redis comes back empty: nothing knows the stream any more
    private_redis.start()
    assert _row(data, job_id) == ("running", None)
    again = _server(server_factory, private_redis.url, data)
    try:
        listed = httpx.get(f"{again.url}/v1/jobs", timeout=30).json()["data"]
        mine = next(j for j in listed if j["id"] == job_id)
        assert mine["status"] == "failed" and mine["error"]["code"] == "log_lost", mine
        assert _row(data, job_id) == ("failed", "log_lost")
        assert _job(again, job_id)["status"] == "failed"
        # a job started now runs as ever
        fresh = _start_job(again, make_kb(again.url, DOCS, prefix="after"))
        assert _wait_for_row(data, fresh) == ("completed", None)
    finally:
        again.stop()
