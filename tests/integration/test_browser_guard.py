"""What a web page can make a visitor's browser do to a local server: nothing, unless allowed.

On the service in the test process (tests/support/inprocess.py: paced stub engine, real
Redis), but for /metrics behind a proxy, which needs uvicorn's reading of X-Forwarded-For: a
real server process. Browsers send ``Origin`` on every POST and cannot forge ``Host``; curl and
SDKs send no ``Origin`` and are not affected.
"""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import REDIS_URL, STUB_DELAY_S, ServerFactory
from tests.support.inprocess import BASE_URL, InProcess, InProcessFactory

EVIL = "https://evil.example"

pytestmark = pytest.mark.in_process(delay_s=STUB_DELAY_S, limits__max_tokens=4000)


def _refused(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code


async def test_a_foreign_page_cannot_start_upload_or_cancel(in_process_module: InProcess) -> None:
    http = in_process_module.client
    before = (await http.get("/v1/kbs")).json()["data"]
    evil = {"Origin": EVIL}
    _refused(
        await http.post("/v1/kbs", json={"name": "planted"}, headers=evil), 403, "forbidden_origin"
    )
    _refused(
        await http.post("/v1/generate", json={"prompt": "x", "max_tokens": 2}, headers=evil),
        403,
        "forbidden_origin",
    )
    # a multipart upload is a "simple" request: no preflight would have stopped it
    _refused(
        await http.post(
            "/v1/kbs/docs/documents", files={"file": ("a.txt", b"planted")}, headers=evil
        ),
        403,
        "forbidden_origin",
    )
    live = in_process_module.live
    async with live.stream("POST", "/v1/generate", json={"prompt": "x", "max_tokens": 3000}) as r:
        sid = r.headers["x-stream-id"]  # 15 s of tokens: running while we try to cancel
    _refused(await http.post(f"/v1/streams/{sid}/cancel", headers=evil), 403, "forbidden_origin")
    assert (await http.get(f"/v1/streams/{sid}")).json()["cancel_requested"] is False
    assert (await http.post(f"/v1/streams/{sid}/cancel")).json()["cancelled"]  # no Origin
    assert (await http.get("/v1/kbs")).json()["data"] == before  # nothing was created


async def test_by_default_no_page_gets_cors_headers(in_process_module: InProcess) -> None:
    """Without security.cors_origins no origin is told it may read a response."""
    http = in_process_module.client
    for origin in (EVIL, "null", "http://localhost:3000"):
        read = await http.get("/v1/kbs", headers={"Origin": origin})
        assert read.status_code == 200
        preflight = await http.options(
            "/v1/kbs", headers={"Origin": origin, "Access-Control-Request-Method": "POST"}
        )
        for r in (read, preflight):
            assert not [h for h in r.headers if h.startswith("access-control-")], origin


async def test_the_servers_own_pages_may_post(in_process_module: InProcess) -> None:
    own = {"Origin": BASE_URL}  # the scheme, host and port the client calls
    r = await in_process_module.client.post(
        "/v1/generate", json={"prompt": "x", "max_tokens": 2, "stream": False}, headers=own
    )
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("host", ["evil.example", "rebound.example:8000", "10.0.0.5"])
async def test_foreign_host_names_are_refused_on_loopback(
    in_process_module: InProcess, host: str
) -> None:
    """DNS rebinding: a page's own name resolved to 127.0.0.1 still says its name in Host."""
    http = in_process_module.client
    _refused(await http.get("/v1/kbs", headers={"Host": host}), 400, "untrusted_host")
    ok = await http.get("/v1/kbs", headers={"Host": "localhost"})
    assert ok.status_code == 200


async def test_listed_origins_get_cors_and_may_post(in_process_factory: InProcessFactory) -> None:
    app = "https://app.example"
    async with in_process_factory(security__cors_origins=[app]) as service:
        http = service.client
        preflight = await http.options(
            "/v1/chat/completions",
            headers={
                "Origin": app,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "content-type",
            },
        )
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == app
        body = {
            "model": "stub",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2,
        }
        r = await http.post("/v1/chat/completions", json=body, headers={"Origin": app})
        assert r.status_code == 200, r.text
        assert r.headers["access-control-allow-origin"] == app
        assert "x-stream-id" in r.headers["access-control-expose-headers"].lower()
        _refused(
            await http.post("/v1/chat/completions", json=body, headers={"Origin": EVIL}),
            403,
            "forbidden_origin",
        )


def test_metrics_for_this_machine_only_and_no_api_description(
    server_factory: ServerFactory,
) -> None:
    """The production profile's choices: /metrics on loopback (a client forwarded by a proxy on
    this machine counts as where it came from), /docs and /openapi.json not served."""
    server = server_factory(
        stub_delay_s=0,
        RAG_STREAM_REDIS_URL=REDIS_URL,
        RAG_STREAM_SECURITY__METRICS="loopback",
        RAG_STREAM_SECURITY__DOCS="off",
    )
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            assert http.get("/metrics").status_code == 200
            remote = http.get("/metrics", headers={"X-Forwarded-For": "203.0.113.9"})
            _refused(remote, 404, "not_found")
            for path in ("/docs", "/redoc", "/openapi.json"):
                assert http.get(path).status_code == 404, path
    finally:
        server.stop()
