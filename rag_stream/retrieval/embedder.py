"""Sentence embeddings, always computed off the event loop: ``load_embedder`` picks a backend.

Two backends run the same model and give the same vectors: ``onnx`` (the default when it can:
``onnx_embedder.py``, no torch; about 3x faster for one query on 2 cores and ~5 CPU-s quicker
to load) and ``torch`` (sentence-transformers, here; any sentence-transformers model).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

import anyio
import numpy as np

from rag_stream.errors import ConfigError
from rag_stream.retrieval.onnx_embedder import OnnxEmbedder, Vectors
from rag_stream.settings import EmbedderBackend

log = logging.getLogger(__name__)


class Embedder(Protocol):
    dimension: int
    max_seq_length: int

    async def embed(self, texts: Sequence[str]) -> Vectors:
        """Unit-normalized vectors, one row per text."""
        ...

    def count_tokens(self, text: str) -> int: ...

    def token_offsets(self, text: str) -> list[tuple[int, int]]:
        """Character span of each token of text (no special tokens)."""
        ...


async def load_embedder(
    name_or_path: str, batch_size: int = 64, backend: EmbedderBackend = "torch"
) -> LoadedEmbedder:
    """``torch`` loads any sentence-transformers model; ``onnx`` needs a mean-pooled model and
    the export prepare-models makes, and refuses to start without them; ``auto`` (the
    service's default) takes onnx when it can and torch otherwise, saying why in the log."""
    embedder: LoadedEmbedder
    if backend == "torch":
        embedder = await TorchEmbedder.load(name_or_path, batch_size)
    else:
        try:
            embedder = await OnnxEmbedder.open(Path(name_or_path), batch_size)
        except ConfigError as exc:
            if backend == "onnx":
                raise
            # auto: any sentence-transformers model still runs, on torch
            log.info("embedder: torch, not onnx: %s", exc.message)
            embedder = await TorchEmbedder.load(name_or_path, batch_size)
    log.info("embedder: loaded %s (%s)", name_or_path, embedder.backend)
    return embedder


class TorchEmbedder:
    backend: Literal["torch"] = "torch"

    def __init__(self, model: Any, batch_size: int = 64) -> None:
        self._model = model
        self._batch_size = batch_size
        # newer sentence-transformers (6.3 here) renamed it; the old name warns
        dimension = getattr(model, "get_embedding_dimension", None)
        dimension = dimension or model.get_sentence_embedding_dimension
        self.dimension = int(dimension())
        self.max_seq_length = int(model.max_seq_length)
        self._tokenizer = model.tokenizer
        # A Hugging Face fast tokenizer is not safe to use from two threads at once: each call
        # sets the shared Rust tokenizer's padding and truncation, so another thread's call can
        # undo them under an encode, whose batch then cannot become a tensor ("Unable to create
        # tensor": a 500 on uploads that ran at once). Every use of it takes this lock: encodes,
        # and the token counts and offsets that chunking asks for (another upload's, in another
        # thread).
        self._tokenizing = threading.Lock()

    @classmethod
    async def load(cls, name_or_path: str, batch_size: int = 64) -> TorchEmbedder:
        def build() -> TorchEmbedder:
            from sentence_transformers import SentenceTransformer

            return cls(SentenceTransformer(name_or_path, device="cpu"), batch_size)

        return await anyio.to_thread.run_sync(build)

    def encode_sync(self, texts: Sequence[str]) -> Vectors:
        with self._tokenizing:
            vectors = self._model.encode(
                list(texts),
                batch_size=self._batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        return np.asarray(vectors, dtype=np.float32)

    async def embed(self, texts: Sequence[str]) -> Vectors:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return await anyio.to_thread.run_sync(self.encode_sync, texts)

    def count_tokens(self, text: str) -> int:
        with self._tokenizing:
            return len(self._tokenizer(text, add_special_tokens=False)["input_ids"])

    def token_offsets(self, text: str) -> list[tuple[int, int]]:
        with self._tokenizing:
            enc = self._tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return [(int(a), int(b)) for a, b in enc["offset_mapping"]]


LoadedEmbedder = TorchEmbedder | OnnxEmbedder  # what ``load_embedder`` returns
