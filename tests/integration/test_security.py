"""Security of the real service: one server process (paced stub engine, real Redis, a scratch
PostgreSQL database), API keys required, DEBUG logging with access logs, a CORS origin and the
trusted host names configured.

- Tenants: every route that takes a key is in ``CROSS_TENANT`` (tests/support/tenant_probes.py,
  the one cross-tenant table; the set is checked against the app's routes, so a new route
  without a case fails). Each case has beta (and gamma, a tenant that owns nothing) reach for
  what alpha made, by alpha's ids, by alpha's names, and by alpha's ids inside beta's own
  containers (beta's KB with alpha's document, chunk or conversation): always the 404 an
  unknown id gets, nothing of alpha's in any answer, and alpha's things as they were.
- Keys: after valid, wrong, revoked, unknown and misplaced keys (other headers too) on every
  route, no key, nor a piece of its secret, is in the server's output (DEBUG level), in Redis,
  in any SQL row or in the data folder; only the SHA-256 of a key is stored. Neither are the
  passwords of the Redis and database URLs the server was given.
- Uploads: hostile file names (traversal, absolute, NUL, CR/LF, thousands of characters) get a
  2xx or a JSON 4xx that says why, and nothing appears outside the data folder, nor anywhere
  under a name taken from an upload.
- No fetch: URLs of a local listener in every field a client fills (document text, source,
  metadata, HTML and PDF links, chat content parts, job fields, headers): it gets no connection.
- Browsers: only the listed origin gets CORS headers or may change anything; only the listed
  host names are answered, and a Host that merely starts with one is not.

The timing-safe key comparison is proved in tests/unit/test_security.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis

from rag_stream.api.deps import get_caller
from rag_stream.app import create_app
from rag_stream.settings import load_settings
from rag_stream.store.db import create_db
from rag_stream.store.keys import create_key, revoke_key
from tests.conftest import REDIS_URL, SESSION_PREFIX, ServerFactory
from tests.support.listener import Listener
from tests.support.pdfs import linking_pdf
from tests.support.pg import postgres_database
from tests.support.redis_keys import drop_keys
from tests.support.server import ROOT, ServerProcess
from tests.support.tenant_probes import (
    CROSS_TENANT,
    PUBLIC,
    World,
    build_world,
    ok,
    wait_job,
)
from tests.support.waiting import eventually_sync

PREFIX = f"{SESSION_PREFIX}-security"  # this server's keys in the shared Redis
APP_ORIGIN = "https://app.example"
EVIL_ORIGIN = "https://evil.example"
TRUSTED_NAME = "rag.example"
# Passwords in the service URLs (PostgreSQL trusts local connections and Redis's default user
# has none, so both accept any): they must stay out of the log as well as the API keys.
DB_PASSWORD = f"dbpw{uuid.uuid4().hex}"
REDIS_PASSWORD = f"redispw{uuid.uuid4().hex}"


@dataclass
class Served:
    server: ServerProcess
    database: str
    data: Path  # the data folder
    around: Path  # the folder holding it (and nothing else)
    keys: dict[str, str]  # tenant (or "revoked") -> key
    key_hashes: dict[str, str]


@pytest.fixture(scope="module")
def served(
    server_factory: ServerFactory, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    for database in postgres_database("rag_stream_security"):
        around = tmp_path_factory.mktemp("security")
        data = around / "data"
        with_password = database.replace("://postgres@", f"://postgres:{DB_PASSWORD}@", 1)
        assert with_password != database
        redis_url = REDIS_URL.replace("redis://", f"redis://default:{REDIS_PASSWORD}@", 1)
        server = server_factory(
            stub_delay_s=0.005,  # 200 tokens a second: a 4,000-token stream runs for 20 s
            data_dir=data,
            RAG_STREAM_DATABASE_URL=with_password,
            RAG_STREAM_REDIS_URL=redis_url,
            RAG_STREAM_STREAMING__KEY_PREFIX=PREFIX,
            RAG_STREAM_LOG_LEVEL="debug",
            RAG_STREAM_LIMITS__MAX_TOKENS="4000",
            RAG_STREAM_LIMITS__REQUESTS_PER_MINUTE="100000",  # its counters live in Redis
            # a 1.5 MB upload is then refused once received, rather than embedded for minutes
            RAG_STREAM_INGEST__MAX_TEXT_CHARS="1000000",
            RAG_STREAM_SECURITY__REQUIRE_KEYS="true",
            RAG_STREAM_SECURITY__CORS_ORIGINS=json.dumps([APP_ORIGIN]),
            RAG_STREAM_SECURITY__TRUSTED_HOSTS=json.dumps(["127.0.0.1", TRUSTED_NAME]),
        )
        keys = asyncio.run(_make_keys(database))
        yield Served(
            server=server,
            database=database,
            data=data,
            around=around,
            keys=keys,
            key_hashes={t: hashlib.sha256(k.encode()).hexdigest() for t, k in keys.items()},
        )
        server.stop()
        drop_keys(REDIS_URL, PREFIX)


async def _make_keys(database: str) -> dict[str, str]:
    """What `rag-stream keys create` does, in-process (the CLI is tested in test_tenants.py)."""
    engine, sessions = create_db(database)
    try:
        async with sessions() as session:
            made = {t: await create_key(session, t, f"{t} key") for t in ("alpha", "beta", "gamma")}
            revoked = await create_key(session, "alpha", "revoked")
            await revoke_key(session, revoked.id)
        return {**{t: k.key for t, k in made.items()}, "revoked": revoked.key}
    finally:
        await engine.dispose()


def _client(served: Served, who: str | None, **headers: str) -> httpx.Client:
    if who is not None:
        headers["Authorization"] = f"Bearer {served.keys[who]}"
    return httpx.Client(base_url=served.server.url, headers=headers, timeout=60)


# --- tenants: the cross-tenant table (tests/support/tenant_probes.py) ------------------------


@pytest.fixture(scope="module")
def world(served: Served) -> Iterator[World]:
    alpha, beta, gamma = (_client(served, t) for t in ("alpha", "beta", "gamma"))
    try:
        yield build_world(alpha, beta, gamma)
    finally:
        for client in (alpha, beta, gamma):
            client.close()


def _app_routes() -> dict[tuple[str, str], bool]:
    """Every (method, path) of the app, and whether it depends on the caller's key."""

    def needs_key(dependant: object) -> bool:
        return any(
            d.call is get_caller or needs_key(d) for d in getattr(dependant, "dependencies", ())
        )

    app = create_app(load_settings(profile="test"))  # routes only: no lifespan runs
    found: dict[tuple[str, str], bool] = {}
    for route in app.routes:
        path = getattr(route, "path", "").replace(":path}", "}")
        for method in getattr(route, "methods", None) or ():
            if method != "HEAD":
                found[(method, path)] = needs_key(getattr(route, "dependant", None))
    return found


