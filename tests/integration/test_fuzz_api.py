"""A bounded schemathesis run against a real server process that requires API keys: every
operation in /openapi.json with a valid key, positive and negative inputs, then stateful
sequences along the links schemathesis infers (create a KB, then read, search, upload to and
delete it; start a job, then follow, read and cancel it...); then every operation without a
valid key. Every answer must be no 5xx, of a status and media type the operation documents, and
valid against its schema (each SSE frame too). What it checks and why: tests/support/fuzz.py;
scripts/fuzz.sh runs the same, longer.

The server runs the stub engine without pacing (no vLLM: streams end in milliseconds) and
small jobs, so no operation needs excluding; once on SQLite, once on PostgreSQL.
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
MAX_EXAMPLES = 25  # per operation and phase: about 2,000 requests, half a minute here
# Reached past the 404s and 422s at least once (the seeded ids and bindings work).
REACHED = ("POST /v1/jobs", "POST /v1/chat/completions", "GET /v1/kbs/{kb}/chunks/{chunk_id}")


# PostgreSQL's run is extended (`make test-all`): CI fuzzes on SQLite, and checks on PostgreSQL
# what only it refuses (test_input_bounds.py::test_nul_characters_never_reach_postgresql_as_such).
@pytest.fixture(
    scope="module",
    params=["sqlite", pytest.param("postgresql", marks=pytest.mark.extended)],
)
def server(
    request: pytest.FixtureRequest,
    server_factory: ServerFactory,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ServerProcess, str]]:
    """On SQLite, and on PostgreSQL: the production database, which refuses some text that
    SQLite stores (NUL characters). With the server's key for the fuzzer."""
    data = tmp_path_factory.mktemp("fuzz")
    env = {"RAG_STREAM_REDIS_URL": REDIS_URL, **fuzz.SERVER_ENV}
    databases = postgres_database("rag_stream_fuzz")
    if request.param == "postgresql":
        env["RAG_STREAM_DATABASE_URL"] = next(databases)
    server = server_factory(stub_delay_s=0, data_dir=data, **env)
    key = fuzz.create_key({**env, "RAG_STREAM_PROFILE": "test", "RAG_STREAM_DATA_DIR": str(data)})
    yield server, key
    server.stop()
    databases.close()


def test_fuzzing_finds_no_server_error_and_no_schema_violation(
    server: tuple[ServerProcess, str], tmp_path: Path
) -> None:
    process, key = server
    report, output, ids = fuzz.run(process.url, tmp_path, key, max_examples=MAX_EXAMPLES, seed=SEED)
    assert report["complete"], output[-5000:]
    assert not report["errors"], output[-5000:]
    # the console output has a curl command reproducing each failure
    assert not report["failures"], output[-20000:]
    assert report["operations"]["tested"] == report["operations"]["total"] >= 31
    assert report["test_cases"]["generated"] >= 1500
    assert report["phases"]["stateful"]["status"] == "success"
    for operation in REACHED:
        accepted = sum(p["accepted"] for p in report["valid_rates"][operation].values())
        assert accepted > 0, (operation, report["valid_rates"][operation])
    # and without a valid key: a 401 from every operation but the health checks
    sent, problems = fuzz.auth_problems(process.url, key, ids)
    assert not problems
    assert sent >= 7 * 29
    assert httpx.get(process.url + "/readyz", timeout=10).status_code == 200
