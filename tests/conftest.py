"""Shared fixtures: prepared models, a tiny test model, real Redis/PostgreSQL, server processes."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rag_stream.prepare import make_tiny_model
from rag_stream.settings import DEFAULT_EMBEDDER_DIRNAME, DEFAULT_LLM_DIRNAME
from tests.support.server import ROOT, ServerProcess

REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
# A Qdrant server for the store tests (backend "server" in tests/support/kb_stack.py), each on a
# collection of its own. Left in place, every other setting and server process of the run
# would read it too and share the server's one collection.
if "RAG_STREAM_QDRANT_URL" in os.environ:
    os.environ["TEST_QDRANT_URL"] = os.environ.pop("RAG_STREAM_QDRANT_URL")
POSTGRES_URL = os.environ.get(
    "TEST_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
)


@pytest.fixture(scope="session")
def models_dir() -> Path:
    path = Path(os.environ.get("RAG_STREAM_MODELS_DIR", ROOT / ".data" / "models")).resolve()
    if not (path / DEFAULT_LLM_DIRNAME / ".prepared").exists():
        pytest.fail(f"models are not prepared under {path}: run `make install` first")
    return path


@pytest.fixture(scope="session")
def smollm2_path(models_dir: Path) -> Path:
    return models_dir / DEFAULT_LLM_DIRNAME


@pytest.fixture(scope="session")
def embedder_path(models_dir: Path) -> Path:
    return models_dir / DEFAULT_EMBEDDER_DIRNAME


@pytest.fixture(scope="session")
def tiny_model(models_dir: Path) -> Path:
    return make_tiny_model(models_dir / "tiny-llama-test", models_dir / DEFAULT_LLM_DIRNAME)


@pytest.fixture(scope="session")
def other_tiny_model(models_dir: Path) -> Path:
    """Another random-weight model with the tiny model's very layout (other weights)."""
    return make_tiny_model(
        models_dir / "tiny-llama-test-other", models_dir / DEFAULT_LLM_DIRNAME, seed=4321
    )


@pytest.fixture(scope="session")
def tokenizer(smollm2_path: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_path))


ServerFactory = Callable[..., ServerProcess]
SESSION_PREFIX = f"rs-test-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def server_factory(
    tmp_path_factory: pytest.TempPathFactory, models_dir: Path
) -> Iterator[ServerFactory]:
    """Start real `rag-stream serve` processes; all are stopped at the end of the session."""
    started: list[ServerProcess] = []

    def start(
        *,
        wait: bool = True,
        data_dir: Path | None = None,
        stub_delay_s: float | None = None,
        **env: str,
    ) -> ServerProcess:
        """A server process; with ``stub_delay_s``, on the stub engine paced at that many
        seconds per token (tests where timing is the point), else on vLLM."""
        data = data_dir or tmp_path_factory.mktemp("data")
        base = {
            "RAG_STREAM_PROFILE": "test",
            # streams of this test session only: other users of the shared Redis never see them
            "RAG_STREAM_STREAMING__KEY_PREFIX": SESSION_PREFIX,
            "RAG_STREAM_DATA_DIR": str(data),
            "RAG_STREAM_MODELS_DIR": str(models_dir),
        }
        command = None
        if stub_delay_s is not None:
            base["STUB_TOKEN_DELAY_S"] = str(stub_delay_s)
            command = [sys.executable, "-m", "tests.support.stub_server"]
        log = tmp_path_factory.mktemp("logs") / f"server-{uuid.uuid4().hex[:6]}.log"
        server = ServerProcess({**base, **env}, log, command=command)
        started.append(server)
        if wait:
            server.wait_ready()
        return server

    yield start
    for server in started:
        server.stop()


STUB_DELAY_S = 0.005  # 200 tokens a second on any machine

# The shared and started-ahead server processes, and when each stops; the service in the test
# process (tests/support/inprocess.py).
pytest_plugins = ["tests.support.session_servers", "tests.support.inprocess_fixtures"]
