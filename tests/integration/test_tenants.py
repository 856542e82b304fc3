"""API keys and tenants on a `serve`-like process with the paced stub engine, real Redis and
PostgreSQL: what these tests check happens before and around generation (tests/e2e's chat page
runs keys on vLLM).

Two tenants, ``alpha`` and ``beta``, each with a key made by ``rag-stream keys create``: keys
that are wrong, revoked or missing on every keyed route (``CROSS_TENANT``), keys kept out of
the log, and the limits (per tenant, per key, per process). What one tenant can reach of
another's, route by route, is the cross-tenant table in tests/support/tenant_probes.py, run by
tests/integration/test_security.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from rag_stream.store.keys import KeyRing
from tests.conftest import REDIS_URL, ServerFactory
from tests.support.server import ROOT, ServerProcess
from tests.support.session_servers import TENANTS_PREFIX, KeyedServer
from tests.support.tenant_probes import CROSS_TENANT
from tests.support.waiting import eventually_sync

PREFIX = TENANTS_PREFIX  # this server's keys in the shared Redis


def make_key(env: dict[str, str], tenant: str, name: str | None = None) -> tuple[str, str]:
    """(key id, key) from the real CLI."""
    args = [sys.executable, "-m", "rag_stream", "keys", "create", "--tenant", tenant]
    if name:
        args += ["--name", name]
    out = subprocess.run(args, env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    header, key = out.stdout.strip().splitlines()
    return header.split()[2], key


@dataclass
class Tenants:
    server: ServerProcess
    env: dict[str, str]
    alpha: httpx.Client
    beta: httpx.Client
    keys: dict[str, str]  # tenant -> key
    kb: str  # alpha's knowledge base (name), with a document and an answered question


@pytest.fixture(scope="module")
def tenant_server(tenant_server_start: KeyedServer) -> tuple[ServerProcess, dict[str, str]]:
    """Started a module ahead (tests/support/session_servers.py)."""
    tenant_server_start.server.wait_ready()
    return tenant_server_start.server, {**os.environ, **tenant_server_start.env}


def _client(server: ServerProcess, key: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=server.url, headers=headers, timeout=120)


@pytest.fixture(scope="module")
def tenants(tenant_server: tuple[ServerProcess, dict[str, str]]) -> Iterator[Tenants]:
    server, env = tenant_server
    keys = {t: make_key(env, t, f"{t} test key")[1] for t in ("alpha", "beta")}
    alpha, beta = _client(server, keys["alpha"]), _client(server, keys["beta"])
    kb = f"shared-name-{uuid.uuid4().hex[:6]}"
    created = alpha.post("/v1/kbs", json={"name": kb})
    assert created.status_code == 201, created.text
    doc = alpha.post(
        f"/v1/kbs/{kb}/documents",
        json={"title": "Herons", "text": "Herons nest in the Zorblat delta every spring."},
    )
    assert doc.status_code == 201, doc.text
    answer = alpha.post(
        "/v1/answers",
        json={"kb": kb, "question": "Where do herons nest?", "stream": False, "max_tokens": 8},
    )
    assert answer.status_code == 200, answer.text
    yield Tenants(
        server=server,
        env=env,
        alpha=alpha,
        beta=beta,
        keys=keys,
        kb=kb,
    )
    alpha.close()
    beta.close()


LONG = {
    "model": "stub",
    "messages": [{"role": "user", "content": "Count."}],
    "max_tokens": 7900,
    "ignore_eos": True,
    "stream": True,
    # few events: five such streams would otherwise write a thousand events a second to the
    # shared Redis
    "coalesce": {"tokens": 32, "ms": 500},
}


def _start_long(client: httpx.Client) -> str:
    """A generation long enough to be running while the test does things around it."""
    with client.stream("POST", "/v1/chat/completions", json=LONG) as r:
        assert r.status_code == 200, r.read()
        sid = r.headers["X-Stream-Id"]
    status = client.get(f"/v1/streams/{sid}").json()
    assert status["status"] == "running", status
    return sid


def _path(route: tuple[str, str]) -> str:
    return route[1].format(
        kb="x",
        chunk_id="x",
        doc="x",
        stream_id="x",
        conversation_id="x",
        model_id="x",
        job_id="x",
        chat_id="x",
    )


def test_every_tenant_route_needs_a_valid_key(tenants: Tenants) -> None:
    server = tenants.server
    wrong = tenants.keys["alpha"][:-4] + "AAAA"
    for route in CROSS_TENANT:
        for key in (None, "not-a-key", wrong, "rsk_0123456789abcdef_x"):
            with _client(server, key) as client:
                r = client.request(route[0], _path(route), json={})
            assert r.status_code == 401, (route, key, r.status_code, r.text)
            assert r.json()["error"]["code"] == "invalid_api_key"
            assert r.headers["WWW-Authenticate"] == "Bearer"
            assert tenants.keys["alpha"] not in r.text and wrong not in r.text
    # the health probes stay open
    with _client(server, None) as client:
        assert client.get("/readyz").status_code == 200


def test_a_revoked_key_is_refused_at_once(tenants: Tenants) -> None:
    key_id, key = make_key(tenants.env, "alpha", "short-lived")
    with _client(tenants.server, key) as client:
        assert client.get("/v1/kbs").status_code == 200
        out = subprocess.run(
            [sys.executable, "-m", "rag_stream", "keys", "revoke", key_id],
            env=tenants.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        assert key_id in out.stdout
        r = client.get("/v1/kbs")
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    listed = subprocess.run(
        [sys.executable, "-m", "rag_stream", "keys", "list"],
        env=tenants.env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    line = next(x for x in listed.splitlines() if x.startswith(key_id))
    assert "revoked" in line and "tenant=alpha" in line and key not in listed


def test_keys_never_reach_the_log_or_the_metrics(tenants: Tenants) -> None:
    with _client(tenants.server, tenants.keys["alpha"]) as client:
        client.get("/v1/streams/no-such-stream")
        metrics = client.get("/metrics").text
    log = tenants.server.log_path.read_text(errors="replace")
    for key in tenants.keys.values():
        assert key not in log and key not in metrics
        assert key.split("_", 2)[2][:12] not in log  # not even the secret's start


# --- limits: refused before any work, with Retry-After, across processes (Redis) ------------


def _stream_keys() -> set[bytes]:
    """This server's stream keys in Redis (the limits' own counters left out)."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        return {
            k
            for k in client.scan_iter(f"{PREFIX}:*", count=1000)
            if b":rate:" not in k and b":tenant-active:" not in k
        }
    finally:
        client.close()


