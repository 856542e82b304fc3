"""A newer version started on a database an older one left keeps its data (issue 35, item 4).

The database is left at revision 0003 (API keys and tenants, before jobs) with the rows that
version wrote: a key, a knowledge base with a document and its chunk, a conversation of two
messages and its stream. Then the service starts on it as ``rag-stream serve`` does (its
``preflight``, which migrates, then the app) on SQLite and on PostgreSQL:

- the start brings the database to the head of the migrations this checkout ships, applying
  each migration after 0003 exactly once (counted from the writes to ``alembic_version``);
- a second start finds it at head and applies nothing;
- every row is still there and read through the API with the old key: the knowledge base,
  its document and chunk, the conversation and its messages.

Head is read from the Alembic script directory, so a migration added later is covered with
no change here. (Processes starting together on one database migrate once:
tests/integration/test_migrations.py. An API container restarted on the same PostgreSQL keeps
a conversation: scripts/deploy_smoke.sh.)
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import event, text
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import create_async_engine

from rag_stream.preflight import preflight
from rag_stream.store.db import alembic_config, upgrade
from tests.support.inprocess import InProcessFactory, explicit_settings, postgres

OLD = "0003"
NOW = "2026-11-30 12:00:00+00:00"
KEY_ID = "0123456789abcdef"
KEY = f"rsk_{KEY_ID}_made-by-the-old-version"  # stored as 0003's code stored one: its SHA-256
DOC_TEXT = "Reconnect with Last-Event-ID and the stream goes on from the next event."

# What the API at 0003 wrote (the columns of migrations 0001-0003).
OLD_ROWS = [
    "INSERT INTO api_keys (id, tenant, name, key_hash, prefix, created_at) VALUES "
    f"('{KEY_ID}', 'local', 'old', '{hashlib.sha256(KEY.encode()).hexdigest()}', "
    f"'{KEY[:12]}', '{NOW}')",
    "INSERT INTO knowledge_bases (id, tenant, name, description, created_at) VALUES "
    f"('kb1', 'local', 'handbook', 'kept across versions', '{NOW}')",
    "INSERT INTO documents (id, kb_id, title, source, content_hash, media_type, text, "
    "metadata, chunk_count, created_at) VALUES ("
    f"'doc1', 'kb1', 'Resuming', 'resume.md', '{'a' * 64}', 'text/markdown', '{DOC_TEXT}', "
    f"'{{\"team\": \"api\"}}', 1, '{NOW}')",
    'INSERT INTO chunks (id, document_id, kb_id, ordinal, text, start, "end", heading, '
    f"token_count) VALUES ('ch1', 'doc1', 'kb1', 0, '{DOC_TEXT}', 0, {len(DOC_TEXT)}, "
    "'Resuming', 14)",
    "INSERT INTO conversations (id, kb_id, tenant, created_at) VALUES "
    f"('conv1', 'kb1', 'local', '{NOW}')",
    "INSERT INTO streams (id, kind, model, conversation_id, finish_reason, text, usage, "
    "created_at, tenant, prompt_tokens, cached_tokens, completion_tokens) VALUES "
    f"('st1', 'answer', 'm', 'conv1', 'stop', 'Use Last-Event-ID.', '{{}}', '{NOW}', "
    "'local', 30, 0, 5)",
    "INSERT INTO messages (id, conversation_id, seq, role, content, stream_id, citations, "
    "usage, finish_reason, created_at) VALUES "
    f"('m1', 'conv1', 0, 'user', 'How do I resume?', NULL, '{{}}', '{{}}', NULL, '{NOW}'), "
    f"('m2', 'conv1', 1, 'assistant', 'Use Last-Event-ID.', 'st1', '{{}}', "
    f"'{{\"completion_tokens\": 5}}', 'stop', '{NOW}')",
]


def _migrations_after(revision: str) -> list[str]:
    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    return [r.revision for r in script.iterate_revisions("heads", revision)]


def _head() -> str:
    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    assert head is not None
    return head


async def _sql(url: str, statements: list[str]) -> list[list[Any]]:
    engine = create_async_engine(url)
    out: list[list[Any]] = []
    try:
        async with engine.begin() as conn:
            for statement in statements:
                result = await conn.execute(text(statement))
                out.append([tuple(r) for r in result.all()] if result.returns_rows else [])
    finally:
        await engine.dispose()
    return out


_VERSION_WRITE = re.compile(r"^\s*(INSERT INTO|UPDATE) alembic_version\b", re.I)


@contextmanager
def version_writes() -> Iterator[list[str]]:
    """The statements that move ``alembic_version`` while the block runs, one per migration
    applied (any engine of this process: Alembic makes its own)."""
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if _VERSION_WRITE.match(statement):
            seen.append(statement)

    event.listen(Engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(Engine, "before_cursor_execute", record)


@pytest.fixture(params=["sqlite", "postgresql"])
async def old_database(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """A database at revision 0003 holding that version's rows: its URL."""
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path / 'old.db'}"
        await asyncio.to_thread(upgrade, url, OLD)
        await _sql(url, OLD_ROWS)
        yield url
        return
    async with postgres("rag_stream_upgrade") as url:
        await asyncio.to_thread(upgrade, url, OLD)
        await _sql(url, OLD_ROWS)
        yield url


async def test_a_newer_version_started_on_an_older_database_migrates_once_and_keeps_its_rows(
    old_database: str, tmp_path: Path, models_dir: Path, in_process_factory: InProcessFactory
) -> None:
    expected = _migrations_after(OLD)
    assert expected, "no migration after 0003: nothing to upgrade"
    data_dir = tmp_path / "data"
    settings = explicit_settings(data_dir, models_dir, database_url=old_database)

    with version_writes() as first_start:
        await asyncio.to_thread(preflight, settings)  # what `rag-stream serve` runs first
    (version,) = (await _sql(old_database, ["SELECT version_num FROM alembic_version"]))[0]
    assert version == (_head(),)
    assert len(first_start) == len(expected), first_start

    auth = {"Authorization": f"Bearer {KEY}"}
    with version_writes() as second_start:
        # the harness migrates as the start does (preflight.migrate): at head, a no-op
        service = in_process_factory(database_url=old_database, data_dir=data_dir, headers=auth)
        async with service as app:
            assert second_start == []
            client = app.client
            assert (await client.get("/v1/kbs", headers={"Authorization": ""})).status_code == 401

            kbs = (await client.get("/v1/kbs")).json()["data"]
            assert [(k["name"], k["description"], k["document_count"]) for k in kbs] == [
                ("handbook", "kept across versions", 1)
            ]
            docs = (await client.get("/v1/kbs/handbook/documents")).json()
            assert [(d["id"], d["title"], d["metadata"]) for d in docs["data"]] == [
                ("doc1", "Resuming", {"team": "api"})
            ]
            r = await client.get("/v1/kbs/handbook/documents/doc1?include_chunks=true")
            assert r.status_code == 200, r.text
            doc = r.json()
            assert doc["text"] == DOC_TEXT
            assert [(c["id"], c["heading"]) for c in doc["chunks"]] == [("ch1", "Resuming")]

            r = await client.get("/v1/conversations/conv1")
            assert r.status_code == 200, r.text
            messages = r.json()["messages"]
            assert [(m["role"], m["content"], m["stream_id"]) for m in messages] == [
                ("user", "How do I resume?", None),
                ("assistant", "Use Last-Event-ID.", "st1"),
            ]
    (version,) = (await _sql(old_database, ["SELECT version_num FROM alembic_version"]))[0]
    assert version == (_head(),)
