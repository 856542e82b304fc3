"""The embedded store runs qdrant-edge in a worker process: building indexes does not freeze the
API process's event loop (it did in-process: the engine holds the GIL for the whole call), a
worker that dies is replaced without losing what was written, and the folder's lock goes with
the API process."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np

from rag_stream.retrieval.edge_store import EdgeVectorStore
from rag_stream.retrieval.sparse import SparseVector
from rag_stream.retrieval.vector_store import VectorPoint, VectorQuery
from tests.support.waiting import eventually

DIM = 384


def _random_points(n: int, seed: int) -> list[VectorPoint]:
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((n, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    points = []
    for i in range(n):
        terms = sorted({int(t) for t in rng.integers(0, 30_000, 25)})
        sparse = SparseVector(terms, [1.0] * len(terms))
        points.append(VectorPoint(uuid.uuid4().hex, vectors[i], f"kb{i % 10}", "d", {}, sparse))
    return points


async def _gone(pid: int, folder: Path) -> bool:
    return pid not in _worker_pids(folder)


def _worker_pids(folder: Path) -> list[int]:
    """Processes whose command line is the store's worker on ``folder``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"rag_stream.retrieval.edge_worker" in argv and str(folder).encode() in argv:
            found.append(int(entry.name))
    return found


async def _max_loop_lag(until: asyncio.Future[object]) -> float:
    """The longest the event loop went without running a 5 ms timer, while ``until`` runs."""
    worst = 0.0
    last = time.perf_counter()
    while not until.done():
        await asyncio.sleep(0.005)
        now = time.perf_counter()
        worst = max(worst, now - last - 0.005)
        last = now
    return worst


async def test_building_the_indexes_leaves_the_event_loop_free(tmp_path: Path) -> None:
    store = EdgeVectorStore(tmp_path / "v", optimize_after_points=0, optimize_idle_s=0)
    await store.ensure(DIM)
    try:
        points = _random_points(60_000, seed=1)
        for start in range(0, len(points), 5_000):
            await store.upsert(points[start : start + 5_000])
        began = time.perf_counter()
        optimizing = asyncio.ensure_future(store.optimize())
        lag = await _max_loop_lag(optimizing)
        await optimizing
        took = time.perf_counter() - began
        assert store.unindexed == 0
        # In-process, the loop froze for the whole optimize (lag == took); here it keeps
        # ticking. The optimize must be long enough for the comparison to mean something.
        assert took > 0.4, f"optimize took only {took:.2f} s: too little to show a stall"
        assert lag < took / 4, f"the loop stalled {lag:.2f} s of a {took:.2f} s optimize"
    finally:
        await store.close()


async def test_a_dead_worker_is_replaced_and_keeps_what_was_written(tmp_path: Path) -> None:
    folder = tmp_path / "v"
    store = EdgeVectorStore(folder, optimize_after_points=0, optimize_idle_s=0)
    await store.ensure(DIM)
    try:
        points = _random_points(200, seed=2)
        await store.upsert(points)
        query = VectorQuery("dense", points[0].vector)
        before = await store.search("kb0", query, 5)
        assert before[0].chunk_id == points[0].chunk_id
        (pid,) = _worker_pids(folder)
        os.kill(pid, signal.SIGKILL)
        # dead (a zombie's command line is empty) before the next call, which must replace it
        await eventually(lambda: _gone(pid, folder), f"worker {pid} dead")
        after = await store.search("kb0", query, 5)
        assert [h.chunk_id for h in after] == [h.chunk_id for h in before]
        assert await store.count() == 200
        assert _worker_pids(folder) not in ([], [pid])
    finally:
        await store.close()
    assert _worker_pids(folder) == []  # close stops the worker


async def test_calls_in_flight_when_the_worker_dies_all_get_answers(tmp_path: Path) -> None:
    """Every call that finds the worker dead waits for one replacement: none fails. (Each
    started its own, which found the folder held by the first: the chaos campaign's
    ``vector_store_unavailable`` for an answer whose search was running.)"""
    folder = tmp_path / "v"
    store = EdgeVectorStore(folder, optimize_after_points=0, optimize_idle_s=0)
    await store.ensure(DIM)
    try:
        points = _random_points(200, seed=3)
        await store.upsert(points)
        queries = [VectorQuery("dense", p.vector) for p in points[:12]]
        expected = [(await store.search(p.kb_id, q, 3))[0].chunk_id for p, q in
                    zip(points, queries, strict=False)]  # fmt: skip
        (pid,) = _worker_pids(folder)
        os.kill(pid, signal.SIGKILL)
        found = await asyncio.gather(
            *(store.search(p.kb_id, q, 3) for p, q in zip(points, queries, strict=False)),
            return_exceptions=True,
        )
        failed = [f for f in found if isinstance(f, BaseException)]
        assert not failed, failed
        assert [hits[0].chunk_id for hits in found] == expected  # type: ignore[index]
        assert len(_worker_pids(folder)) == 1
    finally:
        await store.close()


_HOLDER = """
import asyncio, sys
from pathlib import Path
from rag_stream.retrieval.edge_store import EdgeVectorStore
async def main():
    store = EdgeVectorStore(Path(sys.argv[1]))
    await store.ensure(8)
    print("ready", flush=True)
    await asyncio.sleep(600)
asyncio.run(main())
"""


def test_the_folder_is_released_when_its_api_process_is_killed(tmp_path: Path) -> None:
    folder = tmp_path / "v"
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(folder)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "ready"
        assert len(_worker_pids(folder)) == 1
        holder.kill()  # kill -9: no clean-up runs in the holder
        holder.wait()
        deadline = time.monotonic() + 10
        while _worker_pids(folder) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _worker_pids(folder) == []  # the kernel took the worker down with it
        asyncio.run(_open_and_close(folder))  # and the folder is free again
    finally:
        holder.kill()
        holder.wait()


async def _open_and_close(folder: Path) -> None:
    await EdgeVectorStore(folder).close()
