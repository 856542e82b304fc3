"""The embedded defaults end to end: SmolLM2 on vLLM, embedded redis, SQLite, local Qdrant."""

from __future__ import annotations

from pathlib import Path

import httpx
import psutil
import pytest

from tests.conftest import ServerFactory
from tests.support.server import ServerProcess
from tests.support.sse import read_stream, text_of

pytestmark = [pytest.mark.engine, pytest.mark.smollm2]


@pytest.fixture(scope="session")
def default_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("default-data")


@pytest.fixture(scope="session")
def default_server(server_factory: ServerFactory, default_data_dir: Path) -> ServerProcess:
    # default profile, no URLs: every dependency is the embedded one
    return server_factory(RAG_STREAM_PROFILE="default", data_dir=default_data_dir)


def test_embedded_state_lives_under_the_data_dir(
    default_server: ServerProcess, default_data_dir: Path
) -> None:
    ready = httpx.get(default_server.url + "/readyz").json()
    assert ready["status"] == "ready"
    assert (default_data_dir / "rag-stream.db").is_file()
    assert (default_data_dir / "qdrant").is_dir()
    assert (default_data_dir / "redis").is_dir()
    # the embedded Redis is a real redis-server process working in that folder
    redis_dir = str((default_data_dir / "redis").resolve())
    servers = [p for p in psutil.process_iter(["name", "cwd"]) if p.info["name"] == "redis-server"]
    assert any(p.info["cwd"] == redis_dir for p in servers)


def test_smollm2_answers_a_fixed_question(default_server: ServerProcess) -> None:
    body = {"prompt": "What is the capital of France?", "chat": True, "max_tokens": 30}
    with httpx.Client(base_url=default_server.url, timeout=120) as client:
        frames = read_stream(client, "POST", "/v1/generate", json=body)
    answer = text_of(frames)
    assert "Paris" in answer, answer
    assert frames[-1].event == "done"
    assert frames[-1].data["finish_reason"] == "stop"
    # tokens arrive one event at a time, not as one blob
    assert sum(f.event == "token" for f in frames) >= 5
