"""The sample knowledge base's vectors, kept beside the models so that a start on a new data
folder ingests the sample KB without embedding it again (about a minute of CPU for docs/ on
2 cores, paid once per machine instead of once per data folder).

``SampleVectors`` is a file of vectors by (embedder, text): ``{models_dir}/sample-kb-vectors.npz``.
``MemoEmbedder`` wraps the service's embedder for the sample KB's ingest only: a chunk whose
text it has a vector for is not embedded; the others are, and their vectors are added to the
file once the ingest ends. Only the sample KB uses it: its texts are the project's own
documentation, the same for everyone, so nothing of one tenant's uploads is kept or can be
timed by another.

The file is written whole to a temporary name and renamed, so a reader sees the old file or
the new one; two processes that write at once each write a complete set. A file that cannot
be read is ignored and a folder that cannot be written is skipped (the log says so): the
ingest is the same either way, only slower.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rag_stream.retrieval.embedder import Embedder
from rag_stream.retrieval.onnx_embedder import Vectors

log = logging.getLogger(__name__)

FILE_NAME = "sample-kb-vectors.npz"
# Old texts are dropped past this (docs/ makes about 800 chunks): a few edits' worth
MAX_KEPT = 8000


def _key(embedder_id: str, text: str) -> str:
    return hashlib.sha256(f"{embedder_id}\0{text}".encode()).hexdigest()[:32]


class SampleVectors:
    """Vectors by (embedder, text), loaded from and saved to one file."""

    def __init__(self, path: Path, embedder_id: str) -> None:
        self.path = path
        self.embedder_id = embedder_id
        self._vectors: dict[str, Vectors] = {}  # insertion order: oldest first
        self._added = 0
        self._lock = threading.Lock()

    @classmethod
    def load(cls, path: Path, embedder_id: str) -> SampleVectors:
        """Blocking (reads the file)."""
        kept = cls(path, embedder_id)
        try:
            with np.load(path, allow_pickle=False) as data:
                keys, rows = data["keys"], data["vectors"]
                kept._vectors = {str(k): rows[i] for i, k in enumerate(keys)}
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError) as exc:
            log.info("sample kb: %s unreadable (%s); embedding anew", path, exc)
        return kept

    def get(self, text: str) -> Vectors | None:
        return self._vectors.get(_key(self.embedder_id, text))

    def add(self, text: str, vector: Vectors) -> None:
        with self._lock:
            self._vectors[_key(self.embedder_id, text)] = vector
            self._added += 1

    @property
    def added(self) -> int:
        return self._added

    def save(self) -> None:
        """Blocking. Writes the file if vectors were added; a failure is logged, not raised."""
        with self._lock:
            if not self._added:
                return
            items = list(self._vectors.items())[-MAX_KEPT:]
        if not items:
            return
        keys = np.array([k for k, _ in items])
        rows = np.stack([v for _, v in items]).astype(np.float32)
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(temporary, "wb") as out:
                np.savez(out, keys=keys, vectors=rows)
            os.replace(temporary, self.path)
        except OSError as exc:
            log.info("sample kb: cannot keep its vectors in %s: %s", self.path, exc)
            with contextlib.suppress(OSError):
                temporary.unlink(missing_ok=True)
            return
        with self._lock:
            self._added = 0


class MemoEmbedder:
    """``inner`` with ``kept``'s vectors for the texts it has; the others are embedded by
    ``inner`` (in one call) and added to ``kept``."""

    def __init__(self, inner: Embedder, kept: SampleVectors) -> None:
        self._inner = inner
        self._kept = kept
        self.dimension = inner.dimension
        self.max_seq_length = inner.max_seq_length

    async def embed(self, texts: Sequence[str]) -> Vectors:
        found = [self._kept.get(text) for text in texts]
        missing = [i for i, vector in enumerate(found) if vector is None]
        if not missing:
            return np.stack([v for v in found if v is not None])
        computed = await self._inner.embed([texts[i] for i in missing])
        rows = np.empty((len(texts), self.dimension), dtype=np.float32)
        for i, vector in enumerate(found):
            if vector is not None:
                rows[i] = vector
        for row, i in zip(computed, missing, strict=True):
            rows[i] = row
            self._kept.add(texts[i], np.array(row, dtype=np.float32))
        return rows

    def count_tokens(self, text: str) -> int:
        return self._inner.count_tokens(text)

    def token_offsets(self, text: str) -> list[tuple[int, int]]:
        return self._inner.token_offsets(text)


def embedder_id(embedder: Embedder, name_or_path: str) -> str:
    """What a kept vector was made by: the model (for a folder, its files' names, sizes and
    times too: a model prepared again there makes its vectors anew), the backend that ran it
    and the vectors' size. Blocking (reads the folder)."""
    backend = getattr(embedder, "backend", type(embedder).__name__)
    folder = Path(name_or_path)
    files = []
    if folder.is_dir():
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            stat = path.stat()
            files.append(f"{path.relative_to(folder)}:{stat.st_size}:{stat.st_mtime_ns}")
    model = hashlib.sha256("\n".join(files).encode()).hexdigest()[:16]
    return f"{name_or_path}|{model}|{backend}|{embedder.dimension}"