def _refused(r: httpx.Response, limit: str) -> None:
    assert r.status_code == 429, (r.status_code, r.text)
    assert r.json()["error"]["code"] == "too_many_requests"
    assert limit in r.json()["error"]["message"]
    assert 1 <= int(r.headers["Retry-After"]) <= 60
    assert "X-Stream-Id" not in r.headers


def test_a_tenant_at_its_active_limit_gets_429_and_nothing_is_written(tenants: Tenants) -> None:
    _, key = make_key(tenants.env, "gamma")
    with _client(tenants.server, key) as gamma:
        running = [_start_long(gamma) for _ in range(2)]
        keys, usage = _stream_keys(), gamma.get("/v1/usage").json()["total"]
        _refused(gamma.post("/v1/chat/completions", json=LONG), "limits.per_tenant_active")
        body = {"kb": tenants.kb, "question": "Herons?", "stream": False}
        _refused(gamma.post("/v1/answers", json=body), "limits.per_tenant_active")
        assert all(gamma.get(f"/v1/streams/{s}").json()["status"] == "running" for s in running)
        # no key added (keys of earlier tests' streams may meanwhile expire), no usage counted
        assert _stream_keys() - keys == set()
        assert gamma.get("/v1/usage").json()["total"] == usage
        # other tenants are not held back by gamma's limit
        r = tenants.beta.post("/v1/generate", json={"prompt": "Hi", "max_tokens": 2})
        assert r.status_code == 200, r.text
        for sid in running:
            gamma.post(f"/v1/streams/{sid}/cancel")
        # a place freed is a place to use again
        again = gamma.post("/v1/generate", json={"prompt": "Hi", "max_tokens": 2})
        assert again.status_code == 200, again.text


