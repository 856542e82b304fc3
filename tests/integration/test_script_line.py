"""The event log's scripts on connections of their own (``streaming/script_line.py``), against
the real Redis: replies in order, a failed call that leaves the line usable, a Redis without the
script, a connection killed under the line, a Redis that stops answering, an append of more
streams than one call takes, and a line many callers share."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from rag_stream.schemas.events import StreamStarted, Token
from rag_stream.streaming.event_log import Append, NewStream
from rag_stream.streaming.redis_log import MAX_STREAMS_PER_CALL, RedisEventLog, entry_id
from rag_stream.streaming.script_line import LuaScript, ScriptLine, SharedLine
from tests.conftest import REDIS_URL
from tests.support.redis_server import RedisServer

# echoes its key and argument; an argument "fail" makes it answer with an error
ECHO_SOURCE = """
if ARGV[1] == 'fail' then return redis.error_reply('ERR asked to fail') end
return {KEYS[1], ARGV[1]}
"""
ECHO = LuaScript(ECHO_SOURCE)


@pytest.fixture
async def named() -> AsyncIterator[tuple[Redis, str]]:
    """A client whose connections carry a name of this test's own."""
    name = f"line-{uuid.uuid4().hex[:8]}"
    client = Redis.from_url(REDIS_URL, client_name=name)
    yield client, name
    await client.aclose()


async def test_calls_sent_together_get_their_own_replies_and_a_failed_one_leaves_it_usable(
    named: tuple[Redis, str],
) -> None:
    client, _ = named
    line = ScriptLine(client)
    assert await line.run([(ECHO, ["a"], ["1"]), (ECHO, ["b"], ["2"])]) == [
        [b"a", b"1"],
        [b"b", b"2"],
    ]
    with pytest.raises(ResponseError, match="asked to fail"):
        await line.run([(ECHO, ["c"], ["3"]), (ECHO, ["d"], ["fail"]), (ECHO, ["e"], ["5"])])
    # every reply of the failed run was read: the next call gets its own, not "e"'s
    assert await line.run([(ECHO, ["f"], ["6"])]) == [[b"f", b"6"]]


def unique() -> LuaScript:
    """The echo made one Redis has never seen (so this test need not flush the others')."""
    return LuaScript(ECHO_SOURCE + f"-- {uuid.uuid4().hex}\n")


async def test_a_script_redis_does_not_have_is_given_to_it(named: tuple[Redis, str]) -> None:
    client, _ = named
    line = ScriptLine(client)
    new = unique()
    calls = [(new, ["a"], ["1"]), (ECHO, ["b"], ["2"]), (new, ["c"], ["3"])]
    assert await line.run(calls) == [[b"a", b"1"], [b"b", b"2"], [b"c", b"3"]]


async def test_a_connection_killed_under_the_line_is_replaced(named: tuple[Redis, str]) -> None:
    """As after a restart of Redis: the line's connection is dead and the script unknown."""
    client, name = named
    line = ScriptLine(client)
    echo = unique()
    assert await line.run([]) == []  # the line's connection is open; its script not sent yet
    killer = Redis.from_url(REDIS_URL)
    try:
        ours = [c["id"] for c in await killer.client_list() if c.get("name") == name]
        assert ours, "the line's connection is open"
        for client_id in ours:
            await killer.client_kill_filter(_id=client_id)
    finally:
        await killer.aclose()
    assert await line.run([(echo, ["b"], ["2"])]) == [[b"b", b"2"]]
    assert await line.run([(echo, ["c"], ["3"])]) == [[b"c", b"3"]]


async def test_a_redis_that_stops_answering_times_a_run_out_and_the_line_recovers(
    tmp_path: Path,
) -> None:
    server = RedisServer(tmp_path)
    server.start()
    assert server.proc is not None
    client = Redis.from_url(server.url)
    line = ScriptLine(client, timeout_s=0.2)
    try:
        assert await line.run([(ECHO, ["a"], ["1"])]) == [[b"a", b"1"]]
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            with pytest.raises(RedisTimeoutError):
                await line.run([(ECHO, ["b"], ["2"])])
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        # a new connection: no reply to the runs that timed out is read as this one's
        assert await line.run([(ECHO, ["c"], ["3"])]) == [[b"c", b"3"]]
    finally:
        await client.aclose()
        server.kill()


