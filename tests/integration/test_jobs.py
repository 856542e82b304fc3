"""Long-document jobs end to end: real SmolLM2 (float32, greedy), real Redis and PostgreSQL,
two server processes sharing both, with KV snapshots on: their engines save KV blocks to Redis
and load them from it. The last test kills the victim with -9 mid-section; the survivor
continues the section from its logged token ids on the blocks the dead one saved, loaded from
Redis rather than recomputed, and the document is the one an uninterrupted run writes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from rag_stream.kv.store import stats_key
from tests.conftest import REDIS_URL, SESSION_PREFIX
from tests.support.brake import Brake, engine_cores
from tests.support.jobs_pair import KB, JobsPair, kv_prefix
from tests.support.kv_engines import settle
from tests.support.kv_metrics import kv_counters, settled_kv_counters
from tests.support.proxy import TcpProxy
from tests.support.redis_keys import drop_keys
from tests.support.server import ROOT, ServerProcess
from tests.support.sse import Frame, read_stream

pytestmark = pytest.mark.engine

OUTLINE = ["The Skerry lighthouse", "The Zorblat river and its floods", "The town of Quimby"]
JOB = {
    "kb": KB,
    "title": "A short guide to the coast of Vell",
    "instructions": "Write plainly for visitors.",
    "outline": OUTLINE,
    "section_tokens": 32,
    "top_k": 2,
}
KV_PREFIX = kv_prefix(SESSION_PREFIX)
BLOCK = 128  # vLLM's KV block on the CPU backend, as in test_kv_restore.py
SECTION_TOKENS = 80  # the kill test's sections: room to kill past a generated KV block


@dataclass
class Servers:
    survivor: ServerProcess
    victim: ServerProcess


@pytest.fixture(scope="module")
def servers(jobs_servers_start: JobsPair) -> Iterator[Servers]:
    """Two SmolLM2 servers with KV snapshots on, sharing Redis (events and blocks) and one
    PostgreSQL database (tests/support/jobs_pair.py)."""
    try:
        jobs_servers_start.wait_ready()
        yield Servers(survivor=jobs_servers_start.survivor, victim=jobs_servers_start.victim)
    finally:
        jobs_servers_start.close()


def _start(server: ServerProcess, body: dict[str, Any] | None = None) -> dict[str, Any]:
    r = httpx.post(f"{server.url}/v1/jobs", json=body or JOB, timeout=60)
    assert r.status_code == 202, r.text
    return dict(r.json())


def _events(server: ServerProcess, job_id: str, after: int | None = None) -> list[Frame]:
    headers = {} if after is None else {"Last-Event-ID": str(after)}
    with httpx.Client(base_url=server.url, timeout=600) as client:
        return read_stream(client, "GET", f"/v1/jobs/{job_id}/events", headers=headers)


def _sections(frames: list[Frame]) -> dict[int, str]:
    texts: dict[int, str] = {}
    for f in frames:
        if f.event == "token":
            texts[f.data["section"]] = texts.get(f.data["section"], "") + f.data["text"]
    return texts


def _check_document_events(frames: list[Frame], outline: list[str]) -> None:
    """One stream, contiguous ids, the events in the documented order."""
    assert [f.id for f in frames] == list(range(len(frames)))
    kinds = [f.event for f in frames]
    assert kinds[:3] == ["stream", "job", "outline"], kinds[:5]
    assert frames[2].data["headings"] == outline
    assert kinds[-1] == "done" and frames[-1].data["finish_reason"] == "stop", frames[-1]
    section = -1
    seen_tokens = False
    for f in frames[3:-1]:
        if f.event == "section":
            assert f.data["index"] == section + 1
            assert f.data["heading"] == outline[f.data["index"]]
            section, seen_tokens = f.data["index"], False
        elif f.event == "citation":
            assert not seen_tokens  # a section's sources come before its tokens
        elif f.event == "token":
            assert f.data["section"] == section
            seen_tokens = True
        else:
            assert f.event == "section_done" and f.data["index"] == section, f
    assert section == len(outline) - 1
    done = [f.data for f in frames if f.event == "section_done"]
    assert [d["index"] for d in done] == list(range(len(outline)))
    tokens = sum(d["tokens"] for d in done)
    assert frames[-1].data["usage"]["completion_tokens"] == tokens > 0


def test_a_three_section_job_writes_a_cited_document(servers: Servers) -> None:
    server = servers.survivor
    job = _start(server)
    assert job["status"] in ("queued", "running") and job["stream_id"]
    frames = _events(server, job["id"])
    _check_document_events(frames, OUTLINE)
    citations = [f.data for f in frames if f.event == "citation"]
    assert citations, "each section cites its sources"
    # numbered across the document: a chunk keeps its number, a new one takes the next
    numbers: dict[str, int] = {}
    for c in citations:
        n = numbers.setdefault(c["chunk_id"], len(numbers) + 1)
        assert c["n"] == n, citations
    # the status and the stored document match what the events said
    status = httpx.get(f"{server.url}/v1/jobs/{job['id']}", timeout=30).json()
    assert status["status"] == "completed", status
    progress = status["progress"]
    assert progress["sections_done"] == progress["sections_total"] == 3
    assert progress["tokens"] == frames[-1].data["usage"]["completion_tokens"]
    assert progress["eta_s"] == 0 and progress["elapsed_s"] > 0
    result = httpx.get(
        f"{server.url}/v1/jobs/{job['id']}/result", params={"format": "json"}, timeout=30
    ).json()
    assert result["complete"] is True
    texts = _sections(frames)
    assert [s["heading"] for s in result["sections"]] == OUTLINE
    assert [s["text"] for s in result["sections"]] == [texts.get(i, "") for i in range(3)]
    assert any(texts.values())
    assert [s["n"] for s in result["sources"]] == sorted(numbers.values())
    for source in result["sources"]:  # each [n] resolves to the real chunk it quoted
        chunk = httpx.get(source["url"], timeout=30)
        assert chunk.status_code == 200, source
        cited = next(c for c in citations if c["n"] == source["n"])
        assert chunk.json()["text"] == cited["snippet"]
        assert chunk.json()["document"]["id"] == source["document_id"]
    md = httpx.get(f"{server.url}/v1/jobs/{job['id']}/result", timeout=30)
    assert md.headers["content-type"].startswith("text/markdown")
    lines = md.text.splitlines()
    assert lines[0] == f"# {JOB['title']}"
    assert [line[3:] for line in lines if line.startswith("## ")] == [*OUTLINE, "Sources"]
    for source in result["sources"]:
        assert f"- [{source['n']}] [" in md.text and f"({source['url']})" in md.text
    for text in texts.values():
        assert text.strip() in md.text


def test_bad_job_requests_get_clear_errors(servers: Servers) -> None:
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"kb": "no-such-kb"}, 404, "no-such-kb"),
        ({"outline": []}, 422, "outline"),
        ({"outline": ["Origins", "  "]}, 422, "heading 1 is empty"),
        ({"outline": None, "sections": 31}, 422, "sections"),
        ({"outline": None, "sections": 0}, 422, "sections"),
        ({"outline": ["x"] * 31}, 422, "jobs.max_sections"),
        ({"outline": None}, 422, "outline"),
        ({"outline": ["a", "b"], "sections": 3}, 422, "sections"),
        ({"section_tokens": 5000}, 422, "jobs.max_section_tokens"),
        ({"title": "t" * 301}, 422, "jobs.max_title_chars"),
        ({"title": "   "}, 422, "title"),
        ({"top_k": 50}, 422, "top_k"),
    ]
    for change, status, needle in cases:
        r = httpx.post(f"{servers.survivor.url}/v1/jobs", json={**JOB, **change}, timeout=60)
        assert r.status_code == status, (change, r.text)
        assert needle in r.json()["error"]["message"], (change, r.text)
    for path in ("", "/events", "/result"):
        r = httpx.get(f"{servers.survivor.url}/v1/jobs/nope{path}", timeout=30)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


def test_cancel_mid_job_ends_it_with_the_sections_written_so_far(servers: Servers) -> None:
    server = servers.survivor
    # Sections long enough (about 5 s each here) that the cancel lands inside the second one
    # even when this reader trails the stream by seconds on a busy machine (CI once saw the
    # section end first with 60 tokens, which is no cancel mid-section)
    job = _start(server, {**JOB, "section_tokens": 150})
    follower = _Follower(server, job["id"])
    follower.wait_until(_in_section(1, 3))  # running, in its second section
    r = httpx.post(f"{server.url}/v1/jobs/{job['id']}/cancel", timeout=60)
    assert r.status_code == 200 and r.json()["status"] == "cancelled", r.text
    frames = follower.join()
    assert [f.id for f in frames] == list(range(len(frames)))
    assert frames[-1].event == "done" and frames[-1].data["finish_reason"] == "cancelled"
    assert [f.data["index"] for f in frames if f.event == "section_done"] == [0]
    result = _result(server, job["id"])
    assert result["status"] == "cancelled" and result["complete"] is False
    assert [s["index"] for s in result["sections"]] == [0]
    assert result["sections"][0]["text"] == _sections(frames)[0]
    again = httpx.post(f"{server.url}/v1/jobs/{job['id']}/cancel", timeout=60).json()
    assert again["status"] == "cancelled"  # a no-op once it ended


def test_resuming_the_events_across_sections_repeats_and_misses_nothing(
    servers: Servers,
) -> None:
    server = servers.survivor
    job = _start(server)
    with httpx.Client(base_url=server.url, timeout=600) as client:
        first = read_stream(client, "GET", f"/v1/jobs/{job['id']}/events", stop_after=6)
    assert first[-1].event != "done"  # left while the job ran
    # come back at several points, each after the job moved on
    frames = list(first)
    while frames[-1].event != "done":
        with httpx.Client(base_url=server.url, timeout=600) as client:
            frames += read_stream(
                client,
                "GET",
                f"/v1/jobs/{job['id']}/events",
                headers={"Last-Event-ID": str(frames[-1].id)},
                stop_after=40,
            )
    _check_document_events(frames, OUTLINE)
    whole = _events(server, job["id"])
    assert [(f.id, f.event, f.data) for f in whole] == [(f.id, f.event, f.data) for f in frames]


def test_jobs_are_listed_newest_first_and_deleted_with_their_sections(
    servers: Servers,
) -> None:
    server = servers.survivor
    small = {**JOB, "outline": ["The Skerry lighthouse"], "section_tokens": 8}
    made = [_start(server, small)["id"] for _ in range(3)]
    for job_id in made:
        _events(server, job_id)
    page = httpx.get(f"{server.url}/v1/jobs", params={"limit": 2}, timeout=30).json()
    assert [j["id"] for j in page["data"]] == made[::-1][:2]
    rest = httpx.get(
        f"{server.url}/v1/jobs", params={"limit": 2, "before": page["next_before"]}, timeout=30
    ).json()
    assert rest["data"][0]["id"] == made[0]
    r = httpx.get(f"{server.url}/v1/jobs", params={"before": "nope"}, timeout=30)
    assert r.status_code == 422 and "before" in r.json()["error"]["message"]
    r = httpx.delete(f"{server.url}/v1/jobs/{made[1]}", timeout=60)
    assert r.status_code == 204
    assert httpx.get(f"{server.url}/v1/jobs/{made[1]}", timeout=30).status_code == 404
    assert httpx.get(f"{server.url}/v1/jobs/{made[1]}/result", timeout=30).status_code == 404
    listed = httpx.get(f"{server.url}/v1/jobs", params={"limit": 100}, timeout=30).json()
    assert made[1] not in {j["id"] for j in listed["data"]}
    assert {made[0], made[2]} <= {j["id"] for j in listed["data"]}


def test_a_job_followed_from_two_processes_is_produced_by_one(servers: Servers) -> None:
    """Both processes alive, a reader of the job in each: the one that does not own it
    never takes it over (the owner's presence is alive), so every section comes once."""
    owner, other = servers.victim, servers.survivor
    before = [_jobs_finished(s) for s in (owner, other)]
    job = _start(owner)
    here = _Follower(owner, job["id"])
    there = _events(other, job["id"])
    _check_document_events(there, OUTLINE)
    assert [(f.id, f.data) for f in here.join()] == [(f.id, f.data) for f in there]
    # the process that finishes a job's stream counts it; a takeover would have moved that
    assert [_jobs_finished(s) for s in (owner, other)] == [before[0] + 1, before[1]]


def _jobs_finished(server: ServerProcess) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    families = text_string_to_metric_families(text)
    return sum(
        sample.value
        for family in families
        if family.name == "rag_stream_streams_finished"
        for sample in family.samples
        if sample.name.endswith("_total") and sample.labels.get("kind") == "job"
    )


def test_the_cli_follows_a_job_through_a_dropped_connection_and_saves_it(
    servers: Servers, tmp_path: Path
) -> None:
    server = servers.survivor
    outline = tmp_path / "outline.txt"
    outline.write_text("# The Skerry lighthouse\n\n- The Zorblat river and its floods\n")
    cli = [sys.executable, "-m", "rag_stream", "job"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with TcpProxy(server.port) as proxy:
        create = [*cli, "--url", proxy.url, "create", "--kb", KB, "--title", "Vell"]
        create += ["--outline-file", str(outline), "--section-tokens", "60", "--follow"]
        proc = subprocess.Popen(
            create, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None
        job_id = proc.stdout.readline().split()[1]  # "job ID (queued)"
        sid = httpx.get(f"{server.url}/v1/jobs/{job_id}", timeout=30).json()["stream_id"]
        deadline = time.monotonic() + 300
        while (
            httpx.get(f"{server.url}/v1/streams/{sid}", timeout=30).json()["last_event_id"] < 10
        ):  # tokens are flowing to the CLI
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert proxy.drop() >= 1
        out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    assert "resuming after event" in out + err
    # create and follow on one kept-alive connection, which the proxy cut; then a new one
    assert proxy.accepted >= 2
    assert f"job {job_id}: stop" in out
    status = subprocess.run(
        [*cli, "--url", server.url, "status", job_id], capture_output=True, text=True, check=True
    )
    assert f"{job_id}  completed  2/2 sections" in status.stdout
    saved = tmp_path / "doc.md"
    subprocess.run(
        [*cli, "--url", server.url, "result", job_id, "-o", str(saved)], check=True, timeout=60
    )
    expected = httpx.get(f"{server.url}/v1/jobs/{job_id}/result", timeout=30).text
    assert saved.read_text() == expected
    assert expected.startswith("# Vell\n") and "## The Zorblat river and its floods" in expected
    missing = subprocess.run([*cli, "--url", server.url, "status", "nope"], capture_output=True)
    assert missing.returncode == 1 and b"404 not_found" in missing.stderr


def test_a_planned_outline_is_exact_or_the_job_fails_saying_so(servers: Servers) -> None:
    server = servers.survivor
    body = {**JOB, "outline": None, "sections": 3, "section_tokens": 16}
    job = _start(server, body)
    frames = _events(server, job["id"])
    status = httpx.get(f"{server.url}/v1/jobs/{job['id']}", timeout=30).json()
    outline = [f.data for f in frames if f.event == "outline"]
    if outline:  # the model's reply parsed into exactly three headings
        assert outline[0]["planned"] is True
        headings = outline[0]["headings"]
        assert len(headings) == 3 and all(h.strip() for h in headings)
        _check_document_events(frames, headings)
        assert status["status"] == "completed" and status["outline"] == headings
    else:  # twice not: a clear error, and no section written
        assert frames[-1].event == "error" and frames[-1].data["code"] == "outline_failed"
        assert "exactly 3 headings" in frames[-1].data["message"]
        assert not any(f.event == "section" for f in frames)
        assert status["status"] == "failed" and status["error"]["code"] == "outline_failed"


class _Follower:
    """Follows a job's events in a thread until the stream ends or its server dies."""

    def __init__(self, server: ServerProcess, job_id: str) -> None:
        self.frames: list[Frame] = []
        self._thread = threading.Thread(target=self._read, args=(server, job_id), daemon=True)
        self._thread.start()

    def _read(self, server: ServerProcess, job_id: str) -> None:
        try:
            with httpx.Client(base_url=server.url, timeout=600) as client:
                read_stream(client, "GET", f"/v1/jobs/{job_id}/events", on_frame=self.frames.append)
        except httpx.HTTPError:
            pass

    def wait_until(self, ok: Any, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        while not ok(list(self.frames)):
            assert time.monotonic() < deadline, [f.event for f in self.frames]
            time.sleep(0.01)

    def join(self) -> list[Frame]:
        self._thread.join(60)
        return list(self.frames)


def _in_section(index: int, tokens: int) -> Any:
    def ok(frames: list[Frame]) -> bool:
        n = sum(1 for f in frames if f.event == "token" and f.data["section"] == index)
        return n >= tokens

    return ok


def _result(server: ServerProcess, job_id: str) -> dict[str, Any]:
    r = httpx.get(f"{server.url}/v1/jobs/{job_id}/result", params={"format": "json"}, timeout=30)
    return dict(r.raise_for_status().json())


def _blocks_saved() -> int:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        return int(client.hget(stats_key(KV_PREFIX), "blocks_saved") or 0)
    finally:
        client.close()


def _forget_blocks() -> None:
    drop_keys(REDIS_URL, KV_PREFIX)


def _section_ids(frames: list[Frame], index: int) -> int:
    return sum(
        len(f.data["token_ids"])
        for f in frames
        if f.event == "token" and f.data["section"] == index
    )


def _blocks_saved_by(done: dict[str, Any]) -> int:
    """The KV blocks a section's engine request saved, from its ``section_done``: every full
    block it computed (KV exists for all but its last token), less those it loaded."""
    computed = (done["prompt_tokens"] + done["tokens"] - 1) // BLOCK
    return int(computed - done["cached_tokens"] // BLOCK)


def _section_done_seen(frames: list[Frame], index: int) -> bool:
    return any(f.event == "section_done" and f.data["index"] == index for f in frames)


def _section_done(frames: list[Frame], index: int) -> dict[str, Any]:
    return next(f.data for f in frames if f.event == "section_done" and f.data["index"] == index)


def test_kill_9_mid_section_then_another_server_finishes_the_same_document_on_its_kv(
    servers: Servers,
) -> None:
    survivor, victim = servers.survivor, servers.victim
    # dense retrieval: the two processes' vector stores were built apart (ingest, reindex),
    # and hybrid fusion's tied scores can rank differently there (not the takeover's doing)
    body = {**JOB, "mode": "dense", "section_tokens": SECTION_TOKENS}
    # The block counts below assume the reference computed every block it did not load from
    # its own earlier sections, as the victim will. Blocks left by earlier tests go first:
    # their prompts begin as these do, so the reference loaded its sections' first blocks
    # where the victim computes and saves them, the count below was reached one block early,
    # and a kill before the generated block's save left the survivor only the prompt's (CI).
    settled_kv_counters(survivor)
    _forget_blocks()
    reference = _start(survivor, body)
    expected = _events(survivor, reference["id"])
    ref_done = _section_done(expected, 1)
    prompt = ref_done["prompt_tokens"]
    # Kill once section 1's generated tokens have filled a KV block past its prompt and the
    # victim's engine has saved it: the takeover then has generated KV to load, not only the
    # prompt's. That block is complete (and queued for saving) once its last token was fed
    # in, i.e. when the token after it comes out.
    kill_after = (prompt // BLOCK + 1) * BLOCK - prompt + 1
    # with 80 tokens a section, section 1's prompt is about 345 tokens (it repeats section
    # 0's end): killed after about 40 of 80
    assert kill_after + 24 <= SECTION_TOKENS, (
        f"section 1's prompt ({prompt} tokens) leaves no room to kill past its next KV block: "
        "change SECTION_TOKENS"
    )
    # the blocks the victim saves up to then: every block of section 0, then section 1's up
    # to that one, less those it loads instead (the ones its prompt shares with section 0's,
    # as in the reference run)
    saves = _blocks_saved_by(_section_done(expected, 0))
    saves += prompt // BLOCK + 1 - ref_done["cached_tokens"] // BLOCK
    # The victim's job must compute its prompts as the reference did, not load the reference's
    # blocks from Redis (a shared prefix cache: the path the servers keep the engine's prefix
    # cache off for), so the reference's blocks go; from here on Redis holds only the job's
    # own. Every save of the reference lands first: the engine saves in the background, and
    # one landing later would be counted as the victim's.
    ref_saves = sum(_blocks_saved_by(f.data) for f in expected if f.event == "section_done")
    assert settle(lambda: _blocks_saved() >= ref_saves, 30), (_blocks_saved(), ref_saves)
    _forget_blocks()
    job = _start(victim, body)
    # The kill must land mid-section 1, after the engine has saved the block named above. The
    # engine saves in the background while the job decodes on, so waiting for that save can
    # outlast the section (a CI run killed the victim in section 2). So: from halfway there the
    # engine core is slowed (tests/support/brake.py), so that a reader trailing the job cannot
    # see the kill point late; then the API process is frozen (SIGSTOP): the job's log ends
    # where it is, mid-section, while the engine core runs on at full speed and saves its
    # blocks; then both are killed, as one crash at that point.
    follower = _Follower(victim, job["id"])
    follower.wait_until(lambda frames: _section_ids(frames, 1) >= kill_after // 2)
    with Brake(engine_cores(victim.proc.pid), running_s=0.05, stopped_s=0.1):
        follower.wait_until(lambda frames: _section_ids(frames, 1) >= kill_after)
        os.kill(victim.proc.pid, signal.SIGSTOP)
    assert settle(lambda: _blocks_saved() >= saves, 30), (_blocks_saved(), saves)
    loaded_before = kv_counters(survivor).get("blocks_loaded", 0)
    victim.kill()  # SIGKILL to the server and its engine core
    first = follower.join()
    # the kill landed mid-section: section 1 had begun and not ended, its tokens well short
    # of the section's budget (the engine request for its rest, below, is a second proof)
    assert first[-1].event == "token" and first[-1].data["section"] == 1, first[-1]
    assert not _section_done_seen(first, 1)
    assert _section_ids(first, 1) < SECTION_TOKENS - 8, _section_ids(first, 1)
    meta = httpx.get(f"{survivor.url}/v1/streams/{job['stream_id']}", timeout=30).json()
    assert meta["status"] == "running", meta
    rest = _events(survivor, job["id"], after=first[-1].id)
    frames = first + rest
    _check_document_events(frames, OUTLINE)  # contiguous ids: nothing repeated or missing
    assert _sections(frames) == _sections(expected)
    got, want = _result(survivor, job["id"]), _result(survivor, reference["id"])
    assert got["sections"] == want["sections"]
    assert [s["chunk_id"] for s in got["sources"]] == [s["chunk_id"] for s in want["sources"]]
    # The survivor's engine request for the rest of section 1 (its prompt plus the logged
    # tokens) found blocks in Redis past the prompt: KV the victim computed for the tokens it
    # generated. With the prefix cache off, every cached token is one the connector loaded;
    # a survivor with KV snapshots off reports 0 here, and the uninterrupted run reported only
    # the blocks section 1's prompt shares with section 0's (none with this outline).
    done = _section_done(rest, 1)
    assert done["prompt_tokens"] == prompt
    assert done["cached_tokens"] > prompt // BLOCK * BLOCK, (done, ref_done)
    assert done["cached_tokens"] > ref_done["cached_tokens"], (done, ref_done)
    loaded = kv_counters(survivor).get("blocks_loaded", 0) - loaded_before
    assert loaded >= done["cached_tokens"] // BLOCK
    status = httpx.get(f"{survivor.url}/v1/jobs/{job['id']}", timeout=30).json()
    assert status["status"] == "completed", status
