"""Throwaway databases at the schema's head, or empty: on the real PostgreSQL server, or SQLite.

A database at head is a copy of one migrated once per test process (PostgreSQL's ``CREATE
DATABASE ... TEMPLATE``, a file copy on the server; an SQLite file copied), where Alembic takes
about a second a run; the migrations themselves are tested on fresh databases
(tests/integration/test_migrations.py, test_upgrade.py)."""

from __future__ import annotations

import asyncio
import atexit
import functools
import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

from rag_stream.store.db import upgrade
from tests.conftest import POSTGRES_URL

_ADMIN = POSTGRES_URL.replace("postgresql+asyncpg", "postgresql")


@functools.cache
def sqlite_at_head() -> Path:
    """An SQLite file at the schema's head, migrated once per test process: copy it, never open
    it (``shutil.copyfile(sqlite_at_head(), path)``)."""
    folder = Path(tempfile.mkdtemp(prefix="rag-stream-schema-"))
    atexit.register(shutil.rmtree, folder, True)
    upgrade(f"sqlite+aiosqlite:///{folder / 'db.sqlite'}")
    return folder / "db.sqlite"


def _run(sql: str) -> None:
    import asyncpg

    async def run() -> None:
        conn = await asyncpg.connect(_ADMIN)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(run())


def _url(name: str) -> str:
    return POSTGRES_URL.rsplit("/", 1)[0] + "/" + name


def postgres_database(prefix: str = "rag_stream_test", *, migrated: bool = False) -> Iterator[str]:
    """Create a fresh database (at the schema's head with ``migrated``), yield its async URL,
    drop it afterwards (use as a fixture body)."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    template = f' TEMPLATE "{_schema_template()}"' if migrated else ""
    _run(f'CREATE DATABASE "{name}"{template}')
    try:
        yield _url(name)
    finally:
        _run(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


_template: str | None = None
_template_lock = threading.Lock()


def _schema_template() -> str:
    """This process's database at the schema's head (made on first use, dropped at exit). Only
    ``CREATE DATABASE`` reads it, so no session is ever connected to it when one is copied."""
    global _template
    with _template_lock:
        if _template is None:
            from rag_stream.store.db import upgrade

            name = f"rag_stream_schema_{uuid.uuid4().hex[:8]}"
            _run(f'CREATE DATABASE "{name}"')
            atexit.register(_run, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            upgrade(_url(name))
            _template = name
        return _template