def test_a_full_queue_gets_429_before_any_work(tenants: Tenants) -> None:
    """3 generating and 1 waiting (limits.max_active_streams, limits.max_queued) on this
    process: the fifth request is refused."""
    keys = [make_key(tenants.env, f"queue-{n}")[1] for n in range(2)]
    clients = [_client(tenants.server, k) for k in keys]
    try:
        running = [(c, _start_long(c)) for c in clients for _ in range(2)]
        keys = _stream_keys()
        r = tenants.beta.post("/v1/chat/completions", json=LONG)
        _refused(r, "limits.max_active_streams")
        assert _stream_keys() - keys == set()  # nothing written
        assert all(c.get(f"/v1/streams/{s}").json()["status"] == "running" for c, s in running)
        with _client(tenants.server, None) as anyone:
            assert anyone.get("/readyz").status_code == 200  # under load, still ready
            metrics = tenants.alpha.get("/metrics").text
        assert 'rag_stream_rejected_requests_total{reason="queue_full"}' in metrics
        for c, sid in running:
            c.post(f"/v1/streams/{sid}/cancel")
    finally:
        for c in clients:
            c.close()


def test_a_key_over_its_rate_gets_429_until_the_minute_ends(tenants: Tenants) -> None:
    _, key = make_key(tenants.env, "delta")
    with _client(tenants.server, key) as delta:
        sent = 0
        # the limit is 400 a minute: a minute boundary comes at most once in 801 requests
        for sent in range(1, 802):  # noqa: B007
            r = delta.get("/v1/kbs")
            if r.status_code != 200:
                break
        _refused(r, "limits.requests_per_minute")
        assert sent > 400
        # another key of the same server is unaffected
        assert tenants.alpha.get("/v1/kbs").status_code == 200


def test_open_mode_lasts_until_the_first_key(
    server_factory: ServerFactory, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """No key and a loopback address: open, as tenant "local", and the log says so; the first
    `keys create` closes it in the running server (the stub engine: nothing is generated)."""
    data = tmp_path_factory.mktemp("open-mode")
    server = server_factory(stub_delay_s=0.001, data_dir=data, RAG_STREAM_REDIS_URL=REDIS_URL)
    try:
        with _client(server, "sk-anything") as client:  # OpenAI SDKs always send some key
            assert client.post("/v1/kbs", json={"name": "mine"}).status_code == 201
            assert client.get("/v1/usage").json()["tenant"] == "local"
        assert "open mode" in server.log_path.read_text()
        env = {
            **os.environ,
            "RAG_STREAM_PROFILE": "test",
            "RAG_STREAM_DATA_DIR": str(data),
        }
        _, key = make_key(env, "local")
        with _client(server, None) as anonymous:
            # closed within KeyRing.OPEN_RECHECK_S (1 s) of the key: a `keys create` quicker
            # than that found it still open (CI, once)
            eventually_sync(
                lambda: anonymous.get("/v1/kbs").status_code == 401,
                "open mode closed by the first key",
                timeout_s=KeyRing.OPEN_RECHECK_S + 5,
                every_s=0.1,
            )
        with _client(server, key) as owner:  # what open mode made belongs to "local"
            assert [k["name"] for k in owner.get("/v1/kbs").json()["data"]] == ["mine"]
    finally:
        server.stop()


def test_metrics_and_the_api_description_behind_a_key(
    server_factory: ServerFactory, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """/metrics by default (security.metrics ``key``), the API description as set."""
    data = tmp_path_factory.mktemp("behind-a-key")
    server = server_factory(
        stub_delay_s=0.001,
        data_dir=data,
        RAG_STREAM_REDIS_URL=REDIS_URL,
        RAG_STREAM_SECURITY__REQUIRE_KEYS="true",
        RAG_STREAM_SECURITY__DOCS="key",
    )
    try:
        env = {**os.environ, "RAG_STREAM_PROFILE": "test", "RAG_STREAM_DATA_DIR": str(data)}
        _, key = make_key(env, "ops")
        with _client(server, None) as anonymous, _client(server, key) as holder:
            for path in ("/metrics", "/openapi.json"):
                assert anonymous.get(path).status_code == 401, path
                assert holder.get(path).status_code == 200, path
            assert "rag_stream_" in holder.get("/metrics").text
            schema = holder.get("/openapi.json").json()
            assert "/v1/usage" in schema["paths"]
            assert holder.get("/docs").status_code == 404  # the page could not send the key
            assert anonymous.get("/readyz").status_code == 200
    finally:
        server.stop()
