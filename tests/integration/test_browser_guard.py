"""What a web page can make a visitor's browser do to a local server: nothing, unless allowed.

On the real service (paced stub engine, real Redis). Browsers send ``Origin`` on every POST and
cannot forge ``Host``; curl and SDKs send no ``Origin`` and are not affected.
"""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import REDIS_URL, ServerFactory
from tests.support.server import ServerProcess

EVIL = "https://evil.example"


def _refused(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code


def test_a_foreign_page_cannot_start_upload_or_cancel(stub_server: ServerProcess) -> None:
    with httpx.Client(base_url=stub_server.url, timeout=30) as http:
        before = http.get("/v1/kbs").json()["data"]
        evil = {"Origin": EVIL}
        _refused(
            http.post("/v1/kbs", json={"name": "planted"}, headers=evil), 403, "forbidden_origin"
        )
        _refused(
            http.post("/v1/generate", json={"prompt": "x", "max_tokens": 2}, headers=evil),
            403,
            "forbidden_origin",
        )
        # a multipart upload is a "simple" request: no preflight would have stopped it
        _refused(
            http.post(
                "/v1/kbs/docs/documents", files={"file": ("a.txt", b"planted")}, headers=evil
            ),
            403,
            "forbidden_origin",
        )
        with http.stream("POST", "/v1/generate", json={"prompt": "x", "max_tokens": 3000}) as r:
            sid = r.headers["x-stream-id"]  # 15 s of tokens: running while we try to cancel
        _refused(http.post(f"/v1/streams/{sid}/cancel", headers=evil), 403, "forbidden_origin")
        assert http.get(f"/v1/streams/{sid}").json()["cancel_requested"] is False
        assert http.post(f"/v1/streams/{sid}/cancel").json()["cancelled"]  # no Origin: a client
        assert http.get("/v1/kbs").json()["data"] == before  # nothing was created


def test_by_default_no_page_gets_cors_headers(stub_server: ServerProcess) -> None:
    """Without security.cors_origins no origin is told it may read a response."""
    with httpx.Client(base_url=stub_server.url, timeout=30) as http:
        for origin in (EVIL, "null", "http://localhost:3000"):
            read = http.get("/v1/kbs", headers={"Origin": origin})
            assert read.status_code == 200
            preflight = http.options(
                "/v1/kbs", headers={"Origin": origin, "Access-Control-Request-Method": "POST"}
            )
            for r in (read, preflight):
                assert not [h for h in r.headers if h.startswith("access-control-")], origin


def test_the_servers_own_pages_may_post(stub_server: ServerProcess) -> None:
    own = {"Origin": stub_server.url}
    r = httpx.post(
        f"{stub_server.url}/v1/generate",
        json={"prompt": "x", "max_tokens": 2, "stream": False},
        headers=own,
        timeout=30,
    )
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("host", ["evil.example", "rebound.example:8000", "10.0.0.5"])
def test_foreign_host_names_are_refused_on_loopback(stub_server: ServerProcess, host: str) -> None:
    """DNS rebinding: a page's own name resolved to 127.0.0.1 still says its name in Host."""
    r = httpx.get(f"{stub_server.url}/v1/kbs", headers={"Host": host}, timeout=30)
    _refused(r, 400, "untrusted_host")
    ok = httpx.get(f"{stub_server.url}/v1/kbs", headers={"Host": "localhost"}, timeout=30)
    assert ok.status_code == 200


def test_listed_origins_get_cors_and_may_post(server_factory: ServerFactory) -> None:
    app = "https://app.example"
    server = server_factory(
        stub_delay_s=0,
        RAG_STREAM_REDIS_URL=REDIS_URL,
        RAG_STREAM_SECURITY__CORS_ORIGINS=f'["{app}"]',
    )
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            preflight = http.options(
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
            r = http.post("/v1/chat/completions", json=body, headers={"Origin": app})
            assert r.status_code == 200, r.text
            assert r.headers["access-control-allow-origin"] == app
            assert "x-stream-id" in r.headers["access-control-expose-headers"].lower()
            _refused(
                http.post("/v1/chat/completions", json=body, headers={"Origin": EVIL}),
                403,
                "forbidden_origin",
            )
    finally:
        server.stop()


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
