"""Sentence embeddings (sentence-transformers), always computed off the event loop.

Two backends run the same model: ``onnx`` (the default: the transformer on ONNX Runtime, see
``onnx_model.py``; about 3x faster for one query on 2 cores) and ``torch``
(``SentenceTransformer.encode``). Both use the model's tokenizer; onnx pools as the model's
modules say (mean over the attention mask, then unit length), which ``load`` checks by
comparing the two on a probe sentence.

With onnx, only small calls (questions: up to ``ONNX_MAX_TEXTS`` texts) run on ONNX Runtime;
ingestion's batches stay on torch. The throughput of the two is the same on batches, but
ONNX Runtime's memory arena keeps the peak of its largest run: +1.2 GB after one batch of 64
chunks of 256 tokens, measured, against torch's +0.24 GB (it took a CI run's engines out of
memory). Both give the same vectors, so a question embedded by one finds chunks the other
embedded.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import anyio
import numpy as np
import numpy.typing as npt

from rag_stream.errors import ConfigError
from rag_stream.retrieval.onnx_model import OnnxTransformer, onnx_file
from rag_stream.settings import EmbedderBackend

log = logging.getLogger(__name__)

Vectors = npt.NDArray[np.float32]
_PROBE = "How do I resume a stream? 如何恢复一个流？"
ONNX_MAX_TEXTS = 8


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
    def __init__(
        self, model: Any, batch_size: int = 64, onnx: OnnxTransformer | None = None
    ) -> None:
        self._model = model
        self._batch_size = batch_size
        self._onnx = onnx
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
    async def load(
        cls, name_or_path: str, batch_size: int = 64, backend: EmbedderBackend = "torch"
    ) -> SentenceTransformerEmbedder:
        """``torch`` loads any sentence-transformers model; ``onnx`` needs a mean-pooled model
        and the export prepare-models makes, and refuses to start without them; ``auto`` (the
        service's default) takes onnx when it can and torch otherwise, saying why in the log."""

        def build() -> SentenceTransformerEmbedder:
            from sentence_transformers import SentenceTransformer

            model = SentenceTransformer(name_or_path, device="cpu")
            if backend == "torch":
                return cls(model, batch_size)
            try:
                embedder = cls(model, batch_size, _onnx_transformer(model, name_or_path))
                embedder._check_onnx(name_or_path)
            except ConfigError as exc:
                if backend == "onnx":
                    raise
                # auto: any sentence-transformers model still runs, on torch
                log.info("embedder: torch, not onnx: %s", exc.message)
                return cls(model, batch_size)
            return embedder

        embedder = await anyio.to_thread.run_sync(build)
        log.info("embedder: loaded %s (%s)", name_or_path, embedder.backend)
        return embedder

    @property
    def backend(self) -> EmbedderBackend:
        """What runs the transformer: ``onnx`` or ``torch``."""
        return "onnx" if self._onnx is not None else "torch"

    def _check_onnx(self, name_or_path: str) -> None:
        # A stale or wrong export, or a model that does not pool by the mean, gives other
        # vectors than the ones already stored: refuse to start rather than search with them.
        with self._tokenizing:
            reference = self._torch_encode([_PROBE])
        cosine = float(self.encode_sync([_PROBE])[0] @ reference[0])
        if cosine < 0.9999:
            raise ConfigError(
                f"the ONNX export of {name_or_path} disagrees with the model (cosine {cosine:.5f}):"
                " delete its onnx/ folder and run `rag-stream prepare-models`, or set "
                "RAG_STREAM_EMBEDDER_BACKEND=torch"
            )

    def encode_sync(self, texts: Sequence[str]) -> Vectors:
        with self._tokenizing:
            if self._onnx is not None and len(texts) <= ONNX_MAX_TEXTS:
                return self._onnx_encode(self._onnx, list(texts))
            return self._torch_encode(texts)

    def _onnx_encode(self, onnx: OnnxTransformer, texts: list[str]) -> Vectors:
        batch = self._tokenizer(
            [t.strip() for t in texts],  # as sentence-transformers does
            padding=True,
            truncation=True,
            max_length=self.max_seq_length,
            return_tensors="np",
        )
        hidden = onnx(batch)
        mask = np.asarray(batch["attention_mask"], dtype=np.float32)[..., None]
        mean = (hidden * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1e-9)
        norms = np.linalg.norm(mean, axis=1, keepdims=True)
        return np.asarray(mean / np.maximum(norms, 1e-12), dtype=np.float32)

    def _torch_encode(self, texts: Sequence[str]) -> Vectors:
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


def _onnx_transformer(model: Any, name_or_path: str) -> OnnxTransformer:
    modules = [type(m).__name__ for m in model]
    pooling = getattr(model[1], "pooling_mode", None) if len(modules) > 1 else None
    if modules[:2] != ["Transformer", "Pooling"] or pooling != "mean":
        raise ConfigError(
            f"the onnx embedder backend runs mean-pooled models; {name_or_path} is "
            f"{modules} (pooling {pooling!r}): set RAG_STREAM_EMBEDDER_BACKEND=torch"
        )
    path = onnx_file(Path(name_or_path))
    if not path.exists():
        raise ConfigError(
            f"{path} is missing: run `rag-stream prepare-models` (it exports the default "
            "embedder) or set RAG_STREAM_EMBEDDER_BACKEND=torch"
        )
    return OnnxTransformer(path)