async def test_one_caller_at_a_time(named: tuple[Redis, str]) -> None:
    client, _ = named
    line = ScriptLine(client)
    first = asyncio.ensure_future(line.run([(ECHO, ["a"], ["1"])]))
    await asyncio.sleep(0)  # the first run is in flight
    with pytest.raises(RuntimeError, match="one caller"):
        await line.run([(ECHO, ["b"], ["2"])])
    assert await first == [[b"a", b"1"]]


async def test_an_append_of_more_streams_than_one_call_takes_lands_each_in_order() -> None:
    """More streams than one script call carries: the append sends several calls in one write,
    and each stream still gets its own result, in order, and its own event in its log."""
    client = Redis.from_url(REDIS_URL)
    log = RedisEventLog(client, prefix=f"rs-line-{uuid.uuid4().hex[:8]}")
    sids = [f"s{i:03d}" for i in range(MAX_STREAMS_PER_CALL + 3)]
    try:
        for sid in sids:
            first = StreamStarted(id=0, stream_id=sid, model="m", created=1.0)
            await log.create(sid, first, NewStream("m", "toy", 1.0), "me", 30_000)
        # every third stream's lease is another process's: its result says so, the others' not
        for sid in sids[::3]:
            await client.set(log._keys(sid)[2], "someone else", px=30_000)
        batches = [
            Append(sid, "me", [Token(id=1, index=0, text=sid, token_ids=[i])], 30_000, 0)
            for i, sid in enumerate(sids)
        ]
        results = await log.append(batches)
        assert [r.owned for r in results] == [i % 3 != 0 for i in range(len(sids))]
        for i, sid in enumerate(sids):
            entries = await client.xrange(log._keys(sid)[0])
            written = [e for e, _ in entries]
            expected = [entry_id(0).encode()] + ([entry_id(1).encode()] if i % 3 else [])
            assert written == expected, sid
            if i % 3:
                assert Token.model_validate_json(entries[1][1][b"e"]).text == sid
    finally:
        keys = [k for sid in sids for k in log._keys(sid)]
        await client.delete(*keys, log._active)
        await client.aclose()


async def test_a_shared_line_answers_each_caller_with_its_own_reply(
    named: tuple[Redis, str],
) -> None:
    """Callers asking while a write is out are answered each with their own reply, a failed
    call failing only its caller, from a later write of them all together."""
    client, _ = named
    shared = SharedLine(ScriptLine(client))
    first = asyncio.ensure_future(shared.call(ECHO, ["a"], ["1"]))
    await asyncio.sleep(0)  # the line's task has sent the first call: the others wait
    later = [
        asyncio.ensure_future(shared.call(ECHO, [str(i)], ["fail" if i == 3 else str(i)]))
        for i in range(6)
    ]
    assert await first == [b"a", b"1"]
    for i, call in enumerate(later):
        if i == 3:
            with pytest.raises(ResponseError, match="asked to fail"):
                await call
        else:
            assert await call == [str(i).encode(), str(i).encode()]


async def test_a_caller_that_leaves_takes_no_other_call_with_it(named: tuple[Redis, str]) -> None:
    client, _ = named
    shared = SharedLine(ScriptLine(client))
    calls = [asyncio.ensure_future(shared.call(ECHO, [str(i)], [str(i)])) for i in range(4)]
    await asyncio.sleep(0)
    calls[1].cancel()
    assert [await calls[i] for i in (0, 2, 3)] == [[b"0", b"0"], [b"2", b"2"], [b"3", b"3"]]
    assert await shared.call(ECHO, ["z"], ["9"]) == [b"z", b"9"]  # and the line goes on
