"""Throwaway databases on the real PostgreSQL server."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

from tests.conftest import POSTGRES_URL


def postgres_database(prefix: str = "rag_stream_test") -> Iterator[str]:
    """Create a fresh database, yield its async URL, drop it afterwards (use as a fixture body)."""
    import asyncpg

    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    admin = POSTGRES_URL.replace("postgresql+asyncpg", "postgresql")

    async def run(sql: str) -> None:
        conn = await asyncpg.connect(admin)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(run(f'CREATE DATABASE "{name}"'))
    try:
        yield POSTGRES_URL.rsplit("/", 1)[0] + "/" + name
    finally:
        asyncio.run(run(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