def test_every_keyed_route_has_a_cross_tenant_case_and_every_other_is_public() -> None:
    routes = _app_routes()
    keyed = {r for r, needs in routes.items() if needs}
    assert keyed == set(CROSS_TENANT), (
        f"without a case: {sorted(keyed - set(CROSS_TENANT))}; "
        f"cases for no such keyed route: {sorted(set(CROSS_TENANT) - keyed)}"
    )
    # a route that takes no key must be a known public one, and none of them is under /v1
    assert {r for r, needs in routes.items() if not needs} == PUBLIC
    assert not [r for r in PUBLIC if r[1].startswith("/v1")]


@pytest.mark.parametrize("route", sorted(CROSS_TENANT), ids=lambda r: f"{r[0]} {r[1]}")
def test_another_tenant_gets_404_and_nothing_of_alphas(
    world: World, route: tuple[str, str]
) -> None:
    CROSS_TENANT[route](world)


# --- uploads ----------------------------------------------------------------------------------


def _multipart(filename: bytes, body: bytes) -> tuple[bytes, dict[str, str]]:
    """A form with one file whose name is sent byte for byte (clients escape NUL and CR/LF)."""
    boundary = uuid.uuid4().hex
    data = (
        f"--{boundary}\r\n".encode()
        + b'Content-Disposition: form-data; name="file"; filename="'
        + filename
        + b'"\r\nContent-Type: text/plain\r\n\r\n'
        + body
        + f"\r\n--{boundary}--\r\n".encode()
    )
    return data, {"content-type": f"multipart/form-data; boundary={boundary}"}


