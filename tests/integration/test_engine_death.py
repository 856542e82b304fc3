"""An in-process engine whose core dies mid-stream: the process leaves its streams to a peer
(no error event) and stops itself with exit status 1, so a supervisor restarts it. Found by the
chaos campaign (scripts/chaos.py): every stream of the process used to end with
``engine_unavailable`` while a peer could have finished it.

The victim drafts tokens (prompt-lookup speculative decoding, the product's default) and the peer
does not: the text is the same all the same. It is test_drafts.py's SmolLM2 server, which that
module, run before this one, has checked (``drafting_smollm2_start``)."""

from __future__ import annotations

import os
import signal

import httpx
import pytest

from tests.support.server import ServerProcess, child_pid
from tests.support.sse import read_stream, text_of

pytestmark = pytest.mark.engine

BODY = {
    "prompt": "Describe the morning routine of a canal lock keeper, step by step.",
    "chat": True,
    "max_tokens": 90,
}


def test_a_stream_whose_engine_core_dies_is_finished_by_a_peer(
    smollm2_server: ServerProcess, drafting_smollm2_start: ServerProcess
) -> None:
    survivor = smollm2_server  # SmolLM2 on the same Redis, without drafts
    victim = drafting_smollm2_start  # started a few modules ahead (session_servers.py)
    victim.wait_ready()
    r = httpx.post(survivor.url + "/v1/generate", json={**BODY, "stream": False}, timeout=300)
    expected = r.raise_for_status().json()
    with httpx.Client(base_url=victim.url, timeout=120) as client:
        first = read_stream(client, "POST", "/v1/generate", json=BODY, stop_after=8)
    sid = first[0].data["stream_id"]
    assert first[-1].event == "token"
    status = httpx.get(f"{victim.url}/v1/streams/{sid}", timeout=30).json()
    assert status["status"] == "running", status  # still generating when its engine dies

    os.kill(child_pid(victim.proc.pid, "EngineCore"), signal.SIGKILL)

    assert victim.proc.wait(timeout=90) == 1, victim.log_tail()  # it stopped itself
    assert "the engine core died" in victim.log_path.read_text()
    with httpx.Client(base_url=survivor.url, timeout=300) as client:
        rest = read_stream(
            client, "GET", f"/v1/streams/{sid}/events", headers={"Last-Event-ID": str(first[-1].id)}
        )
    frames = first + rest
    assert [f.id for f in frames] == list(range(len(frames)))
    assert frames[-1].event == "done", frames[-1]  # not an error: continued elsewhere
    assert text_of(frames) == expected["text"]
