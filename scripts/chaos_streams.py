"""Streams of every kind for ``scripts/chaos.py``: how to start one, follow it like a client
that reconnects to any live server with ``Last-Event-ID``, and judge what it received.

A verdict is one of:
- ``identical``: the stream ended with ``done`` and its text equals the uninterrupted run's;
- ``error``: the stream ended with an ``error`` event (a clear error, with its code);
- ``wrong``: anything else — a different text, a duplicated or missing event, ids out of
  order, what the client assembled differing from a full replay of the log, a replay with a
  hole, or no end at all. The campaign's target for this one is zero.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from httpx_sse import connect_sse

Servers = Callable[[], list[str]]  # base URLs of the servers alive right now
START_ATTEMPTS = 5  # a start whose answer was lost goes again (its key finds what it began)


@dataclass
class Spec:
    kind: str  # generate | answers | chat | job
    body: dict[str, Any]


@dataclass
class Frame:
    id: int | None
    event: str
    data: str


@dataclass
class Followed:
    """What one client saw of one stream, across reconnections."""

    spec: Spec
    started_on: str
    frames: list[Frame] = field(default_factory=list)
    stream_id: str = ""
    job_id: str = ""
    reconnects: int = 0
    reader_errors: list[str] = field(default_factory=list)
    ended: bool = False
    ended_at: float = 0.0
    failure: str = ""  # why following gave up (no server answered, a 4xx...)
    pause_s: float = 0.0  # a slow reader's pause after each event
    # sent with every attempt of the start: one whose answer was lost finds its stream
    start_key: str = field(default_factory=lambda: uuid.uuid4().hex)
    start_attempts: int = 0

    @property
    def last_id(self) -> int | None:
        ids = [f.id for f in self.frames if f.id is not None]
        return ids[-1] if ids else None


def start_and_follow(
    spec: Spec, url: str, servers: Servers, out: Followed | None = None, deadline_s: float = 900
) -> Followed:
    """Start the stream on ``url`` (unless ``out`` already names one) and read it to its end,
    reconnecting elsewhere on a drop."""
    out = out or Followed(spec, url)
    deadline = time.monotonic() + deadline_s
    target = url
    while not out.stream_id and not out.job_id and out.start_attempts < START_ATTEMPTS:
        out.start_attempts += 1
        try:
            _start(out, target)
        except httpx.TransportError as exc:  # the answer was lost: again, with the same key
            out.reader_errors.append(f"start: {exc!r}")
            time.sleep(0.5)
            live = servers()
            target = live[out.start_attempts % len(live)] if live else url
        except httpx.HTTPError as exc:  # answered with an error status: not started
            out.reader_errors.append(f"start: {exc!r}")
            break
    while not out.ended and time.monotonic() < deadline:
        if not out.stream_id and not out.job_id:
            out.failure = "the start request failed before naming its stream"
            return out
        live = servers()
        if not live:
            time.sleep(0.5)
            continue
        target = live[out.reconnects % len(live)]
        out.reconnects += 1
        try:
            _resume(out, target)
        except httpx.HTTPStatusError as exc:
            out.reader_errors.append(f"resume {exc.response.status_code}: {exc.response.text}")
            time.sleep(0.5)
        except httpx.HTTPError as exc:
            out.reader_errors.append(f"resume: {exc!r}")
            time.sleep(0.3)
    if not out.ended:
        out.failure = out.failure or f"no end after {deadline_s} s"
    return out


def follow_in_thread(
    spec: Spec, url: str, servers: Servers, out: Followed | None = None
) -> tuple[threading.Thread, Followed]:
    out = out or Followed(spec, url)
    thread = threading.Thread(target=start_and_follow, args=(spec, url, servers, out), daemon=True)
    thread.start()
    return thread, out


def _start(out: Followed, url: str) -> None:
    kind, body = out.spec.kind, out.spec.body
    key = {"Idempotency-Key": out.start_key}
    with httpx.Client(base_url=url, timeout=httpx.Timeout(60, read=120)) as client:
        if kind == "job":
            r = client.post("/v1/jobs", json=body, headers=key)
            r.raise_for_status()
            out.job_id = r.json()["id"]
            _read(out, client, "GET", f"/v1/jobs/{out.job_id}/events")
            return
        path = {"generate": "/v1/generate", "answers": "/v1/answers"}.get(
            kind, "/v1/chat/completions"
        )
        _read(out, client, "POST", path, json=body, headers=key)


def _resume(out: Followed, url: str) -> None:
    path = f"/v1/jobs/{out.job_id}/events" if out.job_id else f"/v1/streams/{out.stream_id}/events"
    headers = {} if out.last_id is None else {"Last-Event-ID": str(out.last_id)}
    with httpx.Client(base_url=url, timeout=httpx.Timeout(60, read=120)) as client:
        _read(out, client, "GET", path, headers=headers)


def _read(out: Followed, client: httpx.Client, method: str, path: str, **kw: Any) -> None:
    """Append what one connection brings; mark the end when the stream's last event came.

    A reader's own error (the log unreachable from that server, say) is not in the log and
    has no id: in our events its JSON has no ``id``; in the chat format it is an error chunk
    after which the connection ends without ``[DONE]``. Either way: resume elsewhere.
    (httpx-sse carries the last id over to frames sent without one, as the SSE spec says.)"""
    chat = out.spec.kind == "chat"
    with connect_sse(client, method, path, **kw) as source:
        if source.response.is_error:
            source.response.read()  # (its text, for the error below)
        source.response.raise_for_status()
        out.stream_id = out.stream_id or source.response.headers.get("x-stream-id", "")
        for sse in source.iter_sse():
            if not sse.data:
                continue  # keep-alive
            frame = Frame(int(sse.id) if sse.id else None, sse.event, sse.data)
            if out.pause_s:
                time.sleep(out.pause_s)
            if not chat and frame.event == "error" and "id" not in json.loads(frame.data):
                out.reader_errors.append(frame.data)
                return
            out.frames.append(frame)
            if (chat and frame.data == "[DONE]") or (not chat and frame.event in ("done", "error")):
                _end(out)
                return
    while chat and out.frames and out.frames[-1].data.startswith('{"error"'):
        out.reader_errors.append(out.frames.pop().data)


def _end(out: Followed) -> None:
    out.ended = True
    out.ended_at = time.monotonic()


# ---- references and verdicts ------------------------------------------------------------


def reference(spec: Spec, url: str) -> str:
    """The text of an uninterrupted run (non-streaming request, or a whole job); a 503 (the
    service still recovering from the previous fault) is printed and the request sent again."""
    for _ in range(60):
        try:
            return _reference(spec, url)
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code != 503:
                raise
            print(f"reference: 503 {exc.response.text[:200]}", flush=True)
            time.sleep(1)
    raise RuntimeError("the service answered 503 for a minute")


def _reference(spec: Spec, url: str) -> str:
    with httpx.Client(base_url=url, timeout=900) as client:
        if spec.kind == "job":
            r = client.post("/v1/jobs", json=spec.body)
            r.raise_for_status()
            job_id = r.json()["id"]
            while True:
                status = client.get(f"/v1/jobs/{job_id}").json()["status"]
                if status not in ("queued", "running"):
                    break
                time.sleep(1)
            return job_text(client, job_id)
        if spec.kind == "chat":
            r = client.post("/v1/chat/completions", json={**spec.body, "stream": False})
            r.raise_for_status()
            return str(r.json()["choices"][0]["message"]["content"])
        path = "/v1/generate" if spec.kind == "generate" else "/v1/answers"
        r = client.post(path, json={**spec.body, "stream": False})
        r.raise_for_status()
        data = r.json()
        return str(data["text"] if spec.kind == "generate" else data["answer"])


def job_text(client: httpx.Client, job_id: str) -> str:
    r = client.get(f"/v1/jobs/{job_id}/result", params={"format": "json"})
    r.raise_for_status()
    return "\n\n".join(f"## {s['heading']}\n{s['text']}" for s in r.json()["sections"])


def text_of(out: Followed) -> str:
    if out.spec.kind == "chat":
        parts = []
        for f in out.frames:
            if f.data == "[DONE]":
                continue
            for choice in json.loads(f.data).get("choices") or []:
                parts.append(choice.get("delta", {}).get("content") or "")
        return "".join(parts)
    return "".join(json.loads(f.data)["text"] for f in out.frames if f.event == "token")


def replay(out: Followed, url: str) -> list[Frame]:
    """The whole stream from its first event, read in one go from a live server."""
    probe = Followed(out.spec, url, stream_id=out.stream_id, job_id=out.job_id)
    with httpx.Client(base_url=url, timeout=120) as client:
        path = (
            f"/v1/jobs/{out.job_id}/events" if out.job_id else f"/v1/streams/{out.stream_id}/events"
        )
        _read(probe, client, "GET", path)
    return probe.frames


def _error_code(out: Followed) -> str | None:
    """The code of the error the client's stream ended with, if it did."""
    if out.spec.kind == "chat":
        errors = [f for f in out.frames if '"error"' in f.data[:12]]
        return str(json.loads(errors[-1].data)["error"]["code"]) if errors else None
    last = out.frames[-1] if out.frames else None
    if last is None or last.event != "error":
        return None
    return str(json.loads(last.data).get("code", "?"))


