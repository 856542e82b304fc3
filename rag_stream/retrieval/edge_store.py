"""Chunk vectors in qdrant-edge (Qdrant's engine, embedded), run in a worker process.

Qdrant's engine holds the GIL for the whole of each call. A search is milliseconds, but
building the indexes (``optimize()``) takes ~1 s per 20k new points and 5 s at 200k, and in the
API process that froze every stream for as long. So the shard lives in a worker process
(``edge_worker.py`` runs ``edge_shard.Shard``) and this class forwards each call to it over a
pipe (~0.1 ms), one at a time; the API process only waits, in a thread, with the GIL free.
Only ``edge_shard`` and ``edge_bm25`` import ``qdrant_edge`` (pinned: the package is beta).

One shard in one folder, opened by one process: the worker opens it when this store is made,
so a second process fails at once (``StoreInUse``); the worker dies with its API process,
releasing the folder. If the worker dies on its own, the next call starts a new one (which
reopens the shard from its write-ahead log) and is tried once more: every call is idempotent.

The engine has no background optimizer: points land in an appendable segment, searched as they
are, and ``optimize()`` turns them into an indexed, immutable one (2-3x faster to search, deleted
points vacuumed). This store runs it after a write that leaves ``optimize_after_points`` points
unindexed (a large upload) and once writes have paused for ``optimize_idle_s``; searches wait
for it (streams do not). The CLI calls it when it is done writing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import anyio

from rag_stream import children
from rag_stream.errors import VectorStoreUnavailable
from rag_stream.retrieval.edge_shard import StoreInUse
from rag_stream.retrieval.edge_worker import read_frame, write_frame
from rag_stream.retrieval.vector_store import VectorHit, VectorPoint, VectorQuery
from rag_stream.schemas.kbs import MetaValue

__all__ = ["EdgeVectorStore", "StoreInUse"]

log = logging.getLogger(__name__)
_STOP_TIMEOUT_S = 30.0  # a worker finishing an optimize before it closes the shard


class _WorkerDied(Exception):
    pass


class _Worker:
    """One worker process and its pipes; it dies with this process (rag_stream/children.py)."""

    def __init__(self, path: Path) -> None:
        self._proc = children.popen(
            [sys.executable, "-m", "rag_stream.retrieval.edge_worker", str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self._lock = threading.Lock()
        self._died = False  # a call saw it go (before the kernel may say it has exited)

    def opened(self) -> None:
        """Wait for the shard to open; its error (``StoreInUse``...) if it could not."""
        with self._lock:
            ok, value = self._reply()
        if not ok:
            self.stop()
            raise value

    def call(self, method: str, *args: Any) -> Any:
        with self._lock:
            assert self._proc.stdin is not None
            if self._died:  # (calls queued behind the one that found it dead)
                raise _WorkerDied("found dead by an earlier call")
            try:
                write_frame(self._proc.stdin, (method, args))
            except (OSError, ValueError) as exc:  # a broken pipe; closed by stop()
                self._died = True
                raise _WorkerDied from exc
            ok, value = self._reply()
        if not ok:
            raise value
        return value

    def alive(self) -> bool:
        return not self._died and self._proc.poll() is None

    def stop(self) -> None:
        if self._proc.stdin is not None:
            with contextlib.suppress(OSError):  # flushing into a dead worker's pipe
                self._proc.stdin.close()
        try:
            self._proc.wait(_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()

    def _reply(self) -> tuple[bool, Any]:
        assert self._proc.stdout is not None
        try:
            return cast(tuple[bool, Any], read_frame(self._proc.stdout))
        except (EOFError, OSError, ValueError):  # ValueError: closed by stop()
            self._died = True
            raise _WorkerDied(f"exit code {self._proc.wait()}") from None


class EdgeVectorStore:
    def __init__(
        self,
        path: Path,
        optimize_after_points: int = 20_000,
        optimize_idle_s: float = 30.0,
    ) -> None:
        self._path = path
        self._optimize_after = optimize_after_points
        self._idle_s = optimize_idle_s
        self._worker: _Worker | None = _Worker(path)
        self._worker.opened()
        self._unindexed = 0  # points written or deleted since the last optimize
        self._last_write = 0.0
        self._idle: asyncio.Task[None] | None = None
        self._lock = anyio.Lock()  # writes and optimize, one at a time
        self._replacing = anyio.Lock()  # one replacement of a dead worker, whoever finds it

    @property
    def unindexed(self) -> int:
        return self._unindexed

    async def ensure(self, dimension: int) -> None:
        await self._call("ensure", dimension)

    async def upsert(self, points: Sequence[VectorPoint]) -> None:
        if points:
            await self._write("upsert", list(points), count=len(points))

    async def delete_chunks(self, chunk_ids: Sequence[str]) -> None:
        if chunk_ids:
            await self._write("delete_chunks", list(chunk_ids), count=len(chunk_ids))

    async def delete_kb(self, kb_id: str) -> None:
        await self._write("delete_kb", kb_id, count=1)

    async def search(
        self,
        kb_id: str,
        query: VectorQuery,
        limit: int,
        meta_filter: Mapping[str, MetaValue] | None = None,
        score_threshold: float | None = None,
        with_vectors: bool = False,
    ) -> list[VectorHit]:
        flt = dict(meta_filter) if meta_filter is not None else None
        hits = await self._call("search", kb_id, query, limit, flt, score_threshold, with_vectors)
        return cast(list[VectorHit], hits)

    async def optimize(self) -> None:
        async with self._lock:
            await self._optimize_locked()

    async def count(self, kb_id: str | None = None) -> int:
        return cast(int, await self._call("count", kb_id))

    async def point_ids(self, kb_id: str) -> set[str]:
        """Every chunk id of a knowledge base (tests and reindex checks)."""
        return cast(set[str], await self._call("point_ids", kb_id))

    async def ping(self) -> None:
        await self._call("ping")

    async def close(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        worker, self._worker = self._worker, None
        if worker is not None:
            async with self._lock:
                await anyio.to_thread.run_sync(worker.stop)

    async def _write(self, method: str, *args: Any, count: int) -> None:
        async with self._lock:
            await self._call(method, *args)
            self._unindexed += count
            self._last_write = time.monotonic()
            if self._optimize_after and self._unindexed >= self._optimize_after:
                await self._optimize_locked()
        self._arm_idle()

    async def _optimize_locked(self) -> None:
        if self._unindexed == 0:
            return
        took = await self._call("optimize")
        log.info("vector store: indexed %d changes in %.2f s", self._unindexed, took)
        self._unindexed = 0

    def _arm_idle(self) -> None:
        if self._idle_s and (self._idle is None or self._idle.done()):
            self._idle = asyncio.create_task(self._optimize_when_idle(), name="edge-optimize")

    async def _optimize_when_idle(self) -> None:
        while self._unindexed:
            quiet = time.monotonic() - self._last_write
            if quiet < self._idle_s:
                await asyncio.sleep(self._idle_s - quiet)
                continue
            try:
                await self.optimize()
            except Exception as exc:  # the next write tries again
                log.warning("vector store: optimize failed: %s", exc)
                return

    async def _call(self, method: str, *args: Any) -> Any:
        for attempt in (1, 2):
            worker = await self._live_worker()
            try:
                return await anyio.to_thread.run_sync(worker.call, method, *args)
            except _WorkerDied as exc:
                log.warning("vector store: the worker process died (%s)", exc)
                if attempt == 2:
                    raise VectorStoreUnavailable("the vector store's worker process died") from exc
        raise AssertionError("unreachable")

    async def _live_worker(self) -> _Worker:
        while True:
            worker = self._worker
            if worker is None:
                raise RuntimeError("the vector store is closed")
            if worker.alive():
                return worker
            # Calls in flight all find the death at once: the first replaces the worker and
            # the others wait for it (a second replacement would find the folder held by the
            # first and fail its call: vector_store_unavailable in the chaos campaign)
            async with self._replacing:
                if self._worker is not worker:
                    continue  # replaced while this call waited
                worker.stop()  # dead: reap it and close its pipes
                replacement = _Worker(self._path)
                try:
                    await anyio.to_thread.run_sync(replacement.opened)
                except StoreInUse as exc:
                    raise VectorStoreUnavailable(
                        "the vector store's folder is held by another process"
                    ) from exc
                self._worker = replacement
                return replacement
