"""The Qdrant collection names, and whether a local-mode folder holds one made before hybrid
search: what the service checks at start-up without importing qdrant-client (about a second
of every process's start, and the embedded default never uses it)."""

from __future__ import annotations

import json
from pathlib import Path

COLLECTION = "chunks_hybrid"
LEGACY_COLLECTION = "chunks"  # one unnamed dense vector, no BM25: `rag-stream reindex` moves it


def legacy_local_store(qdrant_path: Path) -> bool:
    """Whether a qdrant-client local-mode folder holds a collection made before hybrid search
    (read from its meta.json, without opening it: that would take its lock)."""
    meta = qdrant_path / "meta.json"
    if not meta.is_file():
        return False
    try:
        collections = json.loads(meta.read_text()).get("collections", {})
    except (OSError, ValueError):
        return False
    return LEGACY_COLLECTION in collections
