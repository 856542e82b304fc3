"""Parse untrusted uploads in worker processes that can be stopped.

A hostile file can keep a parser busy for minutes (a 15 KB PDF whose content stream inflates to
megabytes of text operators), recurse until Python gives up, or allocate gigabytes. A thread
cannot be stopped and allocates the API's memory; a process can be killed and its memory is its
own. So ``parse_in_worker`` sends the bytes to a worker process (``parse_worker.py``: it parses
under a memory limit) and kills the worker when no reply has come after
``ingest.parse_timeout_s``.

Workers start on demand and stay warm (starting one costs a few hundred ms of imports). One is
reused only after a parse that succeeded, and at most ``_MAX_JOBS`` times: after any failure, a
kill included, the next upload gets a fresh process. At most ``ingest.parse_workers`` parses run
at once per event loop; each waits for its reply in a thread, so the event loop stays free.
"""

from __future__ import annotations

import atexit
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, TypeVar

import anyio
from anyio.lowlevel import RunVar
from pydantic import ValidationError

from rag_stream import children
from rag_stream.errors import InvalidRequest, ServiceUnavailable, from_code
from rag_stream.ingest.parse_worker import (
    READY,
    REPLY,
    Failure,
    Job,
    Parsed,
    read_exact,
    reply_limit,
)
from rag_stream.ingest.parsing import ParsedText, describe
from rag_stream.settings import IngestSettings

logger = logging.getLogger(__name__)

_MAX_JOBS = 100  # a worker's heap only grows: a fresh process now and then gives it back
_START_TIMEOUT_S = 60.0  # imports on a loaded machine; not part of a parse's budget
_WORKER = [sys.executable, "-m", "rag_stream.ingest.parse_worker"]

T = TypeVar("T")


async def parse_in_worker(data: bytes, media_type: str, settings: IngestSettings) -> ParsedText:
    """``parsing.parse`` in a worker process, within the time, memory and text limits of
    ``settings``: 413 for too much text, 422 for an unreadable file or one over the time budget,
    503 if no worker can start."""
    job = Job(
        media_type=media_type,
        size=len(data),
        max_text_chars=settings.max_text_chars,
        memory_mb=settings.parse_memory_mb,
        timeout_s=settings.parse_timeout_s,
    )
    reply = await anyio.to_thread.run_sync(
        _pool.run, job, data, settings.parse_workers, limiter=_limiter(settings.parse_workers)
    )
    if isinstance(reply, Failure):
        raise from_code(reply.code, reply.message)
    return reply.parsed


_limiters: RunVar[anyio.CapacityLimiter] = RunVar("parse_limiter")


def _limiter(workers: int) -> anyio.CapacityLimiter:
    """The bound on parses at once: per event loop, as anyio's limiters must be."""
    try:
        return _limiters.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(workers)
        _limiters.set(limiter)
        return limiter


class _Expired(Exception):
    """The worker was killed for its time budget."""


class _Gone(Exception):
    """The worker ended, or answered nonsense, on its own."""


class _Worker:
    """One worker process. Its pipes are used with blocking I/O, from one thread at a time."""

    def __init__(self) -> None:
        self.jobs = 0
        # from a thread that lasts, not this one: the worker dies with the thread that started it
        self._proc = children.popen(_WORKER, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._requests: IO[bytes] = self._proc.stdin
        self._replies: IO[bytes] = self._proc.stdout

    def wait_ready(self) -> None:
        if self._bounded(_START_TIMEOUT_S, self._replies.readline) != READY:
            raise _Gone

    def parse(self, job: Job, data: bytes) -> Parsed | Failure:
        self.jobs += 1
        header = job.model_dump_json().encode()

        def exchange() -> bytes:
            self._requests.write(len(header).to_bytes(4, "big") + header)
            self._requests.write(data)
            self._requests.flush()
            size = int.from_bytes(read_exact(self._replies, 8), "big")
            if size > reply_limit(job):
                raise _Gone  # not a reply to this job: do not allocate what it claims
            return read_exact(self._replies, size)

        body = self._bounded(job.timeout_s, exchange)
        try:
            return REPLY.validate_json(body)
        except ValidationError:
            raise _Gone from None

    def alive(self) -> bool:
        return self._proc.poll() is None

    def stop(self) -> None:
        self._proc.kill()
        self._proc.wait()
        self._requests.close()
        self._replies.close()

    def _bounded(self, timeout_s: float, io: Callable[[], T]) -> T:
        """``io()``, killing the process if it takes longer than ``timeout_s``: the kill ends
        any blocking read or write on its pipes."""
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            self._proc.kill()

        timer = threading.Timer(timeout_s, expire)
        timer.daemon = True
        timer.start()
        try:
            return io()
        except (OSError, EOFError, ValueError):  # a broken pipe, end of file, a closed pipe
            raise (_Expired if expired.is_set() else _Gone) from None
        finally:
            timer.cancel()


class _Pool:
    """Idle workers, shared by every thread and event loop of the process."""

    def __init__(self) -> None:
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()

    def run(self, job: Job, data: bytes, keep: int) -> Parsed | Failure:
        """One parse (blocking); ``keep`` is how many idle workers to keep afterwards."""
        what = describe(job.media_type)
        worker = self._take()
        try:
            reply = worker.parse(job, data)
        except _Expired:
            worker.stop()
            raise InvalidRequest(f"{what} took longer than {job.timeout_s:g} s to parse") from None
        except _Gone:
            worker.stop()
            raise InvalidRequest(f"{what} could not be parsed (the parser stopped on it)") from None
        except BaseException:
            worker.stop()
            raise
        if isinstance(reply, Parsed) and worker.jobs < _MAX_JOBS and worker.alive():
            with self._lock:
                if len(self._idle) < keep:
                    self._idle.append(worker)
                    return reply
        worker.stop()
        return reply

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.stop()

    def _take(self) -> _Worker:
        with self._lock:
            while self._idle:
                worker = self._idle.pop()
                if worker.alive():
                    return worker
                worker.stop()
        began = time.monotonic()
        try:
            worker = _Worker()
        except OSError:
            logger.exception("cannot start a parse worker")
            raise ServiceUnavailable("the document parser could not start") from None
        try:
            worker.wait_ready()
        except (_Expired, _Gone):
            worker.stop()
            logger.error("a parse worker did not start; its output is above")
            raise ServiceUnavailable("the document parser could not start") from None
        logger.debug("parse worker started in %.3f s", time.monotonic() - began)
        return worker


_pool = _Pool()  # holds no process until the first parse
atexit.register(_pool.close)
