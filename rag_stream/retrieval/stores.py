"""Which vector store and BM25 encoder the settings ask for, opened (not yet ``ensure``d).

- ``qdrant_url`` set: the Qdrant server, through qdrant-client;
- else ``vector_store.backend: edge`` (default): qdrant-edge in ``data_dir/vectors``;
- else ``local``: qdrant-client's local mode in ``data_dir/qdrant``.

An embedded store is one process's: opening one that another process holds (a running
``rag-stream serve`` while the CLI starts, or the reverse) is a ConfigError saying so.
"""

from __future__ import annotations

from pathlib import Path

from rag_stream.errors import ConfigError
from rag_stream.retrieval.collections import LEGACY_COLLECTION, legacy_local_store
from rag_stream.retrieval.edge_bm25 import EdgeBm25
from rag_stream.retrieval.edge_store import EdgeVectorStore, StoreInUse
from rag_stream.retrieval.sparse import SparseEncoder
from rag_stream.retrieval.vector_store import VectorStore
from rag_stream.settings import ENV_PREFIX, Settings


def edge_path(settings: Settings) -> Path:
    return (settings.data_dir / "vectors").resolve()


def embedded_path(settings: Settings) -> Path | None:
    """The folder of the embedded store in use; None with a Qdrant server."""
    if settings.qdrant_url:
        return None
    return edge_path(settings) if settings.vector_store.backend == "edge" else settings.qdrant_path


REINDEX_HINT = "run `rag-stream reindex` to move it into the current store (then start again)"


def old_store(settings: Settings) -> str | None:
    """What a person must be told when the data dir still has a vector store made before
    hybrid search (a qdrant-client local folder with the ``chunks`` collection); None if not.
    A Qdrant server's old collection is checked by preflight, over HTTP."""
    if settings.qdrant_url or not legacy_local_store(settings.qdrant_path):
        return None
    return (
        f"{settings.qdrant_path} holds a vector store made before hybrid search "
        f"(collection {LEGACY_COLLECTION!r}): {REINDEX_HINT}"
    )


def open_vector_store(settings: Settings) -> VectorStore:
    path = embedded_path(settings)
    if path is None:
        return _qdrant_client_store(url=settings.qdrant_url)
    try:
        if settings.vector_store.backend == "edge":
            cfg = settings.vector_store
            return EdgeVectorStore(path, cfg.optimize_after_points, cfg.optimize_idle_s)
        path.mkdir(parents=True, exist_ok=True)
        return _qdrant_client_store(path=path)
    except StoreInUse:
        pass
    except RuntimeError as exc:  # how qdrant-client's local mode says it
        if "already accessed" not in str(exc):
            raise
    raise in_use(path)


def _qdrant_client_store(*, url: str | None = None, path: Path | None = None) -> VectorStore:
    """A Qdrant server (``url``) or a local-mode folder (``path``), through qdrant-client:
    imported only here, because it adds about a second to the start of every process and the
    default (edge) store never uses it."""
    from qdrant_client import AsyncQdrantClient

    from rag_stream.retrieval.qdrant_store import QdrantVectorStore

    if url:
        return QdrantVectorStore(AsyncQdrantClient(url=url, timeout=10))
    assert path is not None
    return QdrantVectorStore(AsyncQdrantClient(path=str(path)))


def in_use(path: Path) -> ConfigError:
    return ConfigError(
        f"the vector store in {path} is in use by another process (a running `rag-stream "
        "serve`?): stop it, use the HTTP API instead, or set "
        f"{ENV_PREFIX}QDRANT_URL to a Qdrant server both can share"
    )


def open_sparse_encoder() -> SparseEncoder:
    return EdgeBm25()