def _names_under(root: Path, token: str, depth: int) -> list[str]:
    found = []
    skip = {".git", ".venv", "node_modules", ".mypy_cache", ".ruff_cache", "__pycache__", "proc"}
    for here, dirs, files in os.walk(root, onerror=lambda _: None):
        level = len(Path(here).relative_to(root).parts)
        dirs[:] = [d for d in dirs if d not in skip] if level < depth else []
        found += [os.path.join(here, n) for n in dirs + files if token in n]
    return found


def _tree(root: Path, skip: Path) -> set[str]:
    return {
        os.path.join(here, n)
        for here, dirs, files in os.walk(root)
        if not Path(here).is_relative_to(skip)
        for n in dirs + files
        if not Path(here, n).is_relative_to(skip)
    }


def test_hostile_file_names_write_nothing_outside_the_data_folder(served: Served) -> None:
    token = f"escape{uuid.uuid4().hex[:10]}"
    with _client(served, "alpha") as alpha:
        kb = str(ok(alpha.post("/v1/kbs", json={"name": f"uploads-{token}"}), 201)["id"])
        outside_before = _tree(served.around, served.data)
        names = [
            f"../../{token}-up.txt",
            f"../../../../../../../../tmp/{token}-deep.txt",
            f"/tmp/{token}-abs.txt",
            f"{ROOT}/{token}-repo.txt",
            f"..\\..\\{token}-win.txt",
            f"%2e%2e%2f%2e%2e%2f{token}-enc.txt",
            f"~/{token}-home.txt",
            f"{served.data}/../{token}-beside.txt",
            f"{token}-nul\x00.txt",
            f"../{token}\x00/../../{token}-nul-dir.txt",
            f"{token}-crlf\r\nX-Injected: 1.txt",
            "../" * 300 + f"{token}-long.txt",  # 900 characters: within every limit
            "../" * 2000 + f"{token}-longer.txt",  # over the multipart header limit
            "x" * 1100 + f"{token}.txt",  # over the 1,024 characters of a source
            "..",
            "/",
        ]
        answers = []
        for n, name in enumerate(names):
            data, headers = _multipart(name.encode(), f"Upload {n} of {token}.".encode())
            answers.append(alpha.post(f"/v1/kbs/{kb}/documents", content=data, headers=headers))
        # the same names as the JSON body's source and the form's source field
        for n, name in enumerate(names[:8]):
            doc = {"title": name, "text": f"JSON {n} of {token}.", "source": name}
            answers.append(alpha.post(f"/v1/kbs/{kb}/documents", json=doc))
            upload = {"file": ("a.txt", f"Form {n} of {token}.".encode(), "text/plain")}
            answers.append(
                alpha.post(f"/v1/kbs/{kb}/documents", files=upload, data={"source": name})
            )
        for name, r in zip(names + ["json/form"] * 16, answers, strict=True):
            assert r.status_code < 300 or (
                400 <= r.status_code < 500 and r.json()["error"]["message"]
            ), (name[:60], r.status_code, r.text)
        by_name = dict(zip(names, answers, strict=False))
        too_long = by_name["../" * 2000 + f"{token}-longer.txt"]
        assert too_long.status_code == 422, too_long.text
        assert "header" in too_long.json()["error"]["message"], too_long.text  # says why
        assert by_name["x" * 1100 + f"{token}.txt"].status_code == 422
        assert by_name["../" * 300 + f"{token}-long.txt"].status_code == 201
        stored = {r.json()["source"] for r in answers[: len(names)] if r.status_code < 300}
        assert all(s is None or "/" not in s for s in stored), stored  # file names: base names
        assert ok(alpha.get(f"/v1/kbs/{kb}"))["document_count"] >= 10
        # nothing new beside the data folder; no file named after an upload anywhere
        assert _tree(served.around, served.data) == outside_before
        for root, depth in (
            (served.around.parent, 6),
            (ROOT, 4),
            (Path(tempfile.gettempdir()), 2),
            (Path.home(), 1),
            (Path("/"), 1),
        ):
            assert not _names_under(root, token, depth), root


