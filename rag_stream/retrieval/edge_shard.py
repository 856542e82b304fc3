"""One qdrant-edge shard, driven synchronously: what the store's worker process runs
(``edge_worker.py``). Qdrant's engine holds the GIL for the whole of a call, an ``optimize()``
included (seconds at 200k points), so no API process runs this code: see ``edge_store``.

Dense vectors are searched exactly, with no HNSW graph (``m=0``): within one knowledge base the
scan takes 0.6 ms per 10k chunks once optimized, recall is exact, and the graph would cost
minutes of optimize per 200k chunks. The ``kb_id`` keyword index is a tenant index, so
optimized segments keep each knowledge base's points together.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import qdrant_edge as qe

from rag_stream.retrieval.filters import AnyKeyword, Condition, Exact, meta_conditions
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


class StoreInUse(RuntimeError):
    """Another process has the shard open."""


class Shard:
    """The shard in ``path``: loaded now if it exists (so a second process fails at once),
    created by ``ensure`` otherwise."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._shard: qe.EdgeShard | None = _load(path) if _exists(path) else None

    def ensure(self, dimension: int) -> None:
        if self._shard is None:
            self._path.mkdir(parents=True, exist_ok=True)
            self._shard = _create(self._path, dimension)
            return
        try:  # a shard made with another embedder: its vectors are of no use to this one
            _query_one(self._shard, [0.0] * dimension)
        except Exception as exc:
            raise RuntimeError(
                f"the vector store in {self._path} does not take {dimension}-dimensional "
                f"vectors (was the embedder changed?): run `rag-stream reindex`"
            ) from exc

    def upsert(self, points: Sequence[VectorPoint]) -> None:
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
        self._opened().update(qe.UpdateOperation.upsert_points(edge_points))

    def delete_chunks(self, chunk_ids: Sequence[str]) -> None:
        operation = qe.UpdateOperation.delete_points([point_id(c) for c in chunk_ids])
        self._opened().update(operation)

    def delete_kb(self, kb_id: str) -> None:
        self._opened().update(qe.UpdateOperation.delete_points_by_filter(_kb_filter(kb_id)))

    def search(
        self,
        kb_id: str,
        query: VectorQuery,
        limit: int,
        meta_filter: Mapping[str, MetaValue] | None,
        score_threshold: float | None,
        with_vectors: bool,
    ) -> list[VectorHit]:
        groups = meta_conditions(meta_filter)
        if groups is None:
            return []
        flt = qe.Filter(must=[_kb_condition(kb_id), *map(_group, groups)])
        fetch_vectors = with_vectors or (score_threshold is not None and query.mode != "dense")
        request = _request(kb_id, query, limit, flt, score_threshold, fetch_vectors)
        points = self._opened().query(request)
        hits = [VectorHit(chunk_id_of(p.id), float(p.score), _dense_of(p.vector)) for p in points]
        if query.mode != "dense":
            hits = cosine_at_least(hits, query.dense, score_threshold)
        if not with_vectors:
            hits = [VectorHit(h.chunk_id, h.score, None) for h in hits]
        return hits

    def optimize(self) -> float:
        """Index what was written since the last call; returns the seconds it took."""
        began = time.perf_counter()
        self._opened().optimize()
        return time.perf_counter() - began

    def count(self, kb_id: str | None) -> int:
        flt = _kb_filter(kb_id) if kb_id else None
        return int(self._opened().count(qe.CountRequest(filter=flt, exact=True)))

    def point_ids(self, kb_id: str) -> set[str]:
        request = qe.ScrollRequest(limit=1_000_000, filter=_kb_filter(kb_id), with_payload=False)
        records, _ = self._opened().scroll(request)
        return {chunk_id_of(r.id) for r in records}

    def ping(self) -> None:
        self._opened()

    def close(self) -> None:
        if self._shard is not None:
            shard, self._shard = self._shard, None
            shard.close()

    def _opened(self) -> qe.EdgeShard:
        if self._shard is None:
            raise RuntimeError("the vector store is not set up (ensure was not called)")
        return self._shard


def _request(
    kb_id: str,
    query: VectorQuery,
    limit: int,
    flt: qe.Filter,
    score_threshold: float | None,
    fetch_vectors: bool,
) -> qe.QueryRequest:
    idf = qe.SearchParams(idf=qe.IdfParams(corpus=_kb_filter(kb_id)))  # BM25 over this KB
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
        nearest = qe.Query.Nearest(dense, using=DENSE)
        return qe.QueryRequest(query=nearest, score_threshold=score_threshold, **common)
    if query.mode == "sparse":
        return qe.QueryRequest(query=qe.Query.Nearest(sparse, using=SPARSE), params=idf, **common)
    depth = 2 * limit  # a chunk ranked lower in both lists can beat one found once
    return qe.QueryRequest(
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
