"""A job on the embedded defaults (embedded Redis, SQLite, the local vector store) survives a
kill -9 of the whole service and a restart on the same data directory: the interrupted section
continues from its logged tokens, and the document is the one an uninterrupted run writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import ServerFactory
from tests.integration.test_jobs import (
    JOB,
    OUTLINE,
    _check_document_events,
    _events,
    _Follower,
    _in_section,
    _result,
    _sections,
    _start,
)
from tests.support.jobs_pair import DOCS
from tests.support.kb import make_kb

# Extended (`make test-all`): two whole-service starts on SmolLM2, past CI's budget. CI keeps a
# job's kill -9 takeover on the real engine (test_jobs.py) and a restart on the same data
# directory under a job (test_job_redis_faults.py, on the stub engine).
pytestmark = [pytest.mark.engine, pytest.mark.extended]


def test_a_job_continues_after_the_service_is_killed_and_restarted(
    server_factory: ServerFactory, tmp_path_factory: pytest.TempPathFactory
) -> None:
    data: Path = tmp_path_factory.mktemp("restart-data")
    first = server_factory(data_dir=data)  # the test profile: every store embedded
    kb = make_kb(first.url, [(name, text) for name, text in DOCS.items()], prefix="restart")
    # two sections, the kill in the second: a finished section kept, the interrupted one
    # continued (short ones: each of the two servers is a whole vLLM start already)
    outline = OUTLINE[:2]
    body = {**JOB, "kb": kb, "outline": outline, "section_tokens": 32}
    reference = _start(first, body)
    expected = _events(first, reference["id"])
    job = _start(first, body)
    follower = _Follower(first, job["id"])
    follower.wait_until(_in_section(1, 4))
    first.kill()  # SIGKILL to the service's process group
    before = follower.join()
    # killed mid-section: its last event a token of section 1, whose end never came
    assert before[-1].event == "token" and before[-1].data["section"] == 1, before[-1]
    second = server_factory(data_dir=data)
    try:
        frames = before + _events(second, job["id"], after=before[-1].id)
        _check_document_events(frames, outline)
        assert _sections(frames) == _sections(expected)
        assert (
            _result(second, job["id"])["sections"] == _result(second, reference["id"])["sections"]
        )
    finally:
        second.stop()
