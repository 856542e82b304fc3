"""Fixtures for the service in the test process (tests/support/inprocess.py); a pytest plugin of
the root conftest (``pytest_plugins``).

- ``in_process_factory`` (session): ``async with in_process_factory(**overrides) as service``,
  one app with the settings ``explicit_settings`` takes (``limits__max_tokens=4000``,
  ``event_log="memory"``...), ``StubOptions``' fields (``delay_s=0.005``, ``rtt_ms=250``...)
  and ``database="postgresql"`` (a fresh database, dropped after the app; SQLite by default),
  each on a data dir of its own.
- ``in_process``: one app for the test; ``in_process_module``: one app a module's tests share.
  Both take their arguments from the nearest ``@pytest.mark.in_process(**overrides)`` (for the
  module one: ``pytestmark`` of the module).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

# The app and its clients are imported by the fixtures, when a test uses one: a run without
# in-process tests (the unit tests alone, say) does not pay for importing the service.
if TYPE_CHECKING:
    from rag_stream.retrieval.embedder import Embedder
    from tests.support.inprocess import InProcess, InProcessFactory


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "in_process(**overrides): the settings and stub options of in_process apps"
    )


@pytest.fixture(scope="session")
async def shared_embedder(embedder_path: Path) -> Embedder:
    """The prepared embedder, loaded once: every in-process app gets this very object (its
    factory returns it; the app's lifespan never closes an embedder)."""
    from rag_stream.retrieval.embedder import load_embedder

    return await load_embedder(str(embedder_path), batch_size=64, backend="auto")


@pytest.fixture(scope="session")
def in_process_factory(
    tmp_path_factory: pytest.TempPathFactory, models_dir: Path, shared_embedder: Embedder
) -> InProcessFactory:
    from tests.support.inprocess import (
        SchemaTemplate,
        StubOptions,
        explicit_settings,
        postgres,
        run_in_process,
    )

    template = SchemaTemplate()
    stub_fields = {f.name for f in dataclasses.fields(StubOptions)}

    @contextlib.asynccontextmanager
    async def start(
        *, database: str = "sqlite", headers: dict[str, str] | None = None, **overrides: Any
    ) -> AsyncIterator[InProcess]:
        stub = StubOptions(**{k: v for k, v in overrides.items() if k in stub_fields})
        given = {k: v for k, v in overrides.items() if k not in stub_fields}
        given.setdefault("data_dir", tmp_path_factory.mktemp("inprocess-data"))
        async with contextlib.AsyncExitStack() as stack:
            migrated: SchemaTemplate | None = template
            if database == "postgresql":
                given["database_url"] = await stack.enter_async_context(postgres(migrated=True))
                migrated = None  # a copy of a database at the schema's head
            elif database != "sqlite":
                raise ValueError(f"database must be 'sqlite' or 'postgresql', not {database!r}")
            settings = explicit_settings(models_dir=models_dir, **given)
            yield await stack.enter_async_context(
                run_in_process(settings, shared_embedder, stub, migrated=migrated, headers=headers)
            )

    return start


def _marked(node: pytest.Item | pytest.Collector) -> dict[str, Any]:
    marker = node.get_closest_marker("in_process")
    return dict(marker.kwargs) if marker is not None else {}


@pytest.fixture
async def in_process(
    request: pytest.FixtureRequest, in_process_factory: InProcessFactory
) -> AsyncIterator[InProcess]:
    async with in_process_factory(**_marked(request.node)) as service:
        yield service


@pytest.fixture(scope="module")
async def in_process_module(
    request: pytest.FixtureRequest, in_process_factory: InProcessFactory
) -> AsyncIterator[InProcess]:
    async with in_process_factory(**_marked(request.node)) as service:
        yield service
