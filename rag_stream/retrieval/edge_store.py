"""Chunk vectors in qdrant-edge (Qdrant's engine, in-process), and its BM25 encoder: the only
module that imports ``qdrant_edge`` (pinned: the package is beta). Layout in ``vector_store``.

One shard in one folder, opened by one process (a second gets ``StoreInUse``). The engine has
no background optimizer: points land in an appendable segment, searched as they are, and
``optimize()`` turns them into an indexed, immutable one (2-3x faster to search, deleted points
vacuumed). It holds the GIL while it runs (5 s per 200k points here), which stalls every stream
of the process, so this store runs it when it is worth the stall: after a write that leaves
``optimize_after_points`` points unindexed (a large upload, which waits that long anyway), and
once writes have paused for ``optimize_idle_s``. The CLI calls it when it is done writing.

Dense vectors are searched exactly, with no HNSW graph (``m=0``): within one knowledge base the
scan takes 0.6 ms per 10k chunks once optimized, recall is exact, and the graph would cost
minutes of that GIL-held optimize per 200k chunks. The ``kb_id`` keyword index is a tenant
index, so optimized segments keep each knowledge base's points together.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

import anyio
import numpy as np
import qdrant_edge as qe

from rag_stream.retrieval.filters import AnyKeyword, Condition, Exact, meta_conditions
from rag_stream.retrieval.sparse import SparseVector
from rag_stream.retrieval.vector_store import (
    DENSE,
    RRF_K,
    SPARSE,
    VectorHit,
    VectorPoint,
    VectorQuery,
    chunk_id_of,
    cosine_at_least,
    point_id,
)
from rag_stream.schemas.kbs import MetaValue

log = logging.getLogger(__name__)
T = TypeVar("T")


class StoreInUse(RuntimeError):
    """Another process has the shard open."""


class EdgeBm25:
    """BM25 vectors from qdrant-edge's encoder (Rust): the multilingual tokenizer segments
    Chinese (a jieba-class dictionary segmenter, which also emits the words inside compounds:
    数据库 gives 数据 and 数据库) and splits other scripts on word boundaries; English is
    stemmed (Snowball) and English and Chinese stop words are dropped. The same configuration
    on a Qdrant server's BM25 gives the same vectors."""

    def __init__(self, avg_len: float = 120.0) -> None:
        config = qe.Bm25Config(
            avg_len=avg_len,  # terms in a chunk of ~200 embedder tokens, measured on docs/
            tokenizer=qe.TokenizerType.Multilingual,
            language="english",
            stopwords=qe.StopwordsSet(languages={qe.Language.English, qe.Language.Chinese}),
        )
        self._model = qe.Bm25(config)

    def encode_documents(self, texts: Sequence[str]) -> list[SparseVector]:
        return [_ours(self._model.embed_document(t)) for t in texts]

    def encode_query(self, text: str) -> SparseVector:
        return _ours(self._model.embed_query(text))


