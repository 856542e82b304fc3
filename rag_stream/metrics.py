"""Prometheus metrics of one service instance (its own registry, so tests can build many apps)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.metrics_core import Metric

from rag_stream.schemas.events import Done

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_TPOT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "rag_stream_requests", "HTTP requests", ["route", "method", "status"], registry=r
        )
        self.streams_finished = Counter(
            "rag_stream_streams_finished", "Streams ended", ["kind", "finish_reason"], registry=r
        )
        self.ttft = Histogram(
            "rag_stream_ttft_seconds",
            "Time to first token",
            ["kind"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "rag_stream_tpot_seconds",
            "Time per output token",
            ["kind"],
            buckets=_TPOT_BUCKETS,
            registry=r,
        )
        self.retrieval = Histogram(
            "rag_stream_retrieval_seconds",
            "Embedding + vector search + SQL join",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue = Histogram(
            "rag_stream_queue_seconds",
            "Accepted request to engine submission",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.rejected = Counter(
            "rag_stream_rejected_requests",
            "Requests refused with a 429, by the limit they hit",
            ["reason"],
            registry=r,
        )
        self.cached_tokens = Counter(
            "rag_stream_prefix_cache_hit_tokens",
            "Prompt tokens served from the prefix cache",
            registry=r,
        )
        self.prompt_tokens = Counter(
            "rag_stream_prompt_tokens", "Prompt tokens submitted", registry=r
        )
        self.completion_tokens = Counter(
            "rag_stream_completion_tokens", "Tokens generated", registry=r
        )
        self.kv = Gauge(
            "rag_stream_kv",
            "KV connector: blocks/bytes saved and loaded, lookups, hits, hit_rate, stored bytes",
            ["stat"],
            registry=r,
        )
        self.active_streams = Gauge(
            "rag_stream_active_streams", "Streams this process is generating", registry=r
        )

    def set_kv(self, stats: dict[str, int | float]) -> None:
        for name, value in stats.items():
            self.kv.labels(name).set(value)

    def observe_done(self, kind: str, done: Done) -> None:
        self.streams_finished.labels(kind, done.finish_reason).inc()
        t = done.timings
        if done.usage.completion_tokens:
            self.ttft.labels(kind).observe(t.ttft_ms / 1000)
        if done.usage.completion_tokens > 1:
            self.tpot.labels(kind).observe(t.tpot_ms / 1000)
        self.queue.observe(t.queue_ms / 1000)
        self.cached_tokens.inc(done.usage.cached_tokens)
        self.prompt_tokens.inc(done.usage.prompt_tokens)
        self.completion_tokens.inc(done.usage.completion_tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry) + generate_latest(_ENGINE)


class _EngineMetrics:
    """vLLM's own metrics (``vllm:*``: requests, tokens, prefix-cache hits, speculative drafts
    proposed and accepted) when its engine runs in this process: its Prometheus logger records
    them in prometheus_client's global registry, which nothing else here exposes. A server on
    vLLM replicas (engine_urls) has none; the replicas show theirs."""

    def collect(self) -> Iterator[Metric]:
        for family in REGISTRY.collect():
            if family.name.startswith("vllm:"):
                yield family


_ENGINE = CollectorRegistry()
_ENGINE.register(_EngineMetrics())
