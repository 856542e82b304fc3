"""The KV connector's counters as a rag-stream server reports them on /metrics."""

from __future__ import annotations

import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support.server import ServerProcess


def kv_counters(server: ServerProcess) -> dict[str, float]:
    """``rag_stream_kv`` by stat (summed over the engines that share the server's prefix)."""
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    return {
        s.labels["stat"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "rag_stream_kv"
    }


def settled_kv_counters(server: ServerProcess, timeout_s: float = 30) -> dict[str, float]:
    """The counters once the saves of earlier requests stopped landing: the connector saves
    in the background, and other tests may share the server."""
    deadline = time.monotonic() + timeout_s
    last = kv_counters(server)
    while True:
        time.sleep(0.5)
        now = kv_counters(server)
        if now.get("blocks_saved", 0) == last.get("blocks_saved", 0):
            return now
        assert time.monotonic() < deadline, now
        last = now