def _open_files(pid: int) -> set[str]:
    """The files a process has open (not its sockets and pipes)."""
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):  # closed meanwhile
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("/"):
                found.add(target)
    return found


def _bytes_read(pid: int) -> int:
    """What the process has read so far, from files and sockets alike (``rchar``)."""
    with open(f"/proc/{pid}/io") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("rchar:"))


def test_a_large_upload_is_kept_in_memory_not_spooled_to_a_temp_file(served: Served) -> None:
    """Starlette spools a form's file over 1 MB to an unnamed file in the system's temp dir:
    the upload written outside the data folder. Paused after 1.5 MB, the server process must
    hold no file outside the data folder that it did not hold before."""
    pid = served.server.proc.pid
    with _client(served, "alpha") as alpha:
        kb = str(ok(alpha.post("/v1/kbs", json={"name": f"big-{uuid.uuid4().hex[:6]}"}), 201)["id"])
        warm = {"file": ("small.txt", b"A small file first: the path is warm.", "text/plain")}
        ok(alpha.post(f"/v1/kbs/{kb}/documents", files=warm), 201)
        before, read_before = _open_files(pid), _bytes_read(pid)
        boundary = uuid.uuid4().hex
        most_sent, finish = threading.Event(), threading.Event()

        def body() -> Iterator[bytes]:
            yield (
                f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
                'filename="big.txt"\r\nContent-Type: text/plain\r\n\r\n'
            ).encode()
            yield b"word " * 300_000
            most_sent.set()
            finish.wait(30)
            yield f"word\r\n--{boundary}--\r\n".encode()

        headers = {"content-type": f"multipart/form-data; boundary={boundary}"}
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(
                alpha.post, f"/v1/kbs/{kb}/documents", content=body(), headers=headers
            )
            assert most_sent.wait(30)
            outside: set[str] = set()

            def look() -> bool:
                """Note the files opened outside the data folder; true once the server has
                read the 1.5 MB sent (a spooled file would be open by then, until the end)."""
                now = _open_files(pid) - before
                outside.update(f for f in now if not Path(f).is_relative_to(served.data))
                return _bytes_read(pid) - read_before >= 1_500_000

            eventually_sync(look, "the server reading the 1.5 MB sent", 60)
            look()  # once more, after the last of it was read
            finish.set()
            r = answer.result(timeout=60)
    assert not outside, outside
    assert r.status_code == 413, r.text  # received whole, then over this server's text limit


# --- no URL a client gives is ever fetched ---------------------------------------------------


