"""A key sent in a URL's query string does not reach the log: uvicorn's access log, as
`rag-stream serve` sets it up (a real server process on the stub engine, read from its log
file), writes every query value as ``***``."""

from __future__ import annotations

import secrets

import httpx

from tests.conftest import REDIS_URL, ServerFactory
from tests.support.waiting import eventually_sync


def test_query_values_never_reach_the_access_log(server_factory: ServerFactory) -> None:
    server = server_factory(
        stub_delay_s=0, RAG_STREAM_REDIS_URL=REDIS_URL, RAG_STREAM_LOG_LEVEL="info"
    )
    key = f"rsk_{secrets.token_hex(4)}_{secrets.token_urlsafe(24)}"
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            http.get("/v1/kbs", params={"api_key": key, "limit": "5"})
            http.get("/v1/kbs", params={"access_token": key})
            http.get(f"/v1/kbs?{key}")

        def logged() -> str:
            return server.log_path.read_text(errors="replace")

        # the three lines are there (else finding no key would prove nothing)
        eventually_sync(lambda: logged().count('"GET /v1/kbs?') == 3, "three access lines")
        log = logged()
        assert '"GET /v1/kbs?api_key=***&limit=*** HTTP/1.1" 200' in log, log
        assert '"GET /v1/kbs?access_token=*** HTTP/1.1" 200' in log, log
        assert '"GET /v1/kbs?*** HTTP/1.1" 200' in log, log
        assert key not in log and key[:12] not in log
    finally:
        server.stop()