def start_verdict(reader_errors: list[str]) -> tuple[str, str]:
    """For a start that named no stream: answered with an error status at last, a clear
    ``error`` (the client was told); cut before any answer every time it was sent (with its
    Idempotency-Key, ``START_ATTEMPTS`` times), ``start_lost``: the client saw its connection
    fail and holds nothing wrong, but has no stream id to resume."""
    starts = [e for e in reader_errors if e.startswith("start: ")]
    last = starts[-1] if starts else ""
    if last.startswith("start: HTTPStatusError"):
        status = re.search(r"'(\d{3}) ", last)
        return "error", f"the start was answered {status.group(1) if status else '?'}"
    return "start_lost", last[:200] or "the start named no stream"


def verdict(out: Followed, expected: str, url: str) -> tuple[str, str]:
    """(``identical`` | ``error`` | ``start_lost`` | ``wrong``, the reason)."""
    if not out.ended:
        if not out.stream_id and not out.job_id:
            return start_verdict(out.reader_errors)
        return "wrong", out.failure or "no terminal event"
    ids = [f.id for f in out.frames if f.id is not None]
    # chat frames of one event share its id (only the last carries it, see above)
    if ids != (sorted(ids) if out.spec.kind == "chat" else sorted(set(ids))):
        return "wrong", f"ids repeated or out of order: {ids}"
    try:
        full = replay(out, url)
    except httpx.HTTPStatusError as exc:
        if exc.response.status_code != 404:
            raise
        # the log is gone (Redis restarted empty): the client's stream is judged alone, by its
        # end (an error it was told) or by its text (it ended before the fault)
        code = _error_code(out)
        if code is not None:
            return "error", f"{code} (its log is gone: 404)"
        if out.spec.kind == "job":
            with httpx.Client(base_url=url, timeout=60) as client:
                job = client.get(f"/v1/jobs/{out.job_id}").json()
                if job["status"] == "failed":
                    return "error", f"{job['error']['code']} (its log is gone: 404)"
                got = job_text(client, out.job_id)
        else:
            got = text_of(out)
        if got == expected:
            return "identical", "its log is gone (404), the text the client read is whole"
        return "wrong", "its log is gone (404), and what the client read is not the text"
    seen = [(f.id, f.event, f.data) for f in out.frames]
    logged = [(f.id, f.event, f.data) for f in full]
    if _error_code(out) == "log_lost" and full:
        # Redis restarted empty: the log holds only the error that says so, which the client
        # read last; what it read before cannot be checked against a log that is gone. (In
        # the chat format the error chunk has no id line: SSE carries the one before it over.)
        tail = seen[-len(logged) :]
        if [x[1:] for x in logged] == [x[1:] for x in tail]:
            return "error", "log_lost (the log holds only its error)"
    if logged != seen:
        return "wrong", "what the client assembled differs from the log's replay"
    full_ids = [f.id for f in full if f.id is not None]
    # (the chat format sends citations as one chunk: its ids skip; its text is checked below)
    if out.spec.kind != "chat" and full_ids != list(
        range(full_ids[0], full_ids[0] + len(full_ids))
    ):
        return "wrong", f"the log has a hole: {full_ids}"
    code = _error_code(out)
    if code is not None:
        return "error", code
    got = text_of(out)
    if out.spec.kind == "job":
        with httpx.Client(base_url=url, timeout=60) as client:
            document = job_text(client, out.job_id)
        if document != expected:
            return "wrong", f"job document differs: {document!r} != {expected!r}"
        return "identical", ""
    if got != expected:
        return "wrong", f"text differs: {got!r} != {expected!r}"
    return "identical", ""