def test_the_service_never_fetches_a_url_a_client_gives(served: Served) -> None:
    listener = Listener()
    u = listener.url
    try:
        with _client(served, "alpha", Referer=u, **{"X-Forwarded-Host": u[7:]}) as alpha:
            kb = str(ok(alpha.post("/v1/kbs", json={"name": f"urls-{listener.port}"}), 201)["id"])
            html = (
                f'<html><head><base href="{u}/"><link rel="stylesheet" href="{u}/s.css">'
                f'<meta http-equiv="refresh" content="0;url={u}/r"><script src="{u}/s.js">'
                f'</script></head><body><img src="{u}/i.png"><iframe src="{u}/f"></iframe>'
                f'<object data="{u}/o"></object><p>Herons, see {u}/p</p></body></html>'
            )
            uploads = [
                ("page.html", html.encode(), "text/html"),
                ("links.pdf", linking_pdf(u), "application/pdf"),
                (f"{u}/name.txt", b"A file named by a URL.", "text/plain"),
                (
                    "notes.md",
                    f"![img]({u}/i.png) [link]({u}/l) <{u}/auto>".encode(),
                    "text/markdown",
                ),
            ]
            for name, data, media_type in uploads:
                r = alpha.post(
                    f"/v1/kbs/{kb}/documents",
                    files={"file": (name, data, media_type)},
                    data={"source": u, "title": u, "metadata": json.dumps({"url": u})},
                )
                assert r.status_code in (200, 201), (name, r.text)
            doc = {"title": u, "text": f"See {u}/x and ![i]({u}/i.png).", "source": f"{u}/s"}
            ok(alpha.post(f"/v1/kbs/{kb}/documents", json={**doc, "metadata": {"u": u}}), 201)
            ok(alpha.post("/v1/kbs", json={"name": f"u-{listener.port}", "description": u}), 201)
            ok(alpha.post(f"/v1/kbs/{kb}/search", json={"query": u, "filter": {"u": u}}))
            ok(alpha.post("/v1/answers", json={"kb": kb, "question": u, "stream": False}))
            assert alpha.post("/v1/answers", json={"kb": u, "question": "x"}).status_code == 404
            chat = {"model": f"kb:{kb}", "max_tokens": 4}
            ok(
                alpha.post(
                    "/v1/chat/completions",
                    json={**chat, "messages": [{"role": "user", "content": u}]},
                )
            )
            for part in (
                {"type": "image_url", "image_url": {"url": f"{u}/i.png"}},
                {"type": "input_image", "image_url": f"{u}/i.png"},
                {"type": "file", "file": {"file_url": f"{u}/f.pdf"}},
                {"type": "input_audio", "input_audio": {"url": f"{u}/a.wav"}},
            ):
                messages = [{"role": "user", "content": [{"type": "text", "text": "x"}, part]}]
                r = alpha.post("/v1/chat/completions", json={**chat, "messages": messages})
                assert r.status_code == 400, r.text
            user = [{"role": "user", "content": "x"}]
            for extra in (
                {"model": u},
                {"response_format": {"type": "json_schema", "json_schema": {"$ref": u}}},
                {"web_search_options": {"url": u}},
            ):
                r = alpha.post("/v1/chat/completions", json={**chat, "messages": user, **extra})
                assert r.status_code in (400, 404), r.text
            # offered tools are accepted and never called (nor their URLs fetched: see below)
            tools = [{"type": "function", "function": {"name": "f", "url": u}}]
            ok(alpha.post("/v1/chat/completions", json={**chat, "messages": user, "tools": tools}))
            ok(alpha.post("/v1/generate", json={"prompt": u, "max_tokens": 2, "stream": False}))
            job = {"kb": kb, "title": u, "instructions": f"fetch {u}", "outline": [u]}
            made = ok(alpha.post("/v1/jobs", json={**job, "section_tokens": 4, "top_k": 2}), 202)
            assert wait_job(alpha, str(made["id"]))["status"] == "completed"
        time.sleep(1.0)  # anything started in the background has had its moment
        assert listener.connections == [], listener.connections
        # the listener does see a connection when one is made
        with socket.create_connection(("127.0.0.1", listener.port)) as probe:
            probe.sendall(b"GET / HTTP/1.0\r\n\r\n")
        listener.wait_for(1)
        assert listener.connections == [b"GET / HTTP/1.0\r\n\r\n"]
    finally:
        listener.close()


# --- browsers: CORS and Host ------------------------------------------------------------------


