"""`serve` with KV snapshots on: the app wires the connector into its engine, /metrics reads it."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import REDIS_URL, ServerFactory
from tests.support.server import ServerProcess

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def kv_server(server_factory: ServerFactory, tiny_model: Path) -> Iterator[ServerProcess]:
    server = server_factory(
        RAG_STREAM_MODEL=str(tiny_model),
        RAG_STREAM_REDIS_URL=REDIS_URL,
        RAG_STREAM_KV__ENABLED="true",
        RAG_STREAM_KV__KEY_PREFIX=f"rs-test-kv-{uuid.uuid4().hex[:8]}",
    )
    yield server
    server.stop()


def _kv(server: ServerProcess) -> dict[str, float]:
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    return {
        s.labels["stat"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "rag_stream_kv"
    }


def test_blocks_are_saved_to_redis_and_counted_on_metrics(kv_server: ServerProcess) -> None:
    before = _kv(kv_server)
    prompt = "The lighthouse keeper wrote in the log every night. " * 40  # > 2 KV blocks
    r = httpx.post(
        f"{kv_server.url}/v1/generate",
        json={"prompt": prompt, "max_tokens": 8, "stream": False},
        timeout=300,
    )
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] > 256
    deadline = time.monotonic() + 30  # the connector's writer thread saves in the background
    while True:
        after = _kv(kv_server)
        if after.get("blocks_saved", 0) - before.get("blocks_saved", 0) >= 2:
            break
        assert time.monotonic() < deadline, after
        time.sleep(0.2)
    assert after["stored_bytes"] > 0
