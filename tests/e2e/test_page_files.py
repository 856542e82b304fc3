"""The files the chat page is made of: served from the package with the right types and cache
headers, and nothing else (no other path, no directory listing). No browser or engine needed:
these routes use none of the app's resources, so the app runs without its lifespan."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from rag_stream.app import create_app
from rag_stream.settings import load_settings


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    app = create_app(load_settings(profile="test"))
    # a loopback Host: the browser guard answers only to those on a loopback server
    with_host = TestClient(app, base_url="http://127.0.0.1:8000")
    yield with_host
    with_host.close()


@pytest.mark.parametrize(
    ("path", "media_type"),
    [
        ("/", "text/html; charset=utf-8"),
        ("/static/app.js", "text/javascript; charset=utf-8"),
        ("/static/sse.js", "text/javascript; charset=utf-8"),
        ("/static/style.css", "text/css; charset=utf-8"),
    ],
)
def test_page_files_have_their_types_and_revalidate(
    client: TestClient, path: str, media_type: str
) -> None:
    r = client.get(path)
    assert r.status_code == 200
    assert r.headers["content-type"] == media_type
    assert r.headers["cache-control"] == "no-cache"
    assert r.headers["x-content-type-options"] == "nosniff"
    again = client.get(path, headers={"If-None-Match": r.headers["etag"]})
    assert again.status_code == 304 and again.content == b""


def test_the_page_loads_only_its_own_scripts(client: TestClient) -> None:
    r = client.get("/")
    assert '<script type="module" src="/static/app.js">' in r.text
    policy = r.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "connect-src 'self'" in policy


@pytest.mark.parametrize(
    "path",
    [
        "/static/",
        "/static/nope.js",
        "/static/%2e%2e/api/web.py",
        "/static/..%2fapi%2fweb.py",
        "/static/%2e%2e%2f%2e%2e%2fpyproject.toml",
        "/static//etc/passwd",
        "/static/app.js/",
        "/index.html",
    ],
)
def test_nothing_else_is_served(client: TestClient, path: str) -> None:
    r = client.get(path)
    assert r.status_code == 404, (path, r.text[:200])
    assert r.json()["error"]["code"] == "not_found"


def test_the_page_answers_only_to_trusted_hosts(client: TestClient) -> None:
    """The DNS-rebinding guard covers the page as every other route."""
    assert client.get("/").status_code == 200
    foreign = client.get("/", headers={"Host": "evil.example"})
    assert foreign.status_code == 400 and foreign.json()["error"]["code"] == "untrusted_host"
