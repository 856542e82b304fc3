"""Tokens per event: the request's rule, the "auto" rule from the connection's round-trip time,
and the coalescing itself (by count, and by time when the engine is slow)."""

from __future__ import annotations

import socket
from typing import Any, cast

import pytest

from rag_stream.generation.engine import Engine, EngineStep
from rag_stream.schemas.events import Token
from rag_stream.schemas.generate import Coalesce
from rag_stream.settings import StreamingSettings
from rag_stream.streaming.coalesce import (
    AUTO_SLOW,
    SOCKET_KEY,
    CoalescePolicy,
    kernel_rtt_ms,
)
from rag_stream.streaming.memory_log import MemoryEventLog
from tests.support.fakes import ByteTokenizer, start_toy, stub_engine, toy_streams

CFG = StreamingSettings(coalesce_rtt_ms=100)


def test_a_request_rule_wins_and_no_rule_means_the_settings() -> None:
    policy = CoalescePolicy(StreamingSettings(coalesce_tokens=2, coalesce_ms=7), lambda _s: 500.0)
    assert policy.resolve(Coalesce(tokens=5, ms=20), {}) == Coalesce(tokens=5, ms=20)
    assert policy.resolve(None, {}) == Coalesce(tokens=2, ms=7)


@pytest.mark.parametrize(
    ("rtt_ms", "expected"),
    [(250.0, AUTO_SLOW), (100.0, Coalesce()), (3.0, Coalesce()), (None, Coalesce())],
)
def test_auto_follows_the_round_trip_time(rtt_ms: float | None, expected: Coalesce) -> None:
    scopes: list[Any] = []

    def source(scope: Any) -> float | None:
        scopes.append(scope)
        return rtt_ms

    scope = {"type": "http"}
    assert CoalescePolicy(CFG, source).resolve("auto", scope) == expected
    assert scopes == [scope]  # asked about this request's connection


def test_kernel_rtt_of_a_real_loopback_connection() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        conn, _ = server.accept()
        with client, conn:
            for _ in range(5):  # a few exchanges give the kernel samples to smooth
                client.sendall(b"ping")
                conn.recv(4)
                conn.sendall(b"pong")
                client.recv(4)
            rtt = kernel_rtt_ms({SOCKET_KEY: conn})
    assert rtt is not None and 0 < rtt < 50, rtt  # loopback: well under a millisecond
    assert CoalescePolicy(CFG).resolve("auto", {SOCKET_KEY: conn}) == Coalesce()


def test_no_socket_means_unknown_rtt() -> None:
    assert kernel_rtt_ms({}) is None
    a, b = socket.socketpair()  # a unix socket has no TCP_INFO
    with a, b:
        assert kernel_rtt_ms({SOCKET_KEY: a}) is None


async def _tokens(rule: Coalesce, max_tokens: int, delay_s: float = 0.0) -> list[Token]:
    streams, kind = toy_streams(MemoryEventLog(), stub_engine(delay_s=delay_s))
    sid = await start_toy(streams, kind, list(b"hi"), max_tokens, rule)
    events = [e async for e in streams.follow(sid)]
    await streams.close()
    assert [e.id for e in events] == list(range(len(events)))
    assert events[-1].type == "done"
    return [e for e in events if isinstance(e, Token)]


async def test_coalesced_events_carry_the_same_tokens_in_fewer_events() -> None:
    plain = await _tokens(Coalesce(), 200)
    merged = await _tokens(Coalesce(tokens=4, ms=1000), 200)
    ids = [t for e in plain for t in e.token_ids]
    assert [t for e in merged for t in e.token_ids] == ids
    assert "".join(e.text for e in merged) == "".join(e.text for e in plain)
    assert ByteTokenizer().decode(ids) == "".join(e.text for e in merged)
    sizes = [len(e.token_ids) for e in merged]
    # 4 tokens an event; a character still being completed may add up to 3 more
    assert all(4 <= n <= 7 for n in sizes[:-1]), sizes
    assert len(merged) < len(plain) / 3
    assert [e.index for e in merged] == [sum(sizes[:i]) for i in range(len(sizes))]


async def test_a_slow_engine_sends_what_it_has_after_the_time_limit() -> None:
    # 60 ms a token against a 20 ms limit: no event waits for a second token
    slow = await _tokens(Coalesce(tokens=8, ms=20), 12, delay_s=0.06)
    merged_chars = sum(len(e.token_ids) > 1 for e in slow)
    assert merged_chars <= 4  # only multi-byte characters come as several tokens
    assert len(slow) >= 8


class _BurstEngine:
    """The stub engine handing its tokens over ``burst`` at a time, as vLLM does to a reader
    that fell behind (a busy machine) or after a speculative step."""

    def __init__(self, burst: int) -> None:
        self._engine = stub_engine()
        self._burst = burst

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def generate(self, request_id: str, prompt: Any, sampling: Any) -> Any:
        held: list[int] = []
        async for step in self._engine.generate(request_id, prompt, sampling):
            held.extend(step.token_ids)
            if len(held) >= self._burst or step.finish_reason is not None:
                yield EngineStep(held, step.prompt_tokens, step.cached_tokens, step.finish_reason)
                held = []


async def _burst_tokens(rule: Coalesce, max_tokens: int, burst: int) -> list[Token]:
    streams, kind = toy_streams(MemoryEventLog(), cast(Engine, _BurstEngine(burst)))
    sid = await start_toy(streams, kind, list(b"hi"), max_tokens, rule)
    events = [e async for e in streams.follow(sid)]
    await streams.close()
    assert events[-1].type == "done"
    return [e for e in events if isinstance(e, Token)]


@pytest.mark.parametrize("rule", [Coalesce(), Coalesce(tokens=4, ms=1000)])
async def test_tokens_an_engine_hands_over_at_once_still_follow_the_rule(rule: Coalesce) -> None:
    steady = await _tokens(rule, 120)
    burst = await _burst_tokens(rule, 120, burst=10)
    assert [e.model_dump() for e in burst] == [e.model_dump() for e in steady]
    # one token an event by default, four with the rule (a character still being completed
    # may add up to 3 more): never the ten a step brought
    most = rule.tokens + 3 if rule.tokens > 1 else 4
    assert all(len(e.token_ids) <= most for e in burst), [len(e.token_ids) for e in burst]