def test_only_the_listed_origin_gets_cors_headers_or_may_change_anything(
    served: Served,
) -> None:
    with _client(served, "alpha") as alpha:
        target = ok(alpha.post("/v1/kbs", json={"name": f"target-{uuid.uuid4().hex[:6]}"}), 201)
        before = ok(alpha.get("/v1/kbs"))["data"]
        preflight = {
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type",
        }
        allowed = alpha.options("/v1/kbs", headers={"Origin": APP_ORIGIN, **preflight})
        assert allowed.status_code == 200
        assert allowed.headers["access-control-allow-origin"] == APP_ORIGIN
        made = alpha.post(
            "/v1/kbs", json={"name": f"app-{uuid.uuid4().hex[:6]}"}, headers={"Origin": APP_ORIGIN}
        )
        assert made.status_code == 201 and made.headers["access-control-allow-origin"] == APP_ORIGIN
        assert "access-control-allow-credentials" not in made.headers
        alpha.delete(f"/v1/kbs/{made.json()['id']}")
        foreign = [
            EVIL_ORIGIN,
            "null",  # sandboxed frames and file:// pages
            "https://app.example.evil.example",
            "http://app.example",  # another scheme is another origin
            "https://app.example:8443",
            f"http://{TRUSTED_NAME}",  # a trusted Host name is not an allowed Origin
        ]
        for origin in foreign:
            r = alpha.options("/v1/kbs", headers={"Origin": origin, **preflight})
            assert "access-control-allow-origin" not in r.headers, origin
            r = alpha.get("/v1/kbs", headers={"Origin": origin})  # the page cannot read it
            assert r.status_code == 200 and "access-control-allow-origin" not in r.headers, origin
            for method, path, body in (
                ("POST", "/v1/kbs", {"name": "planted"}),
                ("POST", "/v1/generate", {"prompt": "x", "max_tokens": 2}),
                ("DELETE", f"/v1/kbs/{target['id']}", None),
            ):
                r = alpha.request(method, path, json=body, headers={"Origin": origin})
                assert r.status_code == 403, (origin, method, path, r.text)
                assert r.json()["error"]["code"] == "forbidden_origin"
                assert "access-control-allow-origin" not in r.headers
        assert ok(alpha.get("/v1/kbs"))["data"] == before  # nothing made, nothing deleted
        assert alpha.delete(f"/v1/kbs/{target['id']}").status_code == 204  # without an Origin


def _raw_status(port: int, request: bytes) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        head = s.recv(4096).split(b"\r\n", 1)[0]
    return int(head.split()[1])


def test_only_the_trusted_host_names_are_answered(served: Served) -> None:
    port = served.server.port
    with _client(served, "alpha") as alpha:
        assert alpha.get("/v1/kbs").status_code == 200  # Host: 127.0.0.1:<port>, listed
        assert alpha.get("/v1/kbs", headers={"Host": f"{TRUSTED_NAME}:{port}"}).status_code == 200
        assert alpha.get("/v1/kbs", headers={"Host": TRUSTED_NAME.upper()}).status_code == 200
        for host in (
            "localhost",  # a loopback name, but the setting replaces the default list
            "evil.example",
            f"{TRUSTED_NAME}.evil.example",
            f"evil.{TRUSTED_NAME}",
            # a header that only starts with a trusted name
            f"127.0.0.1:{port}@evil.example",
            f"{TRUSTED_NAME}:{port}/evil.example",
            f"{TRUSTED_NAME}:evil",
            "[::1]evil.example",
            "",
        ):
            for method in ("GET", "POST"):
                r = alpha.request(method, "/v1/kbs", json={"name": "x"}, headers={"Host": host})
                assert r.status_code == 400, (host, method, r.status_code, r.text)
                assert r.json()["error"]["code"] == "untrusted_host"
        # no Host at all (HTTP/1.0) is refused too, probes included
        key = served.keys["alpha"].encode()
        assert (
            _raw_status(port, b"GET /v1/kbs HTTP/1.0\r\nAuthorization: Bearer " + key + b"\r\n\r\n")
            == 400
        )
        assert _raw_status(port, b"GET /healthz HTTP/1.0\r\n\r\n") == 400
        assert (
            _raw_status(port, f"GET /healthz HTTP/1.0\r\nHost: {TRUSTED_NAME}\r\n\r\n".encode())
            == 200
        )


# --- keys (and service passwords) never logged or stored ------------------------------------


def _redis_dump() -> bytes:
    """Every key name and value of this server's in Redis."""
    client = redis.Redis.from_url(REDIS_URL)
    out = bytearray()
    try:
        for key in client.scan_iter(f"{PREFIX}:*", count=1000):
            out += key + b"\n"
            kind = client.type(key)
            if kind == b"string":
                out += client.get(key) or b""
            elif kind == b"hash":
                out += repr(client.hgetall(key)).encode()
            elif kind == b"list":
                out += repr(client.lrange(key, 0, -1)).encode()
            elif kind == b"set":
                out += repr(client.smembers(key)).encode()
            elif kind == b"zset":
                out += repr(client.zrange(key, 0, -1, withscores=True)).encode()
            elif kind == b"stream":
                out += repr(client.xrange(key)).encode()
            out += b"\n"
    finally:
        client.close()
    return bytes(out)


