"""`rag-stream ask` as a person runs it: a subprocess against a real server (the suite's
tiny-model one, as in test_client.py)."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from rag_stream.client import Client
from rag_stream.schemas.answers import AnswerResponse
from tests.integration.test_client import DOCS, MAX_TOKENS, QUESTION  # the same KB and question
from tests.support.brake import Brake, engine_cores
from tests.support.kb import make_kb
from tests.support.proxy import TcpProxy
from tests.support.server import ROOT, ServerProcess

pytestmark = pytest.mark.engine

FIGURES = re.compile(r"^TTFT \d+ ms · \d+\.\d tokens/s · \d+ tokens ")


@pytest.fixture(scope="module")
def server(tiny_server: ServerProcess) -> ServerProcess:
    return tiny_server


@pytest.fixture(scope="module")
def kb(server: ServerProcess) -> str:
    return make_kb(server.url, DOCS, prefix="ask")


@pytest.fixture(scope="module")
def reference(server: ServerProcess, kb: str) -> AnswerResponse:
    with Client(server.url) as client:
        answer = client.answer(kb, QUESTION, max_tokens=MAX_TOKENS)
    assert len(answer.answer) > 100 and answer.citations, answer
    return answer


def _ask_command(url: str, kb: str, question: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "rag_stream", "ask", "--kb", kb, "--url", url, question, *extra]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAG_STREAM_URL", "RAG_STREAM_API_KEY")}
    return {**env, "PYTHONUNBUFFERED": "1"}


class _Running:
    """The command as a subprocess whose stdout lines arrive through a queue."""

    def __init__(self, command: list[str]) -> None:
        self.proc = subprocess.Popen(
            command,
            cwd=ROOT,
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # a suite started in the background (nohup ... &) hands its children SIGINT
            # ignored; the CLI is run as from a terminal, where Ctrl-C is delivered
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def events_until(self, enough: int, timeout_s: float = 180) -> list[dict[str, Any]]:
        """JSON events (--json) until ``enough`` token events have come."""
        events: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout_s
        while sum(e["type"] == "token" for e in events) < enough:
            events.append(json.loads(self.lines.get(timeout=max(0.1, deadline - time.monotonic()))))
        return events

    def finish(self, timeout_s: float = 180) -> tuple[int, list[str], str]:
        code = self.proc.wait(timeout=timeout_s)
        assert self.proc.stderr is not None
        stderr = self.proc.stderr.read()
        self._reader.join(timeout_s)  # it ends at the pipe's end: every line is queued
        rest = []
        while not self.lines.empty():
            rest.append(self.lines.get())
        return code, rest, stderr

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def test_ask_prints_the_sources_then_the_answer_then_the_figures(
    server: ServerProcess, kb: str, reference: AnswerResponse
) -> None:
    command = _ask_command(server.url, kb, QUESTION, "--max-tokens", str(MAX_TOKENS))
    done = subprocess.run(
        command, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    # the numbered sources, in order, before any of the answer
    answer_at = out.index(reference.answer)
    for citation in reference.citations:
        line = f"[{citation.n}] {citation.title}"
        assert line in out[:answer_at], out
    assert out.index("[1] ") < answer_at
    lines = out.rstrip("\n").split("\n")
    assert FIGURES.match(lines[-2]), lines[-2:]
    assert lines[-1].startswith("conversation ")
    assert done.stderr == ""


def test_ask_resumes_after_the_connection_drops(
    server: ServerProcess, kb: str, reference: AnswerResponse
) -> None:
    with TcpProxy(server.port) as proxy, Client(server.url) as direct:
        run = _Running(
            _ask_command(proxy.url, kb, QUESTION, "--json", "--max-tokens", str(MAX_TOKENS))
        )
        try:
            # the engine slowed, then stopped: the stream is running when the connection drops,
            # however far this reader trails it (tests/support/brake.py)
            with Brake(engine_cores(server.proc.pid)) as brake:
                before = run.events_until(5)
                with brake.hold():
                    assert direct.stream_status(before[0]["stream_id"]).status == "running"
                    assert proxy.drop() == 1
            code, rest, stderr = run.finish()
        finally:
            run.kill()
    assert code == 0, stderr
    events = before + [json.loads(line) for line in rest]
    assert [e["id"] for e in events] == list(range(len(events)))
    assert events[-1]["type"] == "done"
    assert "".join(e["text"] for e in events if e["type"] == "token") == reference.answer
    assert stderr.count("reconnecting") == 1, stderr


def test_ctrl_c_cancels_the_stream_on_the_server(server: ServerProcess, kb: str) -> None:
    question = "Write a long, detailed essay about lighthouses, their history and keepers."
    run = _Running(_ask_command(server.url, kb, question, "--json", "--max-tokens", "400"))
    with Client(server.url) as client:
        try:
            with Brake(engine_cores(server.proc.pid)) as brake:  # as above
                events = run.events_until(3)
                stream_id = events[0]["stream_id"]
                with brake.hold():
                    assert client.stream_status(stream_id).status == "running"
                    run.proc.send_signal(signal.SIGINT)
                    code, _, stderr = run.finish()
        finally:
            run.kill()
        assert code == 130, stderr
        assert "cancelled" in stderr
        status = client.stream_status(stream_id)
        assert (status.status, status.finish_reason) == ("done", "cancelled")
        assert status.last_event_id < 400
