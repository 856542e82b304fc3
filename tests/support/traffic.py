"""Mixed traffic against running servers, and a ledger of what it asked for.

Used by the soak (scripts/soak.py) and its short version in CI
(tests/integration/test_soak_short.py). Each simulated user picks one action at a time:
streams of every kind (generate, answers, chat completions, streamed or not), a resume with
``Last-Event-ID`` (on another server when there are several), a cancel, a client that leaves
mid-stream, a small job now and then, uploads and deletes of documents.

Every stream a client reads is checked as it goes (ids from the cursor on without a gap or a
repeat, one terminal event at the end, as many tokens as ``usage`` says), and every resumed
stream is compared with a full replay of its log: a difference is a ``problem``. The ledger
then says what SQL should hold: one ``streams`` row per stream, a conversation and two
messages per answer, the jobs and documents not deleted.

Knowledge-base traffic (answers, ``kb:`` chat, jobs, uploads) goes to the first server: the
embedded vector store belongs to one process. Generation, resumes and cancels go anywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import traceback
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.support.sse_async import TimedFrame, timed_frames

WORDS = [
    *("stream", "resume", "token", "cache", "engine", "redis", "lease", "reader", "writer"),
    *("answer", "citation", "chunk", "document", "search", "vector", "prompt", "prefix"),
    *("decode", "window", "budget", "replica", "sweeper", "takeover", "checkpoint", "event"),
    *("cursor", "retention", "keepalive", "quota", "tenant", "job", "section", "outline"),
]

QUESTIONS = [
    "How do I resume a stream?",
    "What happens when the producer dies?",
    "How long are finished streams kept?",
    "What does a reader do while it waits?",
    "How are documents split into chunks?",
]

# relative frequencies of the actions (the soak's defaults)
WEIGHTS: dict[str, float] = {
    "generate": 5,
    "generate_json": 2,
    "answer": 3,
    "chat": 2,
    "chat_json": 1,
    "chat_kb": 1,
    "resume": 3,
    "cancel": 2,
    "disconnect": 2,
    "job": 0.3,
    "upload": 1,
    "delete_document": 0.7,
}


def paragraph(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)) + "."


@dataclass
class Ledger:
    """What the traffic did and asked for; ``problems`` are protocol violations seen."""

    actions: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    http_status: Counter[int] = field(default_factory=Counter)
    streams: dict[str, str] = field(default_factory=dict)  # stream id -> kind
    new_conversations: int = 0
    answers: int = 0  # answer streams (each saves a question and an answer)
    unanswered: int = 0  # answer streams that ended before their sources (no conversation)
    jobs: dict[str, int] = field(default_factory=dict)  # live job id -> sections written
    deleted_jobs: int = 0
    documents: dict[str, int] = field(default_factory=dict)  # live document id -> chunks
    deleted_documents: list[str] = field(default_factory=list)
    abandoned: dict[str, str] = field(default_factory=dict)  # left mid-stream -> server
    finish_reasons: Counter[str] = field(default_factory=Counter)
    events: int = 0  # events read by clients
    gaps_ms: list[float] = field(default_factory=list)  # between a stream's token events

    def problem(self, text: str) -> None:
        if len(self.problems) < 200:
            self.problems.append(text)

    def expected_rows(self, before: dict[str, int]) -> dict[str, int]:
        """The SQL row counts the traffic asked for, from the counts before it."""
        expected = dict(before)
        expected["streams"] = before["streams"] + len(self.streams)
        expected["conversations"] = before["conversations"] + self.new_conversations
        expected["messages"] = before["messages"] + 2 * self.answers
        expected["jobs"] = before["jobs"] + len(self.jobs)
        expected["job_sections"] = before["job_sections"] + sum(self.jobs.values())
        expected["documents"] = before["documents"] + len(self.documents)
        expected["chunks"] = before["chunks"] + sum(self.documents.values())
        return expected

    def summary(self) -> dict[str, Any]:
        return {
            "actions": dict(self.actions),
            "failed": dict(self.failed),
            "http_status": {str(k): v for k, v in sorted(self.http_status.items())},
            "streams": len(self.streams),
            "streams_by_kind": dict(Counter(self.streams.values())),
            "finish_reasons": dict(self.finish_reasons),
            # answers ended before their sources: a client that stalled past abandon_after_s
            # while its answer searched (never a cancel of the traffic's own)
            "answers_unanswered": self.unanswered,
            "events_read": self.events,
            "jobs_kept": len(self.jobs),
            "jobs_deleted": self.deleted_jobs,
            "documents_kept": len(self.documents),
            "documents_deleted": len(self.deleted_documents),
            "problems": len(self.problems),
        }


class Unexpected(Exception):
    """A response the protocol does not allow (recorded as a problem)."""


@dataclass
class TrafficConfig:
    short_tokens: tuple[int, int] = (20, 160)  # max_tokens of an ordinary stream
    long_tokens: int = 3000  # streams that get cancelled or left (long enough to be running)
    answer_tokens: int = 48
    job_section_tokens: int = 24
    live_documents: int = 8  # documents kept before deletes catch up
    action_timeout_s: float = 180.0


class Traffic:
    def __init__(
        self,
        servers: list[str],
        kb: str,
        model: str,
        seed: int = 0,
        config: TrafficConfig | None = None,
    ) -> None:
        self.servers = servers
        self.kb_server = servers[0]
        self.kb = kb
        self.model = model
        self.rng = random.Random(seed)
        self.cfg = config or TrafficConfig()
        self.ledger = Ledger()
        self._client: httpx.AsyncClient | None = None
        self._uploads = 0
        self._actions: dict[str, Callable[[], Awaitable[None]]] = {
            "generate": self.generate,
            "generate_json": self.generate_json,
            "answer": self.answer,
            "chat": self.chat,
            "chat_json": self.chat_json,
            "chat_kb": self.chat_kb,
            "resume": self.resume,
            "cancel": self.cancel,
            "disconnect": self.disconnect,
            "job": self.job,
            "upload": self.upload,
            "delete_document": self.delete_document,
        }

    # -- running ---------------------------------------------------------------------------

    @property
    def client(self) -> httpx.AsyncClient:
        assert self._client is not None, "use `async with traffic:`"
        return self._client

    async def __aenter__(self) -> Traffic:
        limits = httpx.Limits(max_connections=500, max_keepalive_connections=50)
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(60, read=120), limits=limits)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.aclose()

    async def run(
        self, duration_s: float, users: int, weights: dict[str, float] | None = None
    ) -> None:
        """``users`` concurrent users doing actions until ``duration_s`` has passed."""
        weights = weights or WEIGHTS
        names = [n for n in weights if weights[n] > 0]
        deadline = time.monotonic() + duration_s

        async def user() -> None:
            while time.monotonic() < deadline:
                name = self.rng.choices(names, [weights[n] for n in names])[0]
                await self.act(name)

        await asyncio.gather(*(user() for _ in range(users)))

    async def act(self, name: str) -> None:
        self.ledger.actions[name] += 1
        try:
            async with asyncio.timeout(self.cfg.action_timeout_s):
                await self._actions[name]()
        except Exception as exc:
            self.ledger.failed[name] += 1
            where = traceback.format_exception(exc)[-2].strip().splitlines()[0]
            self.ledger.problem(f"{name}: {type(exc).__name__}: {exc} ({where})")

    def _server(self) -> str:
        return self.rng.choice(self.servers)

    def _other(self, server: str) -> str:
        others = [s for s in self.servers if s != server]
        return self.rng.choice(others) if others else server

    def _status(self, response: httpx.Response, *ok: int) -> None:
        self.ledger.http_status[response.status_code] += 1
        if response.status_code not in ok:
            raise Unexpected(f"{response.request.url.path}: HTTP {response.status_code}")

    # -- reading a stream --------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _events(
        self, method: str, url: str, **kwargs: Any
    ) -> AsyncIterator[tuple[httpx.Response, AsyncIterator[TimedFrame]]]:
        """An event-stream response and its frames (read in as many pieces as wanted)."""
        async with self.client.stream(method, url, **kwargs) as r:
            self._status(r, 200)
            async with contextlib.aclosing(timed_frames(r)) as frames:
                yield r, frames

    async def _read(
        self, frames: AsyncIterator[TimedFrame], after: int = -1, stop_after: int | None = None
    ) -> list[TimedFrame]:
        """rag-stream events from cursor ``after`` to the terminal one (or ``stop_after`` of
        them); checks that ids follow each other."""
        out: list[TimedFrame] = []
        expect = after + 1
        last_token_at: float | None = None
        async for frame in frames:
            if frame.id != expect:
                raise Unexpected(f"event id {frame.id} where {expect} was due ({frame.event})")
            expect += 1
            out.append(frame)
            if frame.event == "token":
                if last_token_at is not None:
                    self.ledger.gaps_ms.append((frame.at - last_token_at) * 1000)
                last_token_at = frame.at
            if frame.event in ("done", "error"):
                break
            if stop_after is not None and len(out) >= stop_after:
                break
        self.ledger.events += len(out)
        if stop_after is None and (not out or out[-1].event not in ("done", "error")):
            raise Unexpected("the stream ended without a terminal event")
        return out

    def _check_done(self, frames: list[TimedFrame], whole: bool = True) -> dict[str, Any]:
        end = frames[-1]
        if end.event != "done":
            raise Unexpected(f"stream ended with {end.event}: {end.data}")
        self.ledger.finish_reasons[end.data["finish_reason"]] += 1
        if whole:
            tokens = sum(len(f.data["token_ids"]) for f in frames if f.event == "token")
            if tokens != end.data["usage"]["completion_tokens"]:
                raise Unexpected(
                    f"{tokens} tokens read, usage says {end.data['usage']['completion_tokens']}"
                )
        return dict(end.data)

    async def _replay(self, server: str, sid: str) -> list[TimedFrame]:
        async with self._events("GET", f"{server}/v1/streams/{sid}/events") as (_, frames):
            return await self._read(frames)

    # -- the actions ---------------------------------------------------------------------------

    async def generate(self) -> None:
        body = {"prompt": paragraph(self.rng, 8), "max_tokens": self._short()}
        async with self._events("POST", f"{self._server()}/v1/generate", json=body) as (_, it):
            frames = await self._read(it)
        self.ledger.streams[frames[0].data["stream_id"]] = "generate"
        self._check_done(frames)

    async def generate_json(self) -> None:
        body = {"prompt": paragraph(self.rng, 8), "max_tokens": self._short(), "stream": False}
        r = await self.client.post(f"{self._server()}/v1/generate", json=body)
        self._status(r, 200)
        out = r.json()
        self.ledger.streams[out["stream_id"]] = "generate"
        self.ledger.finish_reasons[out["finish_reason"]] += 1
        if len(out["token_ids"]) != out["usage"]["completion_tokens"]:
            raise Unexpected("token_ids and usage disagree")

    async def answer(self) -> None:
        body = {
            "kb": self.kb,
            "question": self.rng.choice(QUESTIONS),
            "max_tokens": self.cfg.answer_tokens,
            "top_k": 2,
        }
        async with self._events("POST", f"{self.kb_server}/v1/answers", json=body) as (_, it):
            frames = await self._read(it)
        sid = frames[0].data["stream_id"]
        self.ledger.streams[sid] = "answer"
        kinds = [f.event for f in frames]
        self._conversation_saved(
            frames[-1].data.get("finish_reason") == "cancelled" and "citation" not in kinds
        )
        if (
            "token" in kinds
            and "citation" in kinds
            and kinds.index("token") < max(i for i, k in enumerate(kinds) if k == "citation")
        ):
            raise Unexpected("a citation came after the first token")
        self._check_done(frames)

    async def _chat(self, model: str, stream: bool) -> None:
        server = self.kb_server if model.startswith("kb:") else self._server()
        body = {
            "model": model,
            "messages": [{"role": "user", "content": self.rng.choice(QUESTIONS)}],
            "max_tokens": self.cfg.answer_tokens,
            "temperature": 0,
            "stream": stream,
        }
        kind = "answer" if model.startswith("kb:") else "generate"
        unanswered = False
        if stream:
            async with self.client.stream("POST", f"{server}/v1/chat/completions", json=body) as r:
                self._status(r, 200)
                sid = r.headers["x-stream-id"]
                chunks = [f async for f in timed_frames(r)]
            if not chunks or chunks[-1].data != "[DONE]":
                raise Unexpected("a chat stream that did not end with [DONE]")
            self.ledger.events += len(chunks)
            reasons = [
                c.data["choices"][0]["finish_reason"]
                for c in chunks[:-1]
                if c.data.get("choices") and c.data["choices"][0].get("finish_reason")
            ]
            if len(reasons) != 1:
                raise Unexpected(f"{len(reasons)} finish reasons in a chat stream")
            self.ledger.finish_reasons[reasons[0]] += 1
            cancelled = any(
                c.data["choices"][0].get("stop_reason") == "cancelled"
                for c in chunks[:-1]
                if c.data.get("choices")
            )
            sourced = any("search_results" in c.data for c in chunks[:-1])
            unanswered = cancelled and not sourced
        else:
            r = await self.client.post(f"{server}/v1/chat/completions", json=body)
            self._status(r, 200)
            sid = r.headers["x-stream-id"]
            self.ledger.finish_reasons[r.json()["choices"][0]["finish_reason"]] += 1
        self.ledger.streams[sid] = kind
        if kind == "answer":
            self._conversation_saved(unanswered)

    def _conversation_saved(self, unanswered: bool) -> None:
        """An answer saves its question and answer in a new conversation, unless it ended
        before its sources (cancelled, or left by every reader, while searching): then only
        its stream is recorded."""
        if unanswered:
            self.ledger.unanswered += 1
        else:
            self.ledger.answers += 1
            self.ledger.new_conversations += 1

    async def chat(self) -> None:
        await self._chat(self.model, stream=True)

    async def chat_json(self) -> None:
        await self._chat(self.model, stream=False)

    async def chat_kb(self) -> None:
        await self._chat(f"kb:{self.kb}", stream=self.rng.random() < 0.7)

    async def resume(self) -> None:
        """Read part of a stream, leave, resume from the last id seen (elsewhere if possible),
        then check the pieces against a full replay of the log."""
        server = self._server()
        body = {"prompt": paragraph(self.rng, 8), "max_tokens": self.rng.randint(120, 400)}
        async with self._events("POST", f"{server}/v1/generate", json=body) as (_, it):
            head = await self._read(it, stop_after=self.rng.randint(2, 60))
        sid = head[0].data["stream_id"]
        self.ledger.streams[sid] = "generate"
        if head[-1].event in ("done", "error"):
            self._check_done(head)
            return
        elsewhere = self._other(server)
        cursor = head[-1].id
        url = f"{elsewhere}/v1/streams/{sid}/events"
        async with self._events("GET", url, headers={"Last-Event-ID": str(cursor)}) as (_, it):
            tail = await self._read(it, after=cursor)
        self._check_done([*head, *tail])
        whole = await self._replay(self._server(), sid)
        if [(f.id, f.event, f.data) for f in whole] != [
            (f.id, f.event, f.data) for f in [*head, *tail]
        ]:
            raise Unexpected(f"stream {sid}: the resumed pieces differ from the log")

    async def cancel(self) -> None:
        server = self._server()
        body = {"prompt": paragraph(self.rng, 8), "max_tokens": self.cfg.long_tokens}
        async with self._events("POST", f"{server}/v1/generate", json=body) as (_, it):
            head = await self._read(it, stop_after=self.rng.randint(2, 30))
            sid = head[0].data["stream_id"]
            self.ledger.streams[sid] = "generate"
            c = await self.client.post(f"{self._other(server)}/v1/streams/{sid}/cancel")
            self._status(c, 200)
            if not c.json()["cancelled"]:
                raise Unexpected(f"cancel of a running stream said {c.json()}")
            tail = await self._read(it, after=head[-1].id)
        done = self._check_done([*head, *tail])
        if done["finish_reason"] != "cancelled":
            raise Unexpected(f"a cancelled stream finished with {done['finish_reason']}")

    async def disconnect(self) -> None:
        """Leave a long stream after a few events; it runs on, then ends (abandoned)."""
        server = self._server()
        body = {"prompt": paragraph(self.rng, 8), "max_tokens": self.cfg.long_tokens}
        async with self._events("POST", f"{server}/v1/generate", json=body) as (_, it):
            head = await self._read(it, stop_after=self.rng.randint(2, 30))
        sid = head[0].data["stream_id"]
        self.ledger.streams[sid] = "generate"
        self.ledger.abandoned[sid] = server

    async def job(self) -> None:
        body = {
            "kb": self.kb,
            "title": f"Notes {self.rng.randint(0, 10**6)}",
            "outline": ["Streams", "Readers"],
            "section_tokens": self.cfg.job_section_tokens,
            "top_k": 2,
        }
        r = await self.client.post(f"{self.kb_server}/v1/jobs", json=body)
        self._status(r, 202)
        job = r.json()
        url = f"{self.kb_server}/v1/jobs/{job['id']}/events"
        async with self._events("GET", url) as (_, it):
            frames = await self._read(it)
        self.ledger.streams[job["stream_id"]] = "job"
        self._check_done(frames, whole=False)
        status = (await self.client.get(f"{self.kb_server}/v1/jobs/{job['id']}")).json()
        if status["status"] != "completed":
            raise Unexpected(f"job ended {status['status']}")
        if self.rng.random() < 0.4:
            d = await self.client.delete(f"{self.kb_server}/v1/jobs/{job['id']}")
            self._status(d, 204)
            self.ledger.deleted_jobs += 1
            gone = await self.client.get(f"{self.kb_server}/v1/jobs/{job['id']}")
            self._status(gone, 404)
        else:
            self.ledger.jobs[job["id"]] = status["progress"]["sections_done"]

    async def upload(self) -> None:
        self._uploads += 1
        title = f"Note {self._uploads}-{self.rng.randint(0, 10**9)}"
        text = "\n\n".join(
            f"# {paragraph(self.rng, 3)}\n\n{paragraph(self.rng, self.rng.randint(40, 240))}"
            for _ in range(self.rng.randint(1, 3))
        )
        url = f"{self.kb_server}/v1/kbs/{self.kb}/documents"
        if self.rng.random() < 0.5:
            r = await self.client.post(url, json={"title": title, "text": text, "source": title})
        else:  # a file: parsed in a worker process
            files = {"file": (f"{title}.md", text.encode(), "text/markdown")}
            r = await self.client.post(url, files=files)
        self._status(r, 201)
        out = r.json()
        if out.get("replaced_document_id"):
            self.ledger.documents.pop(out["replaced_document_id"], None)
        self.ledger.documents[out["id"]] = out["chunk_count"]
        if len(self.ledger.documents) > self.cfg.live_documents:
            await self.delete_document()

    async def delete_document(self) -> None:
        if not self.ledger.documents:
            return
        doc = self.rng.choice(sorted(self.ledger.documents))
        chunks = self.ledger.documents.pop(doc)
        url = f"{self.kb_server}/v1/kbs/{self.kb}/documents/{doc}"
        try:
            r = await self.client.delete(url)
            self._status(r, 204)
        except BaseException:
            self.ledger.documents[doc] = chunks  # not known to be gone
            raise
        self.ledger.deleted_documents.append(doc)

    def _short(self) -> int:
        return self.rng.randint(*self.cfg.short_tokens)

    # -- after the traffic ---------------------------------------------------------------------

    async def check_abandoned(self, timeout_s: float) -> None:
        """Every stream a client left must end by itself (abandoned, or run to its length)."""
        pending = dict(self.ledger.abandoned)
        deadline = time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline:
            for sid, server in list(pending.items()):
                r = await self.client.get(f"{server}/v1/streams/{sid}")
                if r.status_code == 404:
                    pending.pop(sid)  # ended and already expired
                elif r.json()["status"] != "running":
                    self.ledger.finish_reasons[f"left:{r.json()['finish_reason']}"] += 1
                    pending.pop(sid)
            if pending:
                await asyncio.sleep(1)
        for sid in pending:
            self.ledger.problem(f"stream {sid}, left by its client, still runs")

    async def check_deleted(self) -> None:
        """Deleted documents answer 404."""
        for doc in self.ledger.deleted_documents:
            r = await self.client.get(f"{self.kb_server}/v1/kbs/{self.kb}/documents/{doc}")
            if r.status_code != 404:
                self.ledger.problem(f"deleted document {doc}: HTTP {r.status_code}")


async def seed_kb(server: str, kb: str, documents: int = 4, seed: int = 0) -> dict[str, int]:
    """A knowledge base with a few documents; their ids and chunk counts."""
    rng = random.Random(seed)
    out: dict[str, int] = {}
    async with httpx.AsyncClient(base_url=server, timeout=300) as client:
        (await client.post("/v1/kbs", json={"name": kb})).raise_for_status()
        for i in range(documents):
            text = f"# Seed {i}\n\n" + paragraph(rng, 200)
            r = await client.post(
                f"/v1/kbs/{kb}/documents", json={"title": f"Seed {i}", "text": text}
            )
            r.raise_for_status()
            out[r.json()["id"]] = r.json()["chunk_count"]
    return out


async def engine_model(server: str) -> str:
    async with httpx.AsyncClient(timeout=30) as client:
        models = (await client.get(f"{server}/v1/models")).json()["data"]
    return str(next(m["id"] for m in models if m["kb"] is None))


async def wait_until(
    check: Callable[[], Awaitable[bool]], timeout_s: float, every_s: float = 1.0
) -> float | None:
    """Seconds until ``check()`` held (None: not within ``timeout_s``)."""
    started = time.monotonic()
    while True:
        with contextlib.suppress(Exception):
            if await check():
                return time.monotonic() - started
        if time.monotonic() - started > timeout_s:
            return None
        await asyncio.sleep(every_s)
