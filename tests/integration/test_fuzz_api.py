"""A bounded schemathesis run against a real server process: every operation in /openapi.json,
positive and negative inputs, then stateful sequences along the links schemathesis infers
(create a KB, then read, search, upload to and delete it...). What it checks and why:
tests/support/fuzz.py; scripts/fuzz.sh runs the same, longer.

The server runs the stub engine without pacing (no vLLM: streams end in milliseconds), so no
operation needs excluding; once on SQLite, once on PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import REDIS_URL, ServerFactory
from tests.support import fuzz
from tests.support.pg import postgres_database
from tests.support.server import ServerProcess

SEED = 20261130
MAX_EXAMPLES = 25  # per operation and phase: about 900 requests, under a minute here


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def server(
    request: pytest.FixtureRequest, server_factory: ServerFactory
) -> Iterator[ServerProcess]:
    """On SQLite, and on PostgreSQL: the production database, which refuses some text that
    SQLite stores (NUL characters)."""
    env = {"RAG_STREAM_REDIS_URL": REDIS_URL}
    databases = postgres_database("rag_stream_fuzz")
    if request.param == "postgresql":
        env["RAG_STREAM_DATABASE_URL"] = next(databases)
    server = server_factory(stub_delay_s=0, **env)
    yield server
    server.stop()
    databases.close()


def test_fuzzing_finds_no_server_error_and_no_schema_violation(
    server: ServerProcess, tmp_path: Path
) -> None:
    report, output = fuzz.run(server.url, tmp_path, max_examples=MAX_EXAMPLES, seed=SEED)
    assert report["complete"], output[-5000:]
    assert not report["errors"], output[-5000:]
    # the console output has a curl command reproducing each failure
    assert not report["failures"], output[-20000:]
    assert report["operations"]["tested"] == report["operations"]["total"] > 0
    assert report["test_cases"]["generated"] >= 300
    assert report["phases"]["stateful"]["status"] == "success"
    assert httpx.get(server.url + "/readyz", timeout=10).status_code == 200
