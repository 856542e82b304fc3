"""Alembic migrations on SQLite and on the real PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import inspect
from sqlalchemy.ext.asyncio import create_async_engine

from rag_stream.store.db import alembic_config, upgrade
from rag_stream.store.models import Base
from tests.support.pg import postgres_database


def _tables(url: str) -> set[str]:
    async def read() -> set[str]:
        engine = create_async_engine(url)
        async with engine.connect() as conn:
            names = await conn.run_sync(lambda c: set(inspect(c).get_table_names()))
        await engine.dispose()
        return names

    return asyncio.run(read())


@pytest.fixture
def postgres_db() -> Iterator[str]:
    """A fresh database on the real PostgreSQL server, dropped afterwards."""
    yield from postgres_database("rag_stream_migrations")


def _check_round_trip(url: str) -> None:
    upgrade(url)
    expected = set(Base.metadata.tables)
    assert expected <= _tables(url)
    upgrade(url)  # idempotent at head
    command.downgrade(alembic_config(url), "base")
    assert not expected & _tables(url)
    upgrade(url)
    assert expected <= _tables(url)


def test_migrations_round_trip_on_sqlite(tmp_path: Path) -> None:
    _check_round_trip(f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}")


def test_migrations_round_trip_on_postgresql(postgres_db: str) -> None:
    _check_round_trip(postgres_db)


def test_models_match_migrations(tmp_path: Path) -> None:
    """Autogenerate finds nothing to add: every model change has its migration."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    url = f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}"
    upgrade(url)

    async def diff() -> list[object]:
        engine = create_async_engine(url)
        async with engine.connect() as conn:
            result = await conn.run_sync(
                lambda c: compare_metadata(MigrationContext.configure(c), Base.metadata)
            )
        await engine.dispose()
        return list(result)

    assert asyncio.run(diff()) == []


def _check_tenants_upgrade(url: str) -> None:
    """Rows made before tenants belong to "local" after 0003, and a KB name is then unique per
    tenant only."""
    from sqlalchemy import text

    upgrade(url, "0002")
    now = "2026-11-01 00:00:00+00:00"

    async def run(statements: list[str]) -> list[object]:
        engine = create_async_engine(url)
        out: list[object] = []
        async with engine.begin() as conn:
            for sql in statements:
                result = await conn.execute(text(sql))
                out.append(result.all() if result.returns_rows else None)
        await engine.dispose()
        return out

    asyncio.run(
        run(
            [
                "INSERT INTO knowledge_bases (id, name, created_at) "
                f"VALUES ('k1', 'docs', '{now}')",
                f"INSERT INTO conversations (id, kb_id, created_at) VALUES ('c1', 'k1', '{now}')",
                "INSERT INTO streams (id, kind, model, finish_reason, text, usage, created_at) "
                f"""VALUES ('s1', 'answer', 'm', 'stop', 'hi', '{{}}', '{now}')""",
            ]
        )
    )
    upgrade(url)
    kbs, convs, streams = asyncio.run(
        run(
            [
                "INSERT INTO knowledge_bases (id, tenant, name, created_at) "
                f"VALUES ('k2', 'acme', 'docs', '{now}')",
                "SELECT id, tenant, name FROM knowledge_bases ORDER BY id",
                "SELECT tenant FROM conversations",
                "SELECT tenant, prompt_tokens, completion_tokens FROM streams",
            ]
        )
    )[1:]
    assert [tuple(r) for r in kbs] == [("k1", "local", "docs"), ("k2", "acme", "docs")]  # type: ignore[union-attr]
    assert [tuple(r) for r in convs] == [("local",)]  # type: ignore[union-attr]
    assert [tuple(r) for r in streams] == [("local", 0, 0)]  # type: ignore[union-attr]
    with pytest.raises(Exception, match=r"(?i)unique"):
        asyncio.run(
            run(
                [
                    "INSERT INTO knowledge_bases (id, tenant, name, created_at) "
                    f"VALUES ('k3', 'acme', 'docs', '{now}')"
                ]
            )
        )


def test_rows_from_before_tenants_belong_to_local_on_sqlite(tmp_path: Path) -> None:
    _check_tenants_upgrade(f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}")


def test_rows_from_before_tenants_belong_to_local_on_postgresql(postgres_db: str) -> None:
    _check_tenants_upgrade(postgres_db)


def _check_jobs_upgrade(url: str) -> None:
    """0004 adds jobs and their sections to a database in use; deleting a job deletes its
    sections; a downgrade removes both and keeps the rest."""
    from sqlalchemy import text

    upgrade(url, "0003")
    now = "2026-11-30 00:00:00+00:00"

    async def run(statements: list[str]) -> list[object]:
        engine = create_async_engine(url)
        out: list[object] = []
        async with engine.begin() as conn:
            if url.startswith("sqlite"):
                await conn.execute(text("PRAGMA foreign_keys=ON"))
            for sql in statements:
                result = await conn.execute(text(sql))
                out.append(result.all() if result.returns_rows else None)
        await engine.dispose()
        return out

    asyncio.run(
        run([f"INSERT INTO knowledge_bases (id, name, created_at) VALUES ('k1', 'd', '{now}')"])
    )
    upgrade(url)
    assert {"jobs", "job_sections"} <= _tables(url)
    jobs, sections = asyncio.run(
        run(
            [
                "INSERT INTO jobs (id, kb_id, title, spec, status, sections_total, sections_done, "
                f"tokens, created_at) VALUES ('j1', 'k1', 'T', '{{}}', 'queued', 2, 0, 0, '{now}')",
                'INSERT INTO job_sections (job_id, "index", heading, text, tokens, finish_reason, '
                f"citations, finished_at) VALUES ('j1', 0, 'H', 'x', 1, 'stop', '{{}}', '{now}')",
                "SELECT id, tenant, status FROM jobs",
                "DELETE FROM jobs WHERE id = 'j1'",
                "SELECT job_id FROM job_sections",
            ]
        )
    )[2::2]
    assert [tuple(r) for r in jobs] == [("j1", "local", "queued")]  # type: ignore[union-attr]
    assert sections == []
    command.downgrade(alembic_config(url), "0003")
    assert not {"jobs", "job_sections"} & _tables(url)
    assert "knowledge_bases" in _tables(url)


def test_jobs_tables_upgrade_and_downgrade_on_sqlite(tmp_path: Path) -> None:
    _check_jobs_upgrade(f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}")


def test_jobs_tables_upgrade_and_downgrade_on_postgresql(postgres_db: str) -> None:
    _check_jobs_upgrade(postgres_db)


def test_processes_migrating_one_fresh_database_at_once_all_succeed(postgres_db: str) -> None:
    """Several API processes started together (replicas behind a proxy, ``serve --workers``)
    each migrate at start: one applies the migrations, the others wait for it and find the
    database at head, instead of failing on a table or version row the first just created."""
    import subprocess
    import sys

    code = "import sys; from rag_stream.store.db import upgrade; upgrade(sys.argv[1])"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, postgres_db], stderr=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    results = [(p.wait(120), p.stderr.read() if p.stderr else "") for p in procs]
    assert [rc for rc, _ in results] == [0, 0, 0], [err[-2000:] for _, err in results]
    assert set(Base.metadata.tables) <= _tables(postgres_db)
