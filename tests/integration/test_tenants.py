"""API keys and tenants on the real engine (the tiny model), real Redis and PostgreSQL.

Two tenants, ``alpha`` and ``beta``, each with a key made by ``rag-stream keys create``. Every
route of the app is in ``CROSS_TENANT`` (or in ``NO_TENANT``, the few that own nothing): a
route added without an entry fails ``test_every_route_has_a_cross_tenant_check``, and each
entry proves that beta cannot see, change or end what alpha owns, with the 404 an unknown id
gets (never a 403 that would confirm it exists).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import pytest

from rag_stream.app import create_app
from rag_stream.settings import load_settings
from tests.conftest import REDIS_URL, ServerFactory
from tests.support.server import ROOT, ServerProcess
from tests.support.session_servers import TENANTS_PREFIX, KeyedServer

pytestmark = pytest.mark.engine
PREFIX = TENANTS_PREFIX  # this server's keys in the shared Redis

# Routes that own nothing a tenant could reach (health, the metrics scrape, the API's docs).
NO_TENANT = {
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("GET", "/openapi.json"),
    ("GET", "/docs"),
    ("GET", "/docs/oauth2-redirect"),
    ("GET", "/redoc"),
    ("GET", "/"),  # the chat page and its files: public, they hold no data
    ("GET", "/static/{path}"),
}


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
    kb: str  # alpha's knowledge base (name)
    kb_id: str
    doc_id: str
    chunk_id: str
    conversation_id: str
    stream_id: str  # a finished alpha stream


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
    detail = alpha.get(f"/v1/kbs/{kb}/documents/{doc.json()['id']}?include_chunks=true").json()
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
        kb_id=created.json()["id"],
        doc_id=doc.json()["id"],
        chunk_id=detail["chunks"][0]["id"],
        conversation_id=answer.json()["conversation_id"],
        stream_id=answer.json()["stream_id"],
    )
    alpha.close()
    beta.close()


def _not_found(r: httpx.Response) -> None:
    assert r.status_code == 404, (r.status_code, r.text)
    assert r.json()["error"]["code"] in ("not_found", "model_not_found")


LONG = {
    "model": "tiny-llama-test",
    "messages": [{"role": "user", "content": "Count."}],
    "max_tokens": 7900,
    "ignore_eos": True,
    "stream": True,
    # few events: five such streams of the tiny model would otherwise write thousands of
    # events a second to the shared Redis, more than a loaded 2-core machine keeps up with
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


def _running_alpha_stream(t: Tenants) -> str:
    return _start_long(t.alpha)


def _wait_finished(client: httpx.Client, sid: str) -> dict[str, object]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        status = client.get(f"/v1/streams/{sid}").json()
        if status["status"] != "running":
            return status  # type: ignore[no-any-return]
        time.sleep(0.2)
    raise AssertionError(f"stream {sid} still running")


# --- one check per route: beta on alpha's things -------------------------------------------


def kbs_list(t: Tenants) -> None:
    names = [k["name"] for k in t.beta.get("/v1/kbs").json()["data"]]
    assert t.kb not in names
    assert t.kb in [k["name"] for k in t.alpha.get("/v1/kbs").json()["data"]]


def kbs_create(t: Tenants) -> None:
    # names are unique per tenant: beta may take alpha's name, and gets a KB of its own
    mine = t.beta.post("/v1/kbs", json={"name": t.kb})
    assert mine.status_code == 201, mine.text
    assert mine.json()["id"] != t.kb_id and mine.json()["document_count"] == 0
    assert t.alpha.post("/v1/kbs", json={"name": t.kb}).status_code == 409
    assert t.beta.delete(f"/v1/kbs/{mine.json()['id']}").status_code == 204
    assert t.alpha.get(f"/v1/kbs/{t.kb}").json()["document_count"] == 1


def kbs_get(t: Tenants) -> None:
    _not_found(t.beta.get(f"/v1/kbs/{t.kb}"))
    _not_found(t.beta.get(f"/v1/kbs/{t.kb_id}"))


def kbs_delete(t: Tenants) -> None:
    _not_found(t.beta.delete(f"/v1/kbs/{t.kb_id}"))
    assert t.alpha.get(f"/v1/kbs/{t.kb_id}").status_code == 200


def chunk_get(t: Tenants) -> None:
    _not_found(t.beta.get(f"/v1/kbs/{t.kb_id}/chunks/{t.chunk_id}"))
    assert t.alpha.get(f"/v1/kbs/{t.kb_id}/chunks/{t.chunk_id}").status_code == 200


def documents_upload(t: Tenants) -> None:
    r = t.beta.post(f"/v1/kbs/{t.kb_id}/documents", json={"title": "x", "text": "intruder"})
    _not_found(r)
    assert t.alpha.get(f"/v1/kbs/{t.kb}").json()["document_count"] == 1


def documents_list(t: Tenants) -> None:
    _not_found(t.beta.get(f"/v1/kbs/{t.kb_id}/documents"))


def document_get(t: Tenants) -> None:
    _not_found(t.beta.get(f"/v1/kbs/{t.kb_id}/documents/{t.doc_id}"))


def document_delete(t: Tenants) -> None:
    _not_found(t.beta.delete(f"/v1/kbs/{t.kb_id}/documents/{t.doc_id}"))
    assert t.alpha.get(f"/v1/kbs/{t.kb_id}/documents/{t.doc_id}").status_code == 200


def search(t: Tenants) -> None:
    _not_found(t.beta.post(f"/v1/kbs/{t.kb_id}/search", json={"query": "herons"}))


def answers(t: Tenants) -> None:
    body = {"kb": t.kb_id, "question": "Where do herons nest?", "stream": False}
    _not_found(t.beta.post("/v1/answers", json=body))
    # alpha's conversation, continued on a KB of beta's own: still 404
    own = t.beta.post("/v1/kbs", json={"name": f"beta-{uuid.uuid4().hex[:6]}"}).json()
    follow_up = {**body, "kb": own["id"], "conversation_id": t.conversation_id}
    _not_found(t.beta.post("/v1/answers", json=follow_up))


def generate(t: Tenants) -> None:
    # the stream a request starts belongs to its caller
    r = t.beta.post("/v1/generate", json={"prompt": "Hi", "max_tokens": 4, "stream": False})
    assert r.status_code == 200, r.text
    _not_found(t.alpha.get(f"/v1/streams/{r.json()['stream_id']}"))
    assert t.beta.get(f"/v1/streams/{r.json()['stream_id']}").status_code == 200


def stream_events(t: Tenants) -> None:
    _not_found(t.beta.get(f"/v1/streams/{t.stream_id}/events"))
    _not_found(t.beta.get(f"/v1/streams/{t.stream_id}/events", headers={"Last-Event-ID": "1"}))


def stream_status(t: Tenants) -> None:
    _not_found(t.beta.get(f"/v1/streams/{t.stream_id}"))


def stream_cancel(t: Tenants) -> None:
    sid = _running_alpha_stream(t)
    _not_found(t.beta.post(f"/v1/streams/{sid}/cancel"))
    assert t.alpha.get(f"/v1/streams/{sid}").json()["cancel_requested"] is False
    assert t.alpha.post(f"/v1/streams/{sid}/cancel").json()["cancelled"] is True


def conversation(t: Tenants) -> None:
    _not_found(t.beta.get(f"/v1/conversations/{t.conversation_id}"))
    assert t.alpha.get(f"/v1/conversations/{t.conversation_id}").status_code == 200


def conversations_list(t: Tenants) -> None:
    theirs = [c["id"] for c in t.alpha.get("/v1/conversations").json()["data"]]
    mine = [c["id"] for c in t.beta.get("/v1/conversations").json()["data"]]
    assert t.conversation_id in theirs and t.conversation_id not in mine
    # another tenant's conversation is no cursor either (the same answer as an unknown id)
    r = t.beta.get("/v1/conversations", params={"before": t.conversation_id})
    assert r.status_code == 422, r.text


JOB = {"title": "T", "outline": ["A"], "section_tokens": 4, "top_k": 1}


def _alpha_job(t: Tenants) -> str:
    deadline = time.monotonic() + 60
    while True:  # alpha may hold its 2 places with the previous checks' jobs for a moment
        r = t.alpha.post("/v1/jobs", json={"kb": t.kb, **JOB})
        if r.status_code != 429 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def jobs_create(t: Tenants) -> None:
    _not_found(t.beta.post("/v1/jobs", json={"kb": t.kb, **JOB}))
    _not_found(t.beta.post("/v1/jobs", json={"kb": t.kb_id, **JOB}))


def jobs_list(t: Tenants) -> None:
    job = _alpha_job(t)
    assert job not in [j["id"] for j in t.beta.get("/v1/jobs").json()["data"]]
    assert job in [j["id"] for j in t.alpha.get("/v1/jobs").json()["data"]]
    # another tenant's job is no cursor either (the same answer as an unknown id)
    assert t.beta.get("/v1/jobs", params={"before": job}).status_code == 422


def jobs_get(t: Tenants) -> None:
    job = _alpha_job(t)
    _not_found(t.beta.get(f"/v1/jobs/{job}"))
    assert t.alpha.get(f"/v1/jobs/{job}").status_code == 200


def jobs_events(t: Tenants) -> None:
    job = _alpha_job(t)
    _not_found(t.beta.get(f"/v1/jobs/{job}/events"))


def jobs_result(t: Tenants) -> None:
    job = _alpha_job(t)
    _not_found(t.beta.get(f"/v1/jobs/{job}/result"))
    _not_found(t.beta.get(f"/v1/jobs/{job}/result", params={"format": "json"}))


def jobs_cancel(t: Tenants) -> None:
    job = _alpha_job(t)
    _not_found(t.beta.post(f"/v1/jobs/{job}/cancel"))


def jobs_delete(t: Tenants) -> None:
    job = _alpha_job(t)
    _not_found(t.beta.delete(f"/v1/jobs/{job}"))
    assert t.alpha.get(f"/v1/jobs/{job}").status_code == 200


def chat_completions(t: Tenants) -> None:
    body = {"model": f"kb:{t.kb}", "messages": [{"role": "user", "content": "Herons?"}]}
    r = t.beta.post("/v1/chat/completions", json=body)
    _not_found(r)
    assert r.json()["error"]["param"] == "model"


def models_list(t: Tenants) -> None:
    ids = [m["id"] for m in t.beta.get("/v1/models").json()["data"]]
    assert f"kb:{t.kb}" not in ids and len(ids) >= 1
    assert f"kb:{t.kb}" in [m["id"] for m in t.alpha.get("/v1/models").json()["data"]]


def model_get(t: Tenants) -> None:
    _not_found(t.beta.get(f"/v1/models/kb:{t.kb}"))


def usage(t: Tenants) -> None:
    mine, theirs = t.beta.get("/v1/usage").json(), t.alpha.get("/v1/usage").json()
    assert mine["tenant"] == "beta" and theirs["tenant"] == "alpha"
    # alpha's answer is counted for alpha only
    assert theirs["by_kind"]["answer"]["requests"] >= 1
    assert "answer" not in mine["by_kind"]


CROSS_TENANT: dict[tuple[str, str], Callable[[Tenants], None]] = {
    ("GET", "/v1/kbs"): kbs_list,
    ("POST", "/v1/kbs"): kbs_create,
    ("GET", "/v1/kbs/{kb}"): kbs_get,
    ("DELETE", "/v1/kbs/{kb}"): kbs_delete,
    ("GET", "/v1/kbs/{kb}/chunks/{chunk_id}"): chunk_get,
    ("POST", "/v1/kbs/{kb}/documents"): documents_upload,
    ("GET", "/v1/kbs/{kb}/documents"): documents_list,
    ("GET", "/v1/kbs/{kb}/documents/{doc}"): document_get,
    ("DELETE", "/v1/kbs/{kb}/documents/{doc}"): document_delete,
    ("POST", "/v1/kbs/{kb}/search"): search,
    ("POST", "/v1/answers"): answers,
    ("POST", "/v1/generate"): generate,
    ("GET", "/v1/streams/{stream_id}/events"): stream_events,
    ("GET", "/v1/streams/{stream_id}"): stream_status,
    ("POST", "/v1/streams/{stream_id}/cancel"): stream_cancel,
    ("GET", "/v1/conversations/{conversation_id}"): conversation,
    ("GET", "/v1/conversations"): conversations_list,
    ("POST", "/v1/chat/completions"): chat_completions,
    ("GET", "/v1/models"): models_list,
    ("GET", "/v1/models/{model_id}"): model_get,
    ("GET", "/v1/usage"): usage,
    ("POST", "/v1/jobs"): jobs_create,
    ("GET", "/v1/jobs"): jobs_list,
    ("GET", "/v1/jobs/{job_id}"): jobs_get,
    ("GET", "/v1/jobs/{job_id}/events"): jobs_events,
    ("GET", "/v1/jobs/{job_id}/result"): jobs_result,
    ("POST", "/v1/jobs/{job_id}/cancel"): jobs_cancel,
    ("DELETE", "/v1/jobs/{job_id}"): jobs_delete,
}


def _routes() -> set[tuple[str, str]]:
    app = create_app(load_settings(profile="test"))  # routes only: no lifespan runs
    found = set()
    for route in app.routes:
        for method in getattr(route, "methods", None) or ():
            if method != "HEAD":
                found.add((method, route.path.replace(":path}", "}")))  # type: ignore[attr-defined]
    return found


def test_every_route_has_a_cross_tenant_check() -> None:
    routes = _routes()
    missing = routes - set(CROSS_TENANT) - NO_TENANT
    assert not missing, f"routes without a cross-tenant check in CROSS_TENANT: {sorted(missing)}"
    assert not set(CROSS_TENANT) - routes, "CROSS_TENANT names routes that no longer exist"


@pytest.mark.parametrize("route", sorted(CROSS_TENANT), ids=lambda r: f"{r[0]} {r[1]}")
def test_another_tenants_ids_answer_404(tenants: Tenants, route: tuple[str, str]) -> None:
    CROSS_TENANT[route](tenants)


def _path(route: tuple[str, str]) -> str:
    return route[1].format(
        kb="x",
        chunk_id="x",
        doc="x",
        stream_id="x",
        conversation_id="x",
        model_id="x",
        job_id="x",
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
            assert anonymous.get("/v1/kbs").status_code == 401
        with _client(server, key) as owner:  # what open mode made belongs to "local"
            assert [k["name"] for k in owner.get("/v1/kbs").json()["data"]] == ["mine"]
    finally:
        server.stop()


def test_metrics_and_the_api_description_behind_a_key(
    server_factory: ServerFactory, tmp_path_factory: pytest.TempPathFactory
) -> None:
    data = tmp_path_factory.mktemp("behind-a-key")
    server = server_factory(
        stub_delay_s=0.001,
        data_dir=data,
        RAG_STREAM_REDIS_URL=REDIS_URL,
        RAG_STREAM_SECURITY__REQUIRE_KEYS="true",
        RAG_STREAM_SECURITY__METRICS="key",
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
