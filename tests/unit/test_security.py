"""Secrets at rest and in messages: API keys are kept and compared as SHA-256 digests only, and
a service URL's password never reaches an error message (the server's log, a terminal).

The keys run through ``rag_stream.store.keys`` on a SQLite file (no service needed); the URL
checks through ``rag_stream.preflight`` against closed ports and a local stand-in that answers
401 the way a Qdrant server behind a password does."""

from __future__ import annotations

import hashlib
import hmac
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from rag_stream.errors import ConfigError
from rag_stream.preflight import check_qdrant, check_redis, migrate
from rag_stream.settings import Settings, load_settings, without_password
from rag_stream.store import keys
from rag_stream.store.db import create_db
from rag_stream.store.models import Base

SECRET = "S3cretPw-4f9a"


@pytest.fixture
async def sessions(tmp_path: Path) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    engine, made = create_db(f"sqlite+aiosqlite:///{tmp_path / 'keys.db'}")
    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
    yield made
    await engine.dispose()


def _secret_of(key: str) -> str:
    scheme, key_id, secret = key.split("_", 2)
    assert scheme == "rsk" and len(key_id) == 16 and len(secret) >= 32
    return secret


async def test_a_key_is_stored_as_its_sha256_digest_and_nothing_of_its_secret(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    async with sessions() as session:
        created = await keys.create_key(session, "alpha", "ci")
        rows = (await session.execute(text("SELECT * FROM api_keys"))).all()
    (row,) = rows
    stored = " ".join(str(v) for v in row)
    assert hashlib.sha256(created.key.encode()).hexdigest() in stored
    assert created.key not in stored
    # not even a piece of the secret: the prefix shown by `keys list` is the id's start
    secret = _secret_of(created.key)
    assert not any(secret[i : i + 8] in stored for i in range(len(secret) - 7))


async def test_the_secret_is_only_ever_compared_as_digests_in_constant_time(
    sessions: async_sessionmaker[AsyncSession], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Why this design is timing-safe: the row is found by the key's id, which is not secret
    (``keys list`` shows its start), so the lookup's time says nothing about the secret; then
    SHA-256(presented key) is compared with the stored digest by ``hmac.compare_digest``. Even a
    plain ``==`` there would leak at most how many leading hex digits of a *hash* matched, which
    does not help to guess the key; compare_digest removes that too.

    What is asserted: each check of a presented key makes exactly one comparison, through
    ``hmac.compare_digest``, of two SHA-256 digests (the stored one and the presented key's),
    never of the raw key. Replacing compare_digest by ``==``, or comparing the raw key or the
    secret, fails here; the outcomes (right key in, wrong secret out) are checked as well."""
    async with sessions() as session:
        created = await keys.create_key(session, "alpha", None)
    calls: list[tuple[str, str]] = []
    real = hmac.compare_digest

    def spy(a: str, b: str) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)  # keys.py calls hmac.compare_digest
    wrong = created.key[:-6] + ("AAAAAA" if not created.key.endswith("AAAAAA") else "BBBBBB")
    digest = hashlib.sha256(created.key.encode()).hexdigest()
    async with sessions() as session:
        assert await keys.authenticate(session, created.key) == keys.KeyOwner(created.id, "alpha")
        assert await keys.authenticate(session, wrong) is None
    assert calls == [
        (digest, digest),
        (digest, hashlib.sha256(wrong.encode()).hexdigest()),
    ]


async def test_unknown_malformed_and_revoked_keys_are_refused(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    async with sessions() as session:
        created = await keys.create_key(session, "alpha", None)
        for bad in ("", "rsk", "rsk__x", f"rsk_{'0' * 16}_{_secret_of(created.key)}", "x" * 5000):
            assert await keys.authenticate(session, bad) is None, bad
        await keys.revoke_key(session, created.id)
        assert await keys.authenticate(session, created.key) is None


# --- service URLs: their passwords stay out of messages ------------------------------------


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when the block ends: refused


def _settings(**overrides: str) -> Settings:
    return load_settings(profile="test", **overrides)


@pytest.mark.parametrize(
    ("text_in", "url", "text_out"),
    [
        (
            "redis://default:pw@h:6379/0",
            "redis://default:pw@h:6379/0",
            "redis://default:***@h:6379/0",
        ),
        ("redis://:pw@h/0", "redis://:pw@h/0", "redis://:***@h/0"),
        ("for url 'http://a:pw@q:6333/c'", "http://a:pw@q:6333", "for url 'http://a:***@q:6333/c'"),
        ("redis://h:6379/0", "redis://h:6379/0", "redis://h:6379/0"),
        ("no url here", None, "no url here"),
    ],
)
def test_without_password(text_in: str, url: str | None, text_out: str) -> None:
    assert without_password(text_in, url) == text_out


def test_an_unreachable_redis_is_named_without_its_password() -> None:
    url = f"redis://default:{SECRET}@127.0.0.1:{_closed_port()}/0"
    with pytest.raises(ConfigError) as failure:
        check_redis(_settings(redis_url=url))
    message = failure.value.message
    assert SECRET not in message
    assert "RAG_STREAM_REDIS_URL: cannot reach redis://default:***@127.0.0.1:" in message


@pytest.fixture
def password_protected_http() -> Iterator[str]:
    """A local stand-in for a Qdrant server that wants credentials: 401 to everything."""

    class Refuse(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Refuse)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("where", ["closed", "refusing"])
def test_an_unreachable_qdrant_is_named_without_its_password(
    where: str, password_protected_http: str
) -> None:
    """A refusing server makes httpx's own error quote the URL, credentials included."""
    host = password_protected_http if where == "refusing" else f"127.0.0.1:{_closed_port()}"
    with pytest.raises(ConfigError) as failure:
        check_qdrant(_settings(qdrant_url=f"http://admin:{SECRET}@{host}"))
    message = failure.value.message
    assert SECRET not in message
    assert f"cannot reach http://admin:***@{host}" in message
    if where == "refusing":
        assert "401" in message and "admin:***@" in message.split(": ", 2)[2]


def test_a_failed_migration_does_not_show_the_database_password() -> None:
    url = f"postgresql+asyncpg://rag:{SECRET}@127.0.0.1:{_closed_port()}/rag"
    with pytest.raises(ConfigError) as failure:
        migrate(_settings(database_url=url))
    assert SECRET not in failure.value.message
    assert failure.value.message.startswith("RAG_STREAM_DATABASE_URL: migration failed:")