def _sql_dump(database: str) -> str:
    """Every row of every table of the server's database, as text."""
    import asyncpg

    async def dump() -> str:
        conn = await asyncpg.connect(database.replace("postgresql+asyncpg", "postgresql"))
        try:
            tables = await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
            rows = []
            for (table,) in tables:
                rows += [r[0] for r in await conn.fetch(f'SELECT t::text FROM "{table}" t')]
            return "\n".join(rows)
        finally:
            await conn.close()

    return asyncio.run(dump())


def _pieces(secret: str, size: int = 12) -> set[str]:
    return {secret[i : i + size] for i in range(len(secret) - size + 1)}


def test_keys_and_service_passwords_are_never_logged_or_stored(
    served: Served, world: World
) -> None:
    """Runs after the other tests of the module (it is the last one), so the log, Redis and SQL
    hold everything they did: streams, jobs, uploads, errors."""
    made_up = {
        "unknown": f"rsk_{uuid.uuid4().hex[:16]}_{uuid.uuid4().hex}{uuid.uuid4().hex}",
        "garbage": f"not-a-key-{uuid.uuid4().hex}",
        "wrong": served.keys["alpha"][:-8] + uuid.uuid4().hex[:8],
    }
    presented = {**served.keys, **made_up}
    paths = {
        route: route[1].format(
            kb=world.kb,
            chunk_id=world.chunk_id,
            doc=world.doc_id,
            stream_id=world.answer_stream,
            conversation_id=world.conversation_id,
            model_id=f"kb:{world.kb}",
            job_id=world.job_id,
            chat_id="a-chat",
        )
        for route in CROSS_TENANT
    }
    with httpx.Client(base_url=served.server.url, timeout=60) as http:
        for (method, _), path in paths.items():
            for name in ("revoked", *made_up):
                r = http.request(
                    method, path, json={}, headers={"Authorization": f"Bearer {presented[name]}"}
                )
                assert r.status_code == 401, (name, method, path, r.text)
                assert presented[name] not in r.text
            if method == "GET":
                r = http.get(path, headers={"Authorization": f"Bearer {served.keys['beta']}"})
                assert r.status_code in (200, 204, 404), (path, r.text)
        # keys where the service does not look for them: still refused, still not logged
        key = served.keys["alpha"]
        for headers in (
            {"Authorization": key},
            {"Authorization": f"Basic {key}"},
            {"Authorization": f"Token {key}"},
            {"X-API-Key": key},
            {"api-key": key},
            {"Cookie": f"key={key}"},
            {"Proxy-Authorization": f"Bearer {key}"},
        ):
            r = http.get("/v1/kbs", headers=headers)
            assert r.status_code == 401 and key not in r.text, headers
        # (the default, security.metrics "key": a key once keys are required)
        assert http.get("/metrics").status_code == 401
        alpha = {"Authorization": f"Bearer {served.keys['alpha']}"}
        metrics = http.get("/metrics", headers=alpha).text
        assert "rag_stream_" in metrics
    log = served.server.log_path.read_text(errors="replace")
    redis_dump = _redis_dump()
    sql = _sql_dump(served.database)
    files = b"".join(
        p.read_bytes() for p in served.data.rglob("*") if p.is_file() and not p.is_symlink()
    )
    # the places searched do hold what they should (else finding nothing would prove nothing)
    assert " DEBUG " in log and '"GET /v1/kbs HTTP/1.1" 401' in log
    assert world.answer_stream.encode() in redis_dump
    assert all(h in sql for t, h in served.key_hashes.items())  # only the digest is stored
    assert files
    secrets = {**presented, "database": DB_PASSWORD, "redis": REDIS_PASSWORD}
    for name, secret in secrets.items():
        pieces = {secret} | (
            _pieces(secret.split("_", 2)[2]) if secret.startswith("rsk_") else set()
        )
        for where, text in (("log", log), ("metrics", metrics), ("SQL", sql)):
            assert not any(p in text for p in pieces), f"{name}'s key or secret in the {where}"
        for where, blob in (("Redis", redis_dump), ("data folder", files)):
            assert not any(p.encode() in blob for p in pieces), f"{name}'s secret in {where}"
