"""Chunk vectors: the ``VectorStore`` contract every backend implements.

Backends (``stores.open_vector_store`` picks one from the settings):
- ``edge_store.EdgeVectorStore``: qdrant-edge, Qdrant's engine in-process (the default);
- ``qdrant_store.QdrantVectorStore``: qdrant-client, on a Qdrant server (``qdrant_url``) or in
  local mode (a folder, brute force in Python: the server's API without a server).

Every backend holds one collection for all knowledge bases. A point is a chunk: its id is the
chunk id (so SQL rows and vectors join one to one), it has a dense vector (``dense``, cosine)
and a BM25 sparse vector (``bm25``, IDF applied by the store), and its payload carries
``kb_id``, ``document_id`` and the document's metadata (under ``meta``) so searches filter by
knowledge base and metadata (both ids have keyword indexes).

Only failures to reach the store (no connection, a timeout, a 5xx or 429 answer) become
``VectorStoreUnavailable``, with a short reason; the details go to the log. Anything else (a
request the store refuses, a bug) is raised as it is and answered as an internal error.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from rag_stream.retrieval.sparse import SparseVector
from rag_stream.schemas.kbs import MetaValue, SearchMode

DENSE = "dense"  # the named vectors of a point
SPARSE = "bm25"
# Reciprocal-rank fusion: a hit's fused score is the sum over the searches that found it of
# 1 / (RRF_K + position), position counted from 0 (Qdrant's formula, so its k is the paper's k
# + 1; its default is 2). Larger k flattens the ranks until a chunk mediocre in both lists beats
# the one BM25 ranks first, which is what happens to Chinese questions when the English-only
# default embedder ranks noise. Chosen on one evaluation set and tested on a held-out one
# (docs/bench/retrieval.md): k = 1 and 2 tie; from 5 up Chinese loses first places (held-out
# MRR 0.82 at 2, 0.74 at 10, 0.68 at 60) while English moves by at most one question.
RRF_K = 2

DenseVector = Sequence[float] | np.ndarray[Any, Any]


@dataclass(frozen=True)
class VectorPoint:
    chunk_id: str
    vector: DenseVector
    kb_id: str
    document_id: str
    meta: Mapping[str, Any]
    sparse: SparseVector = field(default_factory=lambda: SparseVector([], []))


@dataclass(frozen=True)
class VectorQuery:
    """What to search with: ``dense`` is needed unless the mode is sparse (where it only serves
    a score threshold), ``sparse`` unless it is dense."""

    mode: SearchMode
    dense: DenseVector | None = None
    sparse: SparseVector | None = None

    def __post_init__(self) -> None:
        if self.mode != "sparse" and self.dense is None:
            raise ValueError(f"a {self.mode} search needs the dense query vector")
        if self.mode != "dense" and self.sparse is None:
            raise ValueError(f"a {self.mode} search needs the sparse query vector")


@dataclass(frozen=True)
class VectorHit:
    chunk_id: str
    score: float  # what ranked it: cosine (dense), BM25 (sparse), fused RRF (hybrid)
    vector: list[float] | None  # the dense vector, when asked for


class VectorStore(Protocol):
    async def ensure(self, dimension: int) -> None:
        """Create the collection and its indexes if missing (idempotent)."""
        ...

    async def upsert(self, points: Sequence[VectorPoint]) -> None: ...

    async def delete_chunks(self, chunk_ids: Sequence[str]) -> None: ...

    async def delete_kb(self, kb_id: str) -> None: ...

    async def search(
        self,
        kb_id: str,
        query: VectorQuery,
        limit: int,
        meta_filter: Mapping[str, MetaValue] | None = None,
        score_threshold: float | None = None,
        with_vectors: bool = False,
    ) -> list[VectorHit]:
        """Best points of ``kb_id`` first whose metadata matches every key of ``meta_filter``:
        a value matches equal values of the same JSON type (numbers by value, so 2 is 2.0; true
        is not 1), a list any of its values (none, if it is empty), and a document's list
        matches if any of its elements does. ``score_threshold`` is a minimum cosine
        similarity to ``query.dense`` in every mode (so a sparse query that has a threshold
        carries its dense vector too; without one it is not bounded). BM25 statistics (IDF)
        are those of the knowledge base."""
        ...

    async def optimize(self) -> None:
        """Build the indexes now if the backend defers them (edge); otherwise nothing."""
        ...

    async def ping(self) -> None: ...

    async def close(self) -> None: ...


def point_id(chunk_id: str) -> str:
    return str(uuid.UUID(hex=chunk_id))


def chunk_id_of(point: object) -> str:
    return uuid.UUID(str(point)).hex


def cosine_at_least(
    hits: list[VectorHit], query: DenseVector | None, threshold: float | None
) -> list[VectorHit]:
    """Hits whose dense vector's cosine with the query reaches ``threshold`` (unit vectors:
    the dot product). Fused and BM25 scores are not similarities, so a hybrid or sparse search
    bounds this way, after ranking."""
    if threshold is None or query is None:
        return hits
    q = np.asarray(query, dtype=np.float32)
    return [h for h in hits if h.vector is not None and float(np.dot(q, h.vector)) >= threshold]
