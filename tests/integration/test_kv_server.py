"""`serve` with KV snapshots on: the app wires the connector into its engine, /metrics reads it.

The server is the session's ``tiny_server``, which runs with KV snapshots on for this module.
"""

from __future__ import annotations

import time
import uuid

import httpx
import pytest

from tests.support.kv_metrics import kv_counters, settled_kv_counters
from tests.support.server import ServerProcess

pytestmark = pytest.mark.engine


def test_blocks_are_saved_to_redis_and_counted_on_metrics(tiny_server: ServerProcess) -> None:
    before = settled_kv_counters(tiny_server)
    # > 2 KV blocks, new to this server and its Redis prefix (nothing of it is stored yet)
    prompt = (
        f"Log {uuid.uuid4().hex}. " + "The lighthouse keeper wrote in the log every night. " * 40
    )
    r = httpx.post(
        f"{tiny_server.url}/v1/generate",
        json={"prompt": prompt, "max_tokens": 8, "stream": False},
        timeout=300,
    )
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] > 256
    deadline = time.monotonic() + 30  # the connector's writer thread saves in the background
    while True:
        after = kv_counters(tiny_server)
        if after.get("blocks_saved", 0) - before.get("blocks_saved", 0) >= 2:
            break
        assert time.monotonic() < deadline, after
        time.sleep(0.2)
    assert after["stored_bytes"] > 0