def _ours(vector: qe.SparseVector) -> SparseVector:
    pairs = sorted(zip(vector.indices, vector.values, strict=True))
    return SparseVector([i for i, _ in pairs], [v for _, v in pairs])


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
        # Opened now when it exists, so a second process fails at start, not at first use.
        self._shard: qe.EdgeShard | None = _load(path) if _exists(path) else None
        self._unindexed = 0  # points written or deleted since the last optimize
        self._last_write = 0.0
        self._idle: asyncio.Task[None] | None = None
        self._lock = anyio.Lock()  # writes and optimize, one at a time

    @property
    def unindexed(self) -> int:
        return self._unindexed

    async def ensure(self, dimension: int) -> None:
        if self._shard is None:
            self._path.mkdir(parents=True, exist_ok=True)
            self._shard = await _off(_create, self._path, dimension)
            return
        try:  # a shard made with another embedder: its vectors are of no use to this one
            await self._run(lambda shard: _query_one(shard, [0.0] * dimension))
        except Exception as exc:
            raise RuntimeError(
                f"the vector store in {self._path} does not take {dimension}-dimensional "
                f"vectors (was the embedder changed?): run `rag-stream reindex`"
            ) from exc

    async def upsert(self, points: Sequence[VectorPoint]) -> None:
        if not points:
            return
        edge_points = [
            qe.Point(
                point_id(p.chunk_id),
                {
                    DENSE: np.asarray(p.vector, dtype=np.float32).tolist(),
                    SPARSE: qe.SparseVector(p.sparse.indices, p.sparse.values),
                },
                {"kb_id": p.kb_id, "document_id": p.document_id, "meta": dict(p.meta)},
            )
            for p in points
        ]
        await self._write(qe.UpdateOperation.upsert_points(edge_points), len(points))

    async def delete_chunks(self, chunk_ids: Sequence[str]) -> None:
        if chunk_ids:
            operation = qe.UpdateOperation.delete_points([point_id(c) for c in chunk_ids])
            await self._write(operation, len(chunk_ids))

    async def delete_kb(self, kb_id: str) -> None:
        operation = qe.UpdateOperation.delete_points_by_filter(_kb_filter(kb_id))
        await self._write(operation, 1)

    async def search(
        self,
        kb_id: str,
        query: VectorQuery,
        limit: int,
        meta_filter: Mapping[str, MetaValue] | None = None,
        score_threshold: float | None = None,
        with_vectors: bool = False,
    ) -> list[VectorHit]:
        groups = meta_conditions(meta_filter)
        if groups is None:
            return []
        kb = _kb_filter(kb_id)
        flt = qe.Filter(must=[_kb_condition(kb_id), *map(_group, groups)])
        idf = qe.SearchParams(idf=qe.IdfParams(corpus=kb))  # BM25 over this KB's chunks
        fetch_vectors = with_vectors or (score_threshold is not None and query.mode != "dense")
        dense: list[float] = []
        if query.dense is not None:
            dense = np.asarray(query.dense, dtype=np.float32).tolist()
        sparse = qe.SparseVector([], [])
        if query.sparse is not None:
            sparse = qe.SparseVector(query.sparse.indices, query.sparse.values)
        common: dict[str, Any] = {
            "limit": limit,
            "filter": flt,
            "with_vector": [DENSE] if fetch_vectors else False,
            "with_payload": False,
        }
        if query.mode == "dense":
            request = qe.QueryRequest(
                query=qe.Query.Nearest(dense, using=DENSE),
                score_threshold=score_threshold,
                **common,
            )
        elif query.mode == "sparse":
            request = qe.QueryRequest(
                query=qe.Query.Nearest(sparse, using=SPARSE), params=idf, **common
            )
        else:
            depth = 2 * limit  # a chunk ranked lower in both lists can beat one found once
            request = qe.QueryRequest(
                prefetches=[
                    qe.Prefetch(
                        depth,
                        query=qe.Query.Nearest(dense, using=DENSE),
                        filter=flt,
                        score_threshold=score_threshold,
                    ),
                    qe.Prefetch(
                        depth, query=qe.Query.Nearest(sparse, using=SPARSE), filter=flt, params=idf
                    ),
                ],
                query=cast(Any, qe.Fusion.Rrf(k=RRF_K)),  # the stubs miss the nesting
                **common,
            )
        points = await self._run(lambda shard: shard.query(request))
        hits = [VectorHit(chunk_id_of(p.id), float(p.score), _dense_of(p.vector)) for p in points]
        if query.mode != "dense":
            hits = cosine_at_least(hits, query.dense, score_threshold)
        if not with_vectors:
            hits = [VectorHit(h.chunk_id, h.score, None) for h in hits]
        return hits

    async def optimize(self) -> None:
        async with self._lock:
            await self._optimize_locked()

    async def count(self, kb_id: str | None = None) -> int:
        flt = _kb_filter(kb_id) if kb_id else None
        return await self._run(lambda shard: shard.count(qe.CountRequest(filter=flt, exact=True)))

    async def point_ids(self, kb_id: str) -> set[str]:
        """Every chunk id of a knowledge base (tests and reindex checks)."""
        request = qe.ScrollRequest(limit=1_000_000, filter=_kb_filter(kb_id), with_payload=False)
        records, _ = await self._run(lambda shard: shard.scroll(request))
        return {chunk_id_of(r.id) for r in records}

    async def ping(self) -> None:
        if self._shard is None:
            raise RuntimeError("the vector store is not set up (ensure was not called)")

    async def close(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        if self._shard is not None:
            shard, self._shard = self._shard, None
            async with self._lock:
                await _off(shard.close)

    async def _write(self, operation: qe.UpdateOperation, count: int) -> None:
        async with self._lock:
            await self._run(lambda shard: shard.update(operation))
            self._unindexed += count
            self._last_write = time.monotonic()
            if self._optimize_after and self._unindexed >= self._optimize_after:
                await self._optimize_locked()
        self._arm_idle()

    async def _optimize_locked(self) -> None:
        if self._unindexed == 0:
            return
        began = time.perf_counter()
        await self._run(lambda shard: shard.optimize())
        took = time.perf_counter() - began
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

    async def _run(self, call: Callable[[qe.EdgeShard], T]) -> T:
        shard = self._shard
        if shard is None:
            raise RuntimeError("the vector store is closed or not set up")
        return await _off(call, shard)


async def _off(call: Callable[..., T], *args: Any) -> T:
    return await anyio.to_thread.run_sync(call, *args)


def _exists(path: Path) -> bool:
    return (path / "edge_config.json").is_file()


def _load(path: Path) -> qe.EdgeShard:
    try:
        return qe.EdgeShard.load(str(path))
    except Exception as exc:
        if "WouldBlock" in str(exc):  # its write-ahead log is locked by another process
            raise StoreInUse(str(path)) from None
        raise


def _create(path: Path, dimension: int) -> qe.EdgeShard:
    config = qe.EdgeConfig(
        vectors={DENSE: qe.EdgeVectorParams(dimension, qe.Distance.Cosine)},
        sparse_vectors={SPARSE: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)},
        hnsw_config=qe.HnswIndexConfig(m=0, ef_construct=100, full_scan_threshold=10_000),
        # Up to 8 optimized segments before they are merged: with the default (about one a
        # core) every optimize re-merged everything (10 s at 200k points, growing); with 8 it
        # stays ~1 s per 20k new points and a search visits a few more segments.
        optimizers=qe.EdgeOptimizersConfig(default_segment_number=8),
    )
    shard = qe.EdgeShard.create(str(path), config)
    shard.update(
        qe.UpdateOperation.create_field_index("kb_id", qe.KeywordIndexParams(is_tenant=True))
    )
    shard.update(qe.UpdateOperation.create_field_index("document_id", qe.PayloadSchemaType.Keyword))
    return shard


