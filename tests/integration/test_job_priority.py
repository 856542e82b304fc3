"""A job's engine requests run at ``batch`` priority, where an ordinary generation runs at
``interactive`` (the real service on the stub engine, which records what reaches it; the engine
taking the lower number first is tests/integration/test_priorities.py, on real vLLM)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from tests.conftest import REDIS_URL, ServerFactory
from tests.support.kb import make_kb
from tests.support.sse import Frame, read_stream

DOCS = [("harbours.md", "# Harbours\n\nThe harbour of Vell shelters forty boats behind its mole.")]


def _requests(log: Path) -> list[dict[str, object]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def _job(http: httpx.Client, body: dict[str, object]) -> list[Frame]:
    r = http.post("/v1/jobs", json={**body, "section_tokens": 8})
    assert r.status_code == 202, r.text
    return read_stream(http, "GET", f"/v1/jobs/{r.json()['id']}/events")


def test_a_job_asks_the_engine_at_batch_priority(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    log = tmp_path / "requests.jsonl"
    server = server_factory(
        stub_delay_s=0.001, RAG_STREAM_REDIS_URL=REDIS_URL, STUB_REQUEST_LOG=str(log)
    )
    try:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            r = http.post("/v1/generate", json={"prompt": "Hi", "max_tokens": 4, "stream": False})
            assert r.status_code == 200, r.text
            assert [q["priority"] for q in _requests(log)] == [0]  # interactive
            kb = make_kb(server.url, DOCS, prefix="priority")
            written = _job(http, {"kb": kb, "title": "Vell", "outline": ["Harbours", "Boats"]})
            assert written[-1].event == "done", written[-1]
            sections = _requests(log)[1:]
            assert len(sections) == 2  # one a section
            # planned by the model first: the stub's reply is no outline, so both attempts run
            # and the job fails, but at batch priority too
            planned = _job(http, {"kb": kb, "title": "Vell", "sections": 2})
            assert planned[-1].event == "error", planned[-1]
            plans = _requests(log)[3:]
        assert len(plans) == 2
        assert all(q["priority"] == 1 for q in sections + plans), sections + plans  # batch
    finally:
        server.stop()
