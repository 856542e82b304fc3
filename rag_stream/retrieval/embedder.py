"""Sentence embeddings (sentence-transformers), always computed off the event loop."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any, Protocol

import anyio
import numpy as np
import numpy.typing as npt

log = logging.getLogger(__name__)

Vectors = npt.NDArray[np.float32]


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


class SentenceTransformerEmbedder:
    def __init__(self, model: Any, batch_size: int = 64) -> None:
        self._model = model
        self._batch_size = batch_size
        self.dimension = int(model.get_sentence_embedding_dimension())
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
    async def load(cls, name_or_path: str, batch_size: int = 64) -> SentenceTransformerEmbedder:
        def build() -> Any:
            from sentence_transformers import SentenceTransformer

            return SentenceTransformer(name_or_path, device="cpu")

        model = await anyio.to_thread.run_sync(build)
        log.info("embedder: loaded %s", name_or_path)
        return cls(model, batch_size)

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