def _query_one(shard: qe.EdgeShard, vector: list[float]) -> None:
    shard.query(qe.QueryRequest(limit=1, query=qe.Query.Nearest(vector, using=DENSE)))


def _dense_of(vector: Any) -> list[float] | None:
    value = vector.get(DENSE) if isinstance(vector, dict) else None
    return [float(x) for x in value] if isinstance(value, list) else None


def _kb_condition(kb_id: str) -> qe.FieldCondition:
    return qe.FieldCondition("kb_id", match=qe.MatchValue(kb_id))


def _kb_filter(kb_id: str) -> qe.Filter:
    return qe.Filter(must=[_kb_condition(kb_id)])


def _condition(c: Condition) -> qe.FieldCondition:
    if isinstance(c, AnyKeyword):
        return qe.FieldCondition(c.key, match=qe.MatchAny(c.values))
    if isinstance(c, Exact):
        # The binding reads a Python bool as an int (bool is one) and true would match 1;
        # numpy's bool is no int, so it arrives as a boolean.
        value: Any = np.bool_(c.value) if isinstance(c.value, bool) else c.value
        return qe.FieldCondition(c.key, match=qe.MatchValue(value))
    assert math.isfinite(c.value)
    return qe.FieldCondition(c.key, range=qe.RangeFloat(gte=c.value, lte=c.value))


def _group(group: list[Condition]) -> qe.FieldCondition | qe.Filter:
    if len(group) == 1:
        return _condition(group[0])
    return qe.Filter(should=[_condition(c) for c in group])
